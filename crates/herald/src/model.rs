//! The data herald stores and passes around: events, rules, leases and
//! notifications. Plain data, no I/O.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A point in time, in milliseconds since the Unix epoch.
///
/// Stores keep times as integers so that comparisons in SQL are cheap and the
/// decision function can be tested without a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Millis(pub i64);

impl Millis {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Millis(d.as_millis() as i64)
    }

    /// This time plus `d` (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Millis(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// This time minus `d` (saturating).
    pub fn minus(self, d: Duration) -> Self {
        Millis(
            self.0
                .saturating_sub(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }

    /// How long from `self` until `later`; zero if `later` is not after `self`.
    pub fn until(self, later: Millis) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }
}

/// An event's identity: a UUIDv7, so ids sort by creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventId(pub Uuid);

impl EventId {
    /// A new, time-ordered id.
    pub fn new() -> Self {
        EventId(Uuid::now_v7())
    }

    /// When the id was made, in Unix milliseconds (the UUIDv7's first 48
    /// bits); `None` for an id that is not a UUIDv7.
    pub fn created_ms(&self) -> Option<i64> {
        let (secs, nanos) = self.0.get_timestamp()?.to_unix();
        Some(secs as i64 * 1000 + i64::from(nanos / 1_000_000))
    }
}

impl Default for EventId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for EventId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(EventId)
    }
}

/// The proof that a worker holds an event's lease. Every write about a running
/// event names its token, so a worker that lost its lease can change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(pub Uuid);

impl LeaseToken {
    /// A new random token.
    pub fn new() -> Self {
        LeaseToken(Uuid::new_v4())
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

/// Where an event is in its life. A running event is `Pending` with a live
/// lease: the lease, not the state, says that someone runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Waiting to run, or running under a lease.
    Pending,
    /// Out of attempts (or failed for good); kept for inspection and manual retry.
    Dead,
    /// Finished, kept only when done-retention is configured.
    Done,
}

impl EventState {
    /// The stable name used in storage, APIs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Dead => "dead",
            EventState::Done => "done",
        }
    }

    /// Parses [`EventState::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(EventState::Pending),
            "dead" => Some(EventState::Dead),
            "done" => Some(EventState::Done),
            _ => None,
        }
    }

    /// The code stores keep in their `state` column (their SQL writes the
    /// same numbers as literals): 0 pending, 1 dead, 2 done.
    pub fn code(self) -> i16 {
        match self {
            EventState::Pending => 0,
            EventState::Dead => 1,
            EventState::Done => 2,
        }
    }

    /// The state of an [`EventState::code`].
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(EventState::Pending),
            1 => Some(EventState::Dead),
            2 => Some(EventState::Done),
            _ => None,
        }
    }
}

/// A lease as stored on an event: who holds it and until when (by the store's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holder's proof.
    pub token: LeaseToken,
    /// When it lapses unless renewed.
    pub expires_at: Millis,
}

/// A stored event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Primary key.
    pub id: EventId,
    /// Owner namespace.
    pub tenant: String,
    /// Name of the code that processes it.
    pub handler: String,
    /// The JSON payload, exactly as emitted.
    pub payload: String,
    /// Life-cycle state.
    pub state: EventState,
    /// Not to run before this time.
    pub run_at: Millis,
    /// How many times it has been claimed (snoozes and shutdown give one back).
    pub attempt: u32,
    /// After this many failed attempts it goes dead.
    pub max_attempts: u32,
    /// The current lease, live or expired, if any.
    pub lease: Option<Lease>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The optional idempotency key it was emitted with.
    pub idempotency_key: Option<String>,
    /// The topic it was emitted to, when it is one subscriber's copy of a
    /// topic emit ([`crate::Client::emit_topic`]); `None` for a direct emit.
    pub topic: Option<String>,
    /// The concurrency key it was emitted with: the limits of its handler
    /// per key count its runs under this key, within its tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The turn a rate limit gave it, when a claim found it over the rate:
    /// its `run_at` moved there, and the start at that turn is not charged
    /// again. Cleared when it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_turn: Option<Millis>,
    /// When it was emitted.
    pub created_at: Millis,
    /// When it last changed.
    pub updated_at: Millis,
}

/// One failed attempt, as recorded on the event: the error history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// When its failure was recorded, by the store's clock.
    pub at: Millis,
    /// What went wrong.
    pub error: String,
}

/// What an application emits: everything but the fields herald manages.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    /// The id to store it under (generated by `EventId::new`).
    pub id: EventId,
    /// Owner namespace.
    pub tenant: String,
    /// Handler name.
    pub handler: String,
    /// Validated JSON text.
    pub payload: String,
    /// Earliest run time, resolved by the store's clock.
    pub run_at: RunAt,
    /// Attempts before it goes dead.
    pub max_attempts: u32,
    /// One live event per `(tenant, handler, key)`.
    pub idempotency_key: Option<String>,
    /// The topic it is emitted to (one subscriber's copy), or `None` for a
    /// direct emit.
    pub topic: Option<String>,
    /// What the handler's limits per key count it under (within its
    /// tenant), or `None`.
    pub concurrency_key: Option<String>,
    /// One waiting event per `(tenant, handler, key)`: what to do with one
    /// that is already waiting.
    pub singleton: Option<Singleton>,
}

/// At most one waiting event (pending and not running) per `(tenant,
/// handler, key)`: an emit with a singleton key that finds one waiting
/// either keeps it and stores nothing ([`Keep::Oldest`]) or replaces it
/// ([`Keep::Newest`]: the waiting one is deleted, the new one stored), in
/// the store's write of the emit. A running event of the key does not
/// count: the new one waits beside it. With a delay, `Newest` debounces: a
/// burst of emits runs once, a delay after the last.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Singleton {
    /// The key, within the event's tenant and handler.
    pub key: String,
    /// Which of the waiting event and the new one stays.
    pub keep: Keep,
}

/// Which event a [`Singleton`] key keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The event already waiting; the emit returns it as
    /// [`Emitted::Existing`].
    Oldest,
    /// The new event; the waiting one is deleted.
    Newest,
}

impl Keep {
    /// The stable name used in APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Keep::Oldest => "oldest",
            Keep::Newest => "newest",
        }
    }

    /// Parses [`Keep::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "oldest" => Some(Keep::Oldest),
            "newest" => Some(Keep::Newest),
            _ => None,
        }
    }
}

/// When a new event is due, as the store resolves it with its own clock
/// when it stores the event: no process's wall clock but the store's
/// decides an event's timing (docs/semantics.md, "`delay`").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunAt {
    /// This long after the store's now: an emit's delay
    /// ([`Duration::ZERO`] for an immediate event).
    After(Duration),
    /// At this time by the store's clock: a schedule's occurrence, or an
    /// exact time a caller computed from the store's clock.
    At(Millis),
}

impl RunAt {
    /// Due as soon as it is stored.
    pub const NOW: RunAt = RunAt::After(Duration::ZERO);

    /// The time it names, resolved against the store's `now`.
    pub fn resolve(self, now: Millis) -> Millis {
        match self {
            RunAt::After(d) => now.plus(d),
            RunAt::At(at) => at,
        }
    }

    /// The delay to publish its notification with, read from no clock: the
    /// delay of [`RunAt::After`], and zero for [`RunAt::At`] (the worker
    /// that receives it early puts it back for the time left by the store's
    /// clock).
    pub fn publish_delay(self) -> Duration {
        match self {
            RunAt::After(d) => d,
            RunAt::At(_) => Duration::ZERO,
        }
    }
}

/// A handler's subscription to a topic: an emit to `topic` for a tenant
/// stores one event for `handler` when the subscription is that tenant's
/// or every tenant's (docs/semantics.md, "Fan-out").
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Subscription {
    /// The tenant it applies to; `None` for every tenant.
    pub tenant: Option<String>,
    /// The topic name ("user.signup").
    pub topic: String,
    /// The handler that gets a copy of each event emitted to the topic.
    pub handler: String,
}

impl Subscription {
    /// A subscription of `handler` to `topic` for every tenant.
    pub fn every_tenant(topic: impl Into<String>, handler: impl Into<String>) -> Self {
        Subscription {
            tenant: None,
            topic: topic.into(),
            handler: handler.into(),
        }
    }

    /// A subscription of `handler` to `topic` for `tenant` only.
    pub fn for_tenant(
        tenant: impl Into<String>,
        topic: impl Into<String>,
        handler: impl Into<String>,
    ) -> Self {
        Subscription {
            tenant: Some(tenant.into()),
            topic: topic.into(),
            handler: handler.into(),
        }
    }
}

/// The result of storing one [`NewEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emitted {
    /// Stored as a new event.
    Created(EventId),
    /// A live event with the same idempotency key exists; this is its id.
    Existing(EventId),
}

impl Emitted {
    /// The id of the event that will run, new or existing.
    pub fn id(self) -> EventId {
        match self {
            Emitted::Created(id) | Emitted::Existing(id) => id,
        }
    }
}

/// The two kinds of rule. Both stop execution; events stay stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// The tenant's own pause.
    Pause,
    /// An operator's block; stronger than pause: unpausing does not lift it.
    Block,
}

impl RuleKind {
    /// The stable name used in storage and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Pause => "pause",
            RuleKind::Block => "block",
        }
    }

    /// Parses [`RuleKind::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pause" => Some(RuleKind::Pause),
            "block" => Some(RuleKind::Block),
            _ => None,
        }
    }
}

/// A rule: `(tenant, handler, kind)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// The tenant it applies to.
    pub tenant: String,
    /// The handler it applies to.
    pub handler: String,
    /// Pause or block.
    pub kind: RuleKind,
}

/// Which rules match one event. Block wins over pause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleMatch {
    /// A `block` rule matches.
    pub blocked: bool,
    /// A `pause` rule matches.
    pub paused: bool,
}

impl RuleMatch {
    /// True when any rule holds the event.
    pub fn holds(self) -> bool {
        self.blocked || self.paused
    }
}

/// What travels on the queue: "these events of one tenant may be ready,
/// look at them". The store is the truth; a notification only points.
///
/// Wire form, compact JSON: `{"tenant": string, "event_ids": [uuid, …]}`,
/// or, for one event, `{"tenant": string, "event_id": uuid}`: the form
/// every herald before batched notifications reads and writes. A worker
/// reads both, so a fleet can be upgraded one process at a time; a
/// publisher writes the one-id form for one event, so an old worker still
/// reads every notification of one event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Notification {
    /// The events' tenant (for routing and logs; the id alone finds the event).
    pub tenant: String,
    /// The events to look at: at least one, each once.
    pub event_ids: Vec<EventId>,
}

/// Why a notification could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BadNotification {
    /// Not JSON of the right shape.
    #[error("notification is not valid JSON `{{\"tenant\": string, \"event_ids\": [uuid, …]}}` or `{{\"tenant\": string, \"event_id\": uuid}}`: {0}")]
    Json(#[from] serde_json::Error),
    /// Both forms' fields, or neither, or an empty list.
    #[error("notification names no event: it needs `event_ids` (a non-empty list) or `event_id`, not both")]
    NoEvents,
}

/// Both wire forms, read as one.
#[derive(Deserialize)]
struct Wire {
    tenant: String,
    event_id: Option<EventId>,
    event_ids: Option<Vec<EventId>>,
}

/// The one-id wire form, written for one event.
#[derive(Serialize)]
struct One<'a> {
    tenant: &'a str,
    event_id: EventId,
}

/// The list wire form.
#[derive(Serialize)]
struct Many<'a> {
    tenant: &'a str,
    event_ids: &'a [EventId],
}

impl Notification {
    /// A notification of one event.
    pub fn one(tenant: impl Into<String>, id: EventId) -> Self {
        Notification {
            tenant: tenant.into(),
            event_ids: vec![id],
        }
    }

    /// The wire form: compact JSON, the one-id form for one event.
    pub fn encode(&self) -> Vec<u8> {
        let bytes = match self.event_ids.as_slice() {
            [id] => serde_json::to_vec(&One {
                tenant: &self.tenant,
                event_id: *id,
            }),
            ids => serde_json::to_vec(&Many {
                tenant: &self.tenant,
                event_ids: ids,
            }),
        };
        bytes.expect("a notification always serializes")
    }

    /// The size of [`Notification::encode`]'s output for `ids` events of
    /// `tenant`, without encoding (for publishers that bound messages):
    /// exact for two ids or more, an upper bound for one.
    pub fn encoded_len(tenant: &str, ids: usize) -> usize {
        // {"tenant":"…","event_ids":["…",…]}: an id is 36 characters and two
        // quotes, plus a comma between ids.
        const FRAME: usize = r#"{"tenant":"","event_ids":[]}"#.len();
        FRAME + json_text_len(tenant) + ids * 39 - usize::from(ids > 0)
    }

    /// Reads either wire form; anything else is garbage. Repeated ids are
    /// kept once, in their first place.
    pub fn decode(bytes: &[u8]) -> Result<Self, BadNotification> {
        let wire: Wire = serde_json::from_slice(bytes)?;
        let mut event_ids = match (wire.event_id, wire.event_ids) {
            (Some(id), None) => vec![id],
            (None, Some(ids)) if !ids.is_empty() => ids,
            _ => return Err(BadNotification::NoEvents),
        };
        let mut seen = std::collections::HashSet::with_capacity(event_ids.len());
        event_ids.retain(|id| seen.insert(*id));
        Ok(Notification {
            tenant: wire.tenant,
            event_ids,
        })
    }
}

/// The length of `text` inside a JSON string as serde_json writes it:
/// tenant names may hold quotes and backslashes (only control characters
/// are refused at emit), which it escapes.
fn json_text_len(text: &str) -> usize {
    text.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

/// The default payload size limit: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;
/// The longest tenant, handler or idempotency key, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// The naming rule of tenants, handlers, topics and keys: which part of it
/// `value` breaks, if any.
pub(crate) fn name_rule_broken(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("it is empty")
    } else if value.len() > MAX_NAME_LEN {
        Some("it is longer than 200 bytes")
    } else if value.chars().any(char::is_control) {
        Some("it contains a control character")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_round_trips_and_rejects_garbage() {
        let one = Notification::one("acme", EventId::new());
        let many = Notification {
            tenant: "acme".into(),
            event_ids: vec![EventId::new(), EventId::new(), EventId::new()],
        };
        for n in [&one, &many] {
            assert_eq!(&Notification::decode(&n.encode()).unwrap(), n);
            assert!(n.encode().len() <= Notification::encoded_len("acme", n.event_ids.len()));
        }
        assert_eq!(many.encode().len(), Notification::encoded_len("acme", 3));
        assert!(Notification::decode(b"\xff\x00garbage").is_err());
        assert!(Notification::decode(br#"{"tenant":"a"}"#).is_err());
        assert!(Notification::decode(br#"{"tenant":"a","event_id":"nope"}"#).is_err());
        assert!(Notification::decode(br#"{"tenant":"a","event_ids":[]}"#).is_err());
        assert!(Notification::decode(br#"{"tenant":"a","event_ids":["nope"]}"#).is_err());
    }

    #[test]
    fn one_event_is_written_in_the_form_older_workers_read() {
        let id = EventId::new();
        let n = Notification::one("acme", id);
        assert_eq!(
            String::from_utf8(n.encode()).unwrap(),
            format!(r#"{{"tenant":"acme","event_id":"{id}"}}"#)
        );
    }

    #[test]
    fn both_forms_together_are_refused_and_repeated_ids_kept_once() {
        let (a, b) = (EventId::new(), EventId::new());
        let both = format!(r#"{{"tenant":"t","event_id":"{a}","event_ids":["{b}"]}}"#);
        assert!(matches!(
            Notification::decode(both.as_bytes()),
            Err(BadNotification::NoEvents)
        ));
        let repeated = format!(r#"{{"tenant":"t","event_ids":["{a}","{b}","{a}"]}}"#);
        assert_eq!(
            Notification::decode(repeated.as_bytes()).unwrap().event_ids,
            vec![a, b]
        );
    }

    #[test]
    fn millis_arithmetic_saturates() {
        assert_eq!(Millis(10).until(Millis(5)), Duration::ZERO);
        assert_eq!(Millis(5).until(Millis(10)), Duration::from_millis(5));
        assert_eq!(
            Millis(i64::MAX).plus(Duration::from_secs(1)),
            Millis(i64::MAX)
        );
    }
}
