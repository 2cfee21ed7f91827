//! Schedules: events emitted on a cadence. Plain data and pure functions,
//! no I/O: the elected scheduler (`worker/schedule.rs`) is the shell.
//!
//! A [`Schedule`] is `(tenant, name)`, a handler, a [`Cadence`] (a cron
//! expression read in a time zone, or a fixed interval), a payload and
//! options, and a cursor: [`Schedule::next_at`], the next occurrence not yet
//! emitted. [`fire`] says, for the store's `now`, which occurrences to emit
//! and where the cursor goes; [`crate::backend::Schedules::fire_schedule`] moves the
//! cursor from the value it was read at (compare-and-set) and inserts the
//! occurrences' events in one transaction, so that each occurrence is
//! emitted once whoever leads. docs/schedules.md gives the argument.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone};
pub use chrono_tz::Tz;
use serde_json::value::RawValue;

use crate::model::{name_rule_broken, EventId, Millis, NewEvent, RunAt, DEFAULT_MAX_PAYLOAD};
use crate::retry::DEFAULT_MAX_ATTEMPTS;

/// The longest schedule name, in bytes: its events' idempotency key
/// (`schedule:{name}:{occurrence}`) must fit the 200 bytes of a key.
pub const MAX_SCHEDULE_NAME_LEN: usize = 100;
/// The shortest interval of an `every` cadence.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// The most occurrences one [`fire`] returns; the cursor stops after them
/// and the next tick goes on. Also the largest `missed_cap`.
pub const MAX_OCCURRENCES_PER_FIRE: usize = 1000;
/// The default of [`crate::WorkerConfig::schedule_grace`]: an occurrence
/// emitted up to this late counts as on time.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// The cursor of a schedule that has no occurrence left (a cron expression
/// that never matches again).
pub const NEVER: Millis = Millis(i64::MAX);

/// A schedule that cannot be stored: the field at fault and why.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// A field's value is not acceptable.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field: `name`, `every`, `timezone`, …
        field: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// The cron expression does not parse.
    #[error("cron: {expr:?} is not a cron expression: {source}")]
    Cron {
        /// The expression given.
        expr: String,
        /// croner's reason.
        #[source]
        source: croner::errors::CronError,
    },
}

impl ScheduleError {
    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        ScheduleError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::Invalid { field, .. } => field,
            ScheduleError::Cron { .. } => "cron",
        }
    }
}

/// A parsed cron expression, with its text (compared by text).
#[derive(Clone, Debug)]
pub struct CronExpr {
    text: String,
    // Boxed: a parsed pattern is large beside an interval.
    cron: Box<croner::Cron>,
}

impl PartialEq for CronExpr {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CronExpr {}

impl CronExpr {
    /// Parses five fields (minute to weekday) or six (seconds first), or an
    /// alias (`@hourly`), with croner.
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        let text = text.trim();
        let cron = croner::Cron::from_str(text).map_err(|source| ScheduleError::Cron {
            expr: text.to_string(),
            source,
        })?;
        Ok(CronExpr {
            text: text.to_string(),
            cron: Box::new(cron),
        })
    }

    /// The expression as given (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// When a schedule's occurrences are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cadence {
    /// The instants whose wall-clock time in the schedule's zone matches
    /// the expression (croner's rules at daylight-saving changes; see
    /// docs/schedules.md).
    Cron(CronExpr),
    /// Every multiple of the interval since the Unix epoch (UTC): `every =
    /// "30s"` fires at :00 and :30 of each minute, whatever the zone.
    Every(Duration),
}

fn to_zoned(tz: Tz, t: Millis) -> Option<DateTime<Tz>> {
    tz.timestamp_millis_opt(t.0).single()
}

impl Cadence {
    /// The stored columns: `(cron, every_ms)`, one of them set.
    pub fn columns(&self) -> (Option<&str>, Option<i64>) {
        match self {
            Cadence::Cron(c) => (Some(c.as_str()), None),
            Cadence::Every(d) => (None, Some(d.as_millis() as i64)),
        }
    }

    /// Reads [`Cadence::columns`] back.
    pub fn from_columns(cron: Option<&str>, every_ms: Option<i64>) -> Result<Self, ScheduleError> {
        match (cron, every_ms) {
            (Some(c), None) => Ok(Cadence::Cron(CronExpr::parse(c)?)),
            (None, Some(ms)) if ms >= MIN_EVERY.as_millis() as i64 => {
                Ok(Cadence::Every(Duration::from_millis(ms as u64)))
            }
            (None, Some(ms)) => Err(ScheduleError::invalid(
                "every",
                format!("{ms} ms is shorter than {MIN_EVERY:?}"),
            )),
            _ => Err(ScheduleError::invalid(
                "cron",
                "a schedule needs exactly one of `cron` and `every`",
            )),
        }
    }

    /// The first occurrence at `t` or after (`inclusive`), or strictly
    /// after; `None` when there is none.
    pub fn next_from(&self, tz: Tz, t: Millis, inclusive: bool) -> Option<Millis> {
        match self {
            Cadence::Every(d) => {
                let step = d.as_millis() as i64;
                let k = if inclusive {
                    t.0.div_euclid(step) + i64::from(t.0.rem_euclid(step) != 0)
                } else {
                    t.0.div_euclid(step) + 1
                };
                k.checked_mul(step).map(Millis)
            }
            Cadence::Cron(c) => {
                // Inclusive is exclusive from a millisecond before: croner
                // finds an instant that a daylight-saving gap moved (02:30
                // that does not exist, run at 03:00) only when it walks
                // through the gap, not when it starts on it.
                let from = if inclusive { Millis(t.0 - 1) } else { t };
                let at = to_zoned(tz, from)?;
                // croner works in whole seconds: a start inside a second
                // may find that second, so step past it.
                let found = c.cron.find_next_occurrence(&at, false).ok()?;
                let mut ms = Millis(found.timestamp() * 1000);
                if ms <= from {
                    let again = c.cron.find_next_occurrence(&found, false).ok()?;
                    ms = Millis(again.timestamp() * 1000);
                }
                Some(ms)
            }
        }
    }

    /// The last occurrence before `t` (strictly), or `None`.
    pub fn prev_before(&self, tz: Tz, t: Millis) -> Option<Millis> {
        match self {
            Cadence::Every(d) => {
                let step = d.as_millis() as i64;
                let k = t.0.div_euclid(step) - i64::from(t.0.rem_euclid(step) == 0);
                k.checked_mul(step).map(Millis)
            }
            Cadence::Cron(c) => {
                let at = to_zoned(tz, t)?;
                let found = c.cron.find_previous_occurrence(&at, true).ok()?;
                let ms = Millis(found.timestamp() * 1000);
                if ms < t {
                    return Some(ms);
                }
                let again = c.cron.find_previous_occurrence(&found, false).ok()?;
                Some(Millis(again.timestamp() * 1000))
            }
        }
    }
}

/// What happens to occurrences that were missed (herald was down, or every
/// worker was busy elsewhere): those older than the grace period when the
/// leader gets to them. Occurrences within the grace period are all
/// emitted, late.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Missed {
    /// Emit none of them.
    Skip,
    /// Emit the latest one only (the default).
    #[default]
    Once,
    /// Emit the most recent `cap` of them, oldest first.
    Each {
        /// At most this many, 1 to [`MAX_OCCURRENCES_PER_FIRE`].
        cap: u32,
    },
}

impl Missed {
    /// The stored columns: `("skip" | "once" | "each", cap)`.
    pub fn columns(self) -> (&'static str, Option<i64>) {
        match self {
            Missed::Skip => ("skip", None),
            Missed::Once => ("once", None),
            Missed::Each { cap } => ("each", Some(i64::from(cap))),
        }
    }

    /// Reads [`Missed::columns`] back (or a configuration's `missed` and
    /// `missed_cap`).
    pub fn from_columns(policy: &str, cap: Option<i64>) -> Result<Self, ScheduleError> {
        match (policy, cap) {
            ("skip", None) => Ok(Missed::Skip),
            ("once", None) => Ok(Missed::Once),
            ("each", Some(cap)) if (1..=MAX_OCCURRENCES_PER_FIRE as i64).contains(&cap) => {
                Ok(Missed::Each { cap: cap as u32 })
            }
            ("each", Some(cap)) => Err(ScheduleError::invalid(
                "missed_cap",
                format!("{cap} is not from 1 to {MAX_OCCURRENCES_PER_FIRE}"),
            )),
            ("each", None) => Err(ScheduleError::invalid(
                "missed_cap",
                "`missed = \"each\"` needs `missed_cap`, the most missed occurrences to emit",
            )),
            ("skip" | "once", Some(_)) => Err(ScheduleError::invalid(
                "missed_cap",
                format!("only `missed = \"each\"` takes a cap, not {policy:?}"),
            )),
            (other, _) => Err(ScheduleError::invalid(
                "missed",
                format!("{other:?} is not one of \"skip\", \"once\", \"each\""),
            )),
        }
    }
}

/// Where a schedule was defined: the configuration file's are replaced on
/// every reload, the API's are left alone by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleSource {
    /// `[[schedules]]` in herald.toml.
    Config,
    /// The HTTP API or the CLI.
    Api,
}

impl ScheduleSource {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleSource::Config => "config",
            ScheduleSource::Api => "api",
        }
    }

    /// Reads [`ScheduleSource::as_str`] back.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "config" => Some(ScheduleSource::Config),
            "api" => Some(ScheduleSource::Api),
            _ => None,
        }
    }
}

/// The last occurrence a schedule emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastFired {
    /// The occurrence time.
    pub occurrence: Millis,
    /// Its event (the existing one, if its idempotency key found one).
    pub event_id: EventId,
}

/// A stored schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Owner namespace of the schedule and of its events.
    pub tenant: String,
    /// Unique per tenant.
    pub name: String,
    /// The events' handler.
    pub handler: String,
    /// When the occurrences are.
    pub cadence: Cadence,
    /// The zone a cron expression is read in (and times are shown in).
    pub timezone: Tz,
    /// The events' payload, JSON text.
    pub payload: String,
    /// The events' attempts before they go dead.
    pub max_attempts: u32,
    /// What happens to missed occurrences.
    pub missed: Missed,
    /// A paused schedule emits nothing; its cursor stays, so resuming
    /// treats what passed meanwhile as missed.
    pub paused: bool,
    /// Where it was defined.
    pub source: ScheduleSource,
    /// The cursor: the next occurrence not yet emitted ([`NEVER`] when there
    /// is none).
    pub next_at: Millis,
    /// The last occurrence emitted, and its event.
    pub last: Option<LastFired>,
}

impl Schedule {
    /// The event of the occurrence at `at`: due then, with the idempotency
    /// key `schedule:{name}:{at in ms}`.
    pub fn occurrence_event(&self, at: Millis) -> NewEvent {
        NewEvent {
            singleton: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: self.tenant.clone(),
            handler: self.handler.clone(),
            payload: self.payload.clone(),
            run_at: RunAt::At(at),
            max_attempts: self.max_attempts,
            idempotency_key: Some(occurrence_key(&self.name, at)),
            topic: None,
        }
    }

    /// `t` in the schedule's zone, RFC 3339 (`None` for [`NEVER`]).
    pub fn local_time(&self, t: Millis) -> Option<String> {
        if t == NEVER {
            return None;
        }
        to_zoned(self.timezone, t).map(|d| d.to_rfc3339())
    }

    /// Whether `other` has the same occurrences (cadence and zone): a
    /// changed definition that keeps them keeps the cursor.
    pub fn same_occurrences(&self, other: &Schedule) -> bool {
        self.cadence == other.cadence && self.timezone == other.timezone
    }
}

/// A schedule's stored columns, as both backends write and read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleRow {
    /// Tenant.
    pub tenant: String,
    /// Name.
    pub name: String,
    /// Handler.
    pub handler: String,
    /// The cron expression, or NULL.
    pub cron: Option<String>,
    /// The interval in ms, or NULL.
    pub every_ms: Option<i64>,
    /// The IANA zone name.
    pub timezone: String,
    /// JSON text.
    pub payload: String,
    /// Attempts.
    pub max_attempts: i64,
    /// `skip`, `once` or `each`.
    pub missed: String,
    /// The cap of `each`.
    pub missed_cap: Option<i64>,
    /// Paused.
    pub paused: bool,
    /// `config` or `api`.
    pub source: String,
    /// The cursor.
    pub next_at: i64,
    /// The last occurrence emitted.
    pub last_occurrence: Option<i64>,
    /// Its event.
    pub last_event_id: Option<EventId>,
}

impl ScheduleRow {
    /// The columns of `s`.
    pub fn of(s: &Schedule) -> Self {
        let (cron, every_ms) = s.cadence.columns();
        let (missed, missed_cap) = s.missed.columns();
        ScheduleRow {
            tenant: s.tenant.clone(),
            name: s.name.clone(),
            handler: s.handler.clone(),
            cron: cron.map(str::to_string),
            every_ms,
            timezone: s.timezone.name().to_string(),
            payload: s.payload.clone(),
            max_attempts: i64::from(s.max_attempts),
            missed: missed.to_string(),
            missed_cap,
            paused: s.paused,
            source: s.source.as_str().to_string(),
            next_at: s.next_at.0,
            last_occurrence: s.last.map(|l| l.occurrence.0),
            last_event_id: s.last.map(|l| l.event_id),
        }
    }

    /// The schedule these columns hold.
    pub fn into_schedule(self) -> Result<Schedule, ScheduleError> {
        let timezone = self.timezone.parse::<Tz>().map_err(|_| {
            ScheduleError::invalid("timezone", format!("{:?} is not a zone", self.timezone))
        })?;
        let source = ScheduleSource::parse(&self.source).ok_or_else(|| {
            ScheduleError::invalid("source", format!("{:?} is not a source", self.source))
        })?;
        let max_attempts = u32::try_from(self.max_attempts)
            .map_err(|_| ScheduleError::invalid("max_attempts", "out of range"))?;
        let last = match (self.last_occurrence, self.last_event_id) {
            (Some(at), Some(id)) => Some(LastFired {
                occurrence: Millis(at),
                event_id: id,
            }),
            _ => None,
        };
        Ok(Schedule {
            cadence: Cadence::from_columns(self.cron.as_deref(), self.every_ms)?,
            missed: Missed::from_columns(&self.missed, self.missed_cap)?,
            tenant: self.tenant,
            name: self.name,
            handler: self.handler,
            timezone,
            payload: self.payload,
            max_attempts,
            paused: self.paused,
            source,
            next_at: Millis(self.next_at),
            last,
        })
    }
}

/// The idempotency key of an occurrence's event.
pub fn occurrence_key(name: &str, at: Millis) -> String {
    format!("schedule:{name}:{}", at.0)
}

/// A schedule as defined (herald.toml, the API): what it is, not where its
/// cursor is. [`ScheduleDef::build`] checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleDef {
    /// Tenant.
    pub tenant: String,
    /// Name, unique per tenant.
    pub name: String,
    /// Handler.
    pub handler: String,
    /// A cron expression; exactly one of `cron` and `every`.
    pub cron: Option<String>,
    /// An interval.
    pub every: Option<Duration>,
    /// An IANA zone name; `None` is UTC.
    pub timezone: Option<String>,
    /// JSON text; `None` is `null`.
    pub payload: Option<String>,
    /// `None`: [`DEFAULT_MAX_ATTEMPTS`].
    pub max_attempts: Option<u32>,
    /// `skip`, `once` (`None`: the default) or `each`.
    pub missed: Option<String>,
    /// The cap of `each`.
    pub missed_cap: Option<i64>,
    /// Where it comes from.
    pub source: ScheduleSource,
}

impl ScheduleDef {
    /// A definition with every option left out.
    pub fn new(
        tenant: impl Into<String>,
        name: impl Into<String>,
        handler: impl Into<String>,
        source: ScheduleSource,
    ) -> Self {
        ScheduleDef {
            tenant: tenant.into(),
            name: name.into(),
            handler: handler.into(),
            cron: None,
            every: None,
            timezone: None,
            payload: None,
            max_attempts: None,
            missed: None,
            missed_cap: None,
            source,
        }
    }

    /// Checks the definition and places its cursor at the first occurrence
    /// after `now`. Payloads over `max_payload` bytes are refused.
    pub fn build(&self, now: Millis, max_payload: usize) -> Result<Schedule, ScheduleError> {
        for (field, value) in [
            ("tenant", &self.tenant),
            ("handler", &self.handler),
            ("name", &self.name),
        ] {
            if let Some(reason) = name_rule_broken(value) {
                return Err(ScheduleError::invalid(field, reason));
            }
        }
        if self.name.len() > MAX_SCHEDULE_NAME_LEN {
            return Err(ScheduleError::invalid(
                "name",
                format!("it is longer than {MAX_SCHEDULE_NAME_LEN} bytes"),
            ));
        }
        let cadence = match (&self.cron, self.every) {
            (Some(c), None) => Cadence::Cron(CronExpr::parse(c)?),
            (None, Some(d)) if d < MIN_EVERY => {
                return Err(ScheduleError::invalid(
                    "every",
                    format!("{d:?} is shorter than {MIN_EVERY:?}"),
                ))
            }
            (None, Some(d)) if d.subsec_nanos() % 1_000_000 != 0 => {
                return Err(ScheduleError::invalid(
                    "every",
                    format!("{d:?} is not a whole number of milliseconds"),
                ))
            }
            (None, Some(d)) => Cadence::Every(d),
            (Some(_), Some(_)) => {
                return Err(ScheduleError::invalid(
                    "every",
                    "give `cron` or `every`, not both",
                ))
            }
            (None, None) => {
                return Err(ScheduleError::invalid(
                    "cron",
                    "a schedule needs `cron` (an expression) or `every` (an interval)",
                ))
            }
        };
        let timezone = match &self.timezone {
            None => Tz::UTC,
            Some(z) => z.parse::<Tz>().map_err(|_| {
                ScheduleError::invalid(
                    "timezone",
                    format!(
                        "{z:?} is not an IANA time zone name (like \"Europe/Paris\" or \"UTC\")"
                    ),
                )
            })?,
        };
        let payload = self.payload.clone().unwrap_or_else(|| "null".to_string());
        let limit = if max_payload == 0 {
            DEFAULT_MAX_PAYLOAD
        } else {
            max_payload
        };
        if payload.len() > limit {
            return Err(ScheduleError::invalid(
                "payload",
                format!(
                    "it is {} bytes, over the limit of {limit} bytes",
                    payload.len()
                ),
            ));
        }
        serde_json::from_str::<&RawValue>(&payload)
            .map_err(|e| ScheduleError::invalid("payload", format!("it is not JSON: {e}")))?;
        let max_attempts = self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(ScheduleError::invalid(
                "max_attempts",
                "it must be at least 1",
            ));
        }
        let missed =
            Missed::from_columns(self.missed.as_deref().unwrap_or("once"), self.missed_cap)?;
        let next_at = cadence.next_from(timezone, now, false).unwrap_or(NEVER);
        Ok(Schedule {
            tenant: self.tenant.clone(),
            name: self.name.clone(),
            handler: self.handler.clone(),
            cadence,
            timezone,
            payload,
            max_attempts,
            missed,
            paused: false,
            source: self.source,
            next_at,
            last: None,
        })
    }
}

/// What the leader does with a due schedule: [`fire`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firing {
    /// The occurrences to emit, oldest first.
    pub occurrences: Vec<Millis>,
    /// Whether missed occurrences (older than the grace period) were
    /// passed over by the policy.
    pub dropped_missed: bool,
    /// The new cursor: the first occurrence after `now` (or, when
    /// [`MAX_OCCURRENCES_PER_FIRE`] stopped the list, the first not in it).
    pub next_at: Millis,
}

/// The occurrences of `schedule` to emit at `now` (the store's clock), from
/// its cursor: those within `grace` of `now` all, those older (missed) as
/// its [`Missed`] policy says; and the cursor after them. Nothing when the
/// cursor is after `now`.
pub fn fire(schedule: &Schedule, now: Millis, grace: Duration) -> Firing {
    let (cadence, tz, cursor) = (&schedule.cadence, schedule.timezone, schedule.next_at);
    let mut firing = Firing {
        occurrences: Vec::new(),
        dropped_missed: false,
        next_at: cursor,
    };
    if cursor > now {
        return firing;
    }
    let cutoff = now.minus(grace);
    if cursor < cutoff {
        // Missed: the occurrences in [cursor, cutoff).
        let take = match schedule.missed {
            Missed::Skip => 0,
            Missed::Once => 1,
            Missed::Each { cap } => (cap as usize).min(MAX_OCCURRENCES_PER_FIRE),
        };
        let mut missed = Vec::new();
        let mut before = cutoff;
        while missed.len() < take {
            match cadence.prev_before(tz, before) {
                Some(t) if t >= cursor => {
                    missed.push(t);
                    before = t;
                }
                _ => break,
            }
        }
        // Were there more than taken?
        firing.dropped_missed = match cadence.prev_before(tz, before) {
            Some(t) => t >= cursor,
            None => false,
        };
        missed.reverse();
        firing.occurrences = missed;
    }
    let start = cursor.max(cutoff);
    let mut next = cadence.next_from(tz, start, true);
    while let Some(t) = next {
        if t > now || firing.occurrences.len() >= MAX_OCCURRENCES_PER_FIRE {
            break;
        }
        firing.occurrences.push(t);
        next = cadence.next_from(tz, t, false);
    }
    firing.next_at = next.unwrap_or(NEVER);
    firing
}

/// Due schedules, as [`crate::backend::Schedules::due_schedules`] read them.
#[derive(Clone, Debug, PartialEq)]
pub struct DueSchedules {
    /// The store's clock when they were read: the `now` of [`fire`].
    pub now: Millis,
    /// Unpaused schedules whose cursor is at or before `now`, earliest first.
    pub schedules: Vec<Schedule>,
}

/// One [`crate::backend::Schedules::fire_schedule`] call: move the cursor of `(tenant,
/// name)` from `expected_next_at` to `next_at` and insert `events`, or do
/// nothing if the cursor is elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleFiring {
    /// The schedule's tenant.
    pub tenant: String,
    /// The schedule's name.
    pub name: String,
    /// The cursor as read: the compare of the compare-and-set.
    pub expected_next_at: Millis,
    /// The new cursor.
    pub next_at: Millis,
    /// The occurrences' events, oldest first ([`Schedule::occurrence_event`]).
    pub events: Vec<NewEvent>,
}

impl ScheduleFiring {
    /// The time of the last occurrence: its event's [`RunAt::At`], which
    /// the store records as the schedule's last.
    pub fn last_occurrence(&self) -> Option<Millis> {
        match self.events.last()?.run_at {
            RunAt::At(at) => Some(at),
            RunAt::After(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
