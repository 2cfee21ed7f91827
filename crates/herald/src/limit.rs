//! Limits on a handler's runs, across every worker (ADR 0017): at most N
//! runs at once, and at most R starts per period, of a handler, of a
//! tenant's events of it, or of one concurrency key's.
//!
//! A limit is a row in the store. A run that a concurrency limit counts
//! holds a slot there, kept by the run's lease: the claim takes it in the
//! statement that takes the lease, a settle gives it back, and a lease
//! that lapses (a killed worker) lapses the slot with it. An event whose
//! limit is full when it is claimed waits in the store without a
//! notification, and the settle that frees a slot wakes the
//! longest-waiting one. A rate limit is a GCRA kept in the store and
//! advanced by the claim: an event over it is given its turn (its `run_at`
//! moves there, the turn booked for it) and starts then.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one limit counts: the runs of which events.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "per", rename_all = "snake_case")]
pub enum LimitScope {
    /// Every run of the handler, of every tenant.
    Handler,
    /// The runs of each tenant's events of the handler: `tenant` names one
    /// tenant's limit, `None` the default of every tenant without one.
    Tenant {
        /// The tenant, or `None` for every tenant.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
    },
    /// The runs of each concurrency key's events of the handler (the key an
    /// emit names, [`crate::EmitOptions::concurrency_key`], within its
    /// tenant): `key` names one key's limit (with its tenant), `None` the
    /// default of every key without one. Events without a key are not
    /// counted.
    Key {
        /// The tenant and the key, or `None` for every key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<TenantKey>,
    },
}

/// One tenant's concurrency key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantKey {
    /// The tenant.
    pub tenant: String,
    /// The key its events were emitted with.
    pub key: String,
}

impl LimitScope {
    /// The scope's kind as stored: `handler`, `tenant` or `key`.
    pub fn kind(&self) -> LimitKind {
        match self {
            LimitScope::Handler => LimitKind::Handler,
            LimitScope::Tenant { .. } => LimitKind::Tenant,
            LimitScope::Key { .. } => LimitKind::Key,
        }
    }

    /// The tenant and the key the scope names as stored, `""` for none
    /// (tenant names and keys are never empty).
    pub fn names(&self) -> (&str, &str) {
        match self {
            LimitScope::Handler | LimitScope::Tenant { tenant: None } => ("", ""),
            LimitScope::Key { key: None } => ("", ""),
            LimitScope::Tenant { tenant: Some(t) } => (t, ""),
            LimitScope::Key { key: Some(k) } => (&k.tenant, &k.key),
        }
    }

    /// The scope stored as `kind`, `tenant` and `key` (`""` for none).
    pub fn from_names(kind: LimitKind, tenant: &str, key: &str) -> Self {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        match kind {
            LimitKind::Handler => LimitScope::Handler,
            LimitKind::Tenant => LimitScope::Tenant {
                tenant: some(tenant),
            },
            LimitKind::Key => LimitScope::Key {
                key: some(key).map(|key| TenantKey {
                    tenant: tenant.to_string(),
                    key,
                }),
            },
        }
    }
}

/// The three kinds of limit, by what they count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Every run of the handler.
    Handler,
    /// Each tenant's runs of the handler.
    Tenant,
    /// Each concurrency key's runs of the handler.
    Key,
}

impl LimitKind {
    /// The stable name used in storage and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Handler => "handler",
            LimitKind::Tenant => "tenant",
            LimitKind::Key => "key",
        }
    }

    /// The code stored in a `smallint` column.
    pub fn code(self) -> i16 {
        match self {
            LimitKind::Handler => 0,
            LimitKind::Tenant => 1,
            LimitKind::Key => 2,
        }
    }

    /// Reads [`LimitKind::code`].
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(LimitKind::Handler),
            1 => Some(LimitKind::Tenant),
            2 => Some(LimitKind::Key),
            _ => None,
        }
    }

    /// Parses [`LimitKind::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "handler" => Some(LimitKind::Handler),
            "tenant" => Some(LimitKind::Tenant),
            "key" => Some(LimitKind::Key),
            _ => None,
        }
    }
}

/// Where a limit was declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    /// `[handlers.NAME.limit]` of herald.toml: replaced as a whole when the
    /// file is loaded.
    Config,
    /// The API, the CLI or [`crate::Client::set_limit`]: kept until removed.
    Api,
}

impl LimitSource {
    /// The stable name used in storage and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Config => "config",
            LimitSource::Api => "api",
        }
    }

    /// Parses [`LimitSource::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "config" => Some(LimitSource::Config),
            "api" => Some(LimitSource::Api),
            _ => None,
        }
    }
}

/// The limits of `handler`'s events that `scope` counts together: at most
/// `running` runs at once, and at most `rate`'s starts per period; one or
/// both.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Limit {
    /// The handler whose runs it counts.
    pub handler: String,
    /// Which of them count together.
    #[serde(flatten)]
    pub scope: LimitScope,
    /// Most runs at once, at least 1 (pause the handler to run none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<u32>,
    /// Most starts per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

/// At most `starts` starts per `period`, evenly spaced (one every
/// `period / starts`), with up to `burst` of them at once after a quiet
/// spell: a GCRA (the generic cell rate algorithm) whose theoretical
/// arrival time the store keeps and the claim advances. In any window of
/// one period, at most `starts + burst` runs start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rate {
    /// Starts per period, at least 1.
    pub starts: u32,
    /// The period, at least 1 ms, at most a day.
    #[serde(with = "duration_ms")]
    pub period: Duration,
    /// Starts allowed at once after a quiet spell, at least 1 (1: none
    /// closer than `period / starts`).
    pub burst: u32,
}

impl Rate {
    /// The spacing of starts, in microseconds (at least 1).
    pub fn interval_us(&self) -> i64 {
        ((self.period.as_micros() / u128::from(self.starts.max(1))) as i64).max(1)
    }
}

mod duration_ms {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms: u64 = serde::Deserialize::deserialize(d)?;
        Ok(Duration::from_millis(ms))
    }
}

/// The longest rate period.
pub const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);

impl Limit {
    /// A concurrency limit alone.
    pub fn running(handler: impl Into<String>, scope: LimitScope, running: u32) -> Self {
        Limit {
            handler: handler.into(),
            scope,
            running: Some(running),
            rate: None,
        }
    }

    /// A rate limit alone.
    pub fn rate(handler: impl Into<String>, scope: LimitScope, rate: Rate) -> Self {
        Limit {
            handler: handler.into(),
            scope,
            running: None,
            rate: Some(rate),
        }
    }

    /// Checks the limit's names and numbers: what a store refuses as invalid.
    pub fn check(&self) -> Result<(), String> {
        match (self.running, self.rate) {
            (None, None) => return Err("a limit sets running, rate or both".into()),
            (Some(0), _) => {
                return Err("a limit of 0 runs nothing: pause the handler instead".into())
            }
            (Some(n), _) if n > MAX_RUNNING => {
                return Err(format!("a limit is at most {MAX_RUNNING} runs at once"))
            }
            _ => {}
        }
        if let Some(r) = self.rate {
            if r.starts == 0 || r.burst == 0 {
                return Err(
                    "a rate starts at least 1 per period, with a burst of at least 1".into(),
                );
            }
            if r.starts > MAX_RUNNING || r.burst > MAX_RUNNING {
                return Err(format!(
                    "a rate's starts and burst are at most {MAX_RUNNING}"
                ));
            }
            if r.period < Duration::from_millis(1) || r.period > MAX_PERIOD {
                return Err("a rate's period is 1 ms to 24 h".into());
            }
        }
        if self.handler.is_empty() {
            return Err("a limit names its handler".into());
        }
        let (tenant, key) = self.scope.names();
        if matches!(self.scope, LimitScope::Key { key: Some(_) })
            && (tenant.is_empty() || key.is_empty())
        {
            return Err("a key's limit names its tenant and a non-empty key".into());
        }
        Ok(())
    }
}

/// The largest limit: far above any fleet's slots, and small enough that
/// a count of a scope's slots stays cheap.
pub const MAX_RUNNING: u32 = 100_000;

/// A limit as stored, with where it was declared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLimit {
    /// The limit.
    #[serde(flatten)]
    pub limit: Limit,
    /// Config or API.
    pub source: LimitSource,
}

/// Why a pending event is not running: a full limit holds it. Told by
/// [`crate::backend::EventStore::inspect`] and an event's detail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWait {
    /// The handler of the limit.
    pub handler: String,
    /// The limit's scope that is full, with the tenant and key it counts
    /// for this event.
    #[serde(flatten)]
    pub scope: LimitScope,
    /// Runs of the scope holding a slot now.
    pub running: u32,
    /// The limit.
    pub limit: u32,
}

impl std::fmt::Display for LimitWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tenant, key) = self.scope.names();
        let n = format!("{} of {} running", self.running, self.limit);
        match self.scope.kind() {
            LimitKind::Handler => write!(f, "{n} for handler {:?}", self.handler),
            LimitKind::Tenant => {
                write!(f, "{n} for tenant {tenant:?} of handler {:?}", self.handler)
            }
            LimitKind::Key => write!(f, "{n} for key {key:?} of handler {:?}", self.handler),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_round_trips_through_its_stored_names() {
        for scope in [
            LimitScope::Handler,
            LimitScope::Tenant { tenant: None },
            LimitScope::Tenant {
                tenant: Some("acme".into()),
            },
            LimitScope::Key { key: None },
            LimitScope::Key {
                key: Some(TenantKey {
                    tenant: "acme".into(),
                    key: "account-7".into(),
                }),
            },
        ] {
            let (t, k) = scope.names();
            assert_eq!(LimitScope::from_names(scope.kind(), t, k), scope);
            let kind = scope.kind();
            assert_eq!(LimitKind::from_code(kind.code().into()), Some(kind));
            assert_eq!(LimitKind::parse(kind.as_str()), Some(kind));
        }
    }

    #[test]
    fn a_limit_of_nothing_or_without_names_is_refused() {
        let limit = |running, scope| Limit::running("h", scope, running);
        assert!(limit(1, LimitScope::Handler).check().is_ok());
        assert!(limit(0, LimitScope::Handler).check().is_err());
        assert!(limit(MAX_RUNNING + 1, LimitScope::Handler).check().is_err());
        let empty_key = LimitScope::Key {
            key: Some(TenantKey {
                tenant: "acme".into(),
                key: String::new(),
            }),
        };
        assert!(limit(1, empty_key).check().is_err());
        let rate = |starts, period_ms, burst| Rate {
            starts,
            period: Duration::from_millis(period_ms),
            burst,
        };
        let ok = Limit::rate("h", LimitScope::Handler, rate(10, 1000, 1));
        assert!(ok.check().is_ok());
        assert_eq!(rate(10, 1000, 1).interval_us(), 100_000);
        assert_eq!(rate(3, 1000, 1).interval_us(), 333_333);
        for bad in [
            rate(0, 1000, 1),
            rate(1, 0, 1),
            rate(1, 1000, 0),
            rate(1, 90_000_000, 1),
        ] {
            assert!(
                Limit::rate("h", LimitScope::Handler, bad).check().is_err(),
                "{bad:?}"
            );
        }
        let neither = Limit {
            running: None,
            rate: None,
            ..ok
        };
        assert!(neither.check().is_err());
    }

    #[test]
    fn a_wait_says_what_is_full() {
        let wait = LimitWait {
            handler: "sync".into(),
            scope: LimitScope::Key {
                key: Some(TenantKey {
                    tenant: "acme".into(),
                    key: "acme-1".into(),
                }),
            },
            running: 5,
            limit: 5,
        };
        assert_eq!(
            wait.to_string(),
            r#"5 of 5 running for key "acme-1" of handler "sync""#
        );
    }
}
