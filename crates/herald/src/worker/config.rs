//! How a worker behaves: [`WorkerConfig`], its defaults and its checks.

use std::time::Duration;

use crate::decision::Policy;

/// The default lease: see [`WorkerConfig::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(9);

/// The shortest lease a worker accepts. A lease is renewed every third of
/// itself, so this renews every 100 ms; shorter beats would spin on the
/// store.
pub const MIN_LEASE: Duration = Duration::from_millis(300);

/// How a worker behaves. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Most handlers running at once, at least 1. Default 64.
    pub concurrency: usize,
    /// Most notifications taken from the queue (and claimed) per batch, at
    /// least 1. Default 512.
    pub batch: usize,
    /// Most events claimed ahead of a free handler slot, held in the worker
    /// (their leases renewed, their notifications extended) until a handler
    /// ends and one of them starts. While one round of handlers runs, the
    /// next is claimed, so a slot that frees up starts its next event at
    /// once instead of after a claim's round trip. `None` (default): as
    /// many as `concurrency`. `Some(0)` claims only for free slots. The
    /// trade: an event claimed ahead waits for a handler of this worker even
    /// if another worker is idle; with handlers that run for minutes, set a
    /// small number or 0. A shutdown treats them as runs: they start within
    /// its grace period or are released with the attempt given back.
    pub claim_ahead: Option<usize>,
    /// How long a claim lasts without renewal, at least [`MIN_LEASE`].
    /// Renewed every `lease / 3` (the heartbeat). Default 9 s: a killed
    /// worker's events run again about 9 s after the kill, and a store that
    /// stalls for up to two heartbeats (6 s) loses no lease. Peers default
    /// to 30 s because they cannot renew; see
    /// docs/adr/0006-rescue-by-any-worker.md.
    pub lease: Duration,
    /// The decision's knobs (retry backoff, delays).
    pub policy: Policy,
    /// How often the elected reconciler sweeps, more than 0. Default 3 s. It
    /// sweeps at least once per heartbeat (`lease / 3`) whatever this says,
    /// so an expired lease is found within a heartbeat of its expiry.
    pub sweep_every: Duration,
    /// An event counts as "not notified recently" after this long. Default 60 s.
    pub sweep_quiet: Duration,
    /// How long dead events are kept. Default 7 days.
    pub dead_retention: Duration,
    /// How long done events are kept; `None` (default) deletes them at once.
    pub done_retention: Option<Duration>,
    /// Whether this worker may run the reconciler. Default true.
    pub reconcile: bool,
    /// Whether this worker may run the scheduler, which emits schedules'
    /// occurrences when elected (docs/schedules.md). Default true.
    pub schedules: bool,
    /// How often the elected scheduler looks for due schedules, more than
    /// 0: one query per tick while leading, so also how late an occurrence
    /// may be emitted. Default 1 s.
    pub schedule_every: Duration,
    /// An occurrence emitted up to this late counts as on time; older ones
    /// are missed and follow their schedule's `missed` policy. Default 60 s
    /// ([`crate::schedule::DEFAULT_GRACE`]): more than a leader change takes.
    pub schedule_grace: Duration,
    /// This worker's name in logs and in the leader row. Default: a random
    /// id. A name that stays the same across restarts (`herald serve` uses
    /// `HOST@ADDRESS`) lets a restarted process take its own leader row at
    /// once instead of waiting out its dead predecessor's lease; two live
    /// workers must not share one.
    pub name: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 64,
            batch: 512,
            claim_ahead: None,
            lease: DEFAULT_LEASE,
            policy: Policy::default(),
            sweep_every: Duration::from_secs(3),
            sweep_quiet: Duration::from_secs(60),
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            done_retention: None,
            reconcile: true,
            schedules: true,
            schedule_every: Duration::from_secs(1),
            schedule_grace: crate::schedule::DEFAULT_GRACE,
            name: format!("worker-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        }
    }
}

/// A [`WorkerConfig`] value a worker cannot run with. The message names the
/// field, the value and the default.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorkerConfigError {
    /// `concurrency` or `batch` is 0.
    #[error("{field}: {value} is not enough: it must be at least 1 ({default} is the default)")]
    TooFew {
        /// The field: `concurrency` or `batch`.
        field: &'static str,
        /// The value given.
        value: usize,
        /// The default.
        default: usize,
    },
    /// `lease` is shorter than [`MIN_LEASE`].
    #[error("lease: {value:?} is too short: a lease is renewed every third of itself, so it must be at least {MIN_LEASE:?} ({default:?} is the default)")]
    LeaseTooShort {
        /// The value given.
        value: Duration,
        /// The default.
        default: Duration,
    },
    /// `sweep_every` is zero.
    #[error(
        "sweep_every: {value:?} is too short: it must be more than 0s ({default:?} is the default)"
    )]
    SweepEveryZero {
        /// The value given.
        value: Duration,
        /// The default.
        default: Duration,
    },
    /// `schedule_every` is zero.
    #[error(
        "schedule_every: {value:?} is too short: it must be more than 0s ({default:?} is the default)"
    )]
    ScheduleEveryZero {
        /// The value given.
        value: Duration,
        /// The default.
        default: Duration,
    },
    /// `policy.retry.factor` is below 1 (or not a number).
    #[error("policy.retry.factor: {value} is not a growth factor: it must be at least 1 ({default} is the default)")]
    RetryFactor {
        /// The value given.
        value: f64,
        /// The default.
        default: f64,
    },
    /// `policy.retry.jitter` is outside `0..=1`.
    #[error(
        "policy.retry.jitter: {value} is not a fraction from 0 to 1 ({default} is the default)"
    )]
    RetryJitter {
        /// The value given.
        value: f64,
        /// The default.
        default: f64,
    },
}

impl WorkerConfigError {
    /// What is wrong with the value, without the field's name (the message
    /// is `FIELD: REASON`): for callers that name the field their own way,
    /// as `herald serve`'s configuration does (`worker.lease`).
    pub fn reason(&self) -> String {
        let message = self.to_string();
        match message.strip_prefix(self.field()) {
            Some(rest) => rest.trim_start_matches(": ").to_string(),
            None => message,
        }
    }

    /// The field of [`WorkerConfig`] at fault, as a path (`policy.retry.factor`).
    pub fn field(&self) -> &'static str {
        match self {
            WorkerConfigError::TooFew { field, .. } => field,
            WorkerConfigError::LeaseTooShort { .. } => "lease",
            WorkerConfigError::SweepEveryZero { .. } => "sweep_every",
            WorkerConfigError::ScheduleEveryZero { .. } => "schedule_every",
            WorkerConfigError::RetryFactor { .. } => "policy.retry.factor",
            WorkerConfigError::RetryJitter { .. } => "policy.retry.jitter",
        }
    }
}

impl WorkerConfig {
    /// How many events may be claimed ahead of free handler slots:
    /// [`WorkerConfig::claim_ahead`], or `concurrency` when it is `None`.
    pub fn claim_ahead(&self) -> usize {
        self.claim_ahead.unwrap_or(self.concurrency)
    }

    /// Checks that a worker can run with this configuration: the first
    /// value it cannot run with is the error.
    pub fn validate(&self) -> Result<(), WorkerConfigError> {
        let defaults = WorkerConfig::default();
        let retry = &self.policy.retry;
        let default_retry = defaults.policy.retry;
        for (field, value, default) in [
            ("concurrency", self.concurrency, defaults.concurrency),
            ("batch", self.batch, defaults.batch),
        ] {
            if value == 0 {
                return Err(WorkerConfigError::TooFew {
                    field,
                    value,
                    default,
                });
            }
        }
        if self.lease < MIN_LEASE {
            return Err(WorkerConfigError::LeaseTooShort {
                value: self.lease,
                default: defaults.lease,
            });
        }
        if self.sweep_every.is_zero() {
            return Err(WorkerConfigError::SweepEveryZero {
                value: self.sweep_every,
                default: defaults.sweep_every,
            });
        }
        if self.schedule_every.is_zero() {
            return Err(WorkerConfigError::ScheduleEveryZero {
                value: self.schedule_every,
                default: defaults.schedule_every,
            });
        }
        // Written so that NaN fails too.
        if !(retry.factor >= 1.0 && retry.factor.is_finite()) {
            return Err(WorkerConfigError::RetryFactor {
                value: retry.factor,
                default: default_retry.factor,
            });
        }
        if !(0.0..=1.0).contains(&retry.jitter) {
            return Err(WorkerConfigError::RetryJitter {
                value: retry.jitter,
                default: default_retry.jitter,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(edit: impl FnOnce(&mut WorkerConfig)) -> WorkerConfigError {
        let mut c = WorkerConfig::default();
        edit(&mut c);
        c.validate().expect_err("an invalid config")
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(WorkerConfig::default().validate(), Ok(()));
        let least = WorkerConfig {
            concurrency: 1,
            batch: 1,
            lease: MIN_LEASE,
            sweep_every: Duration::from_millis(1),
            ..WorkerConfig::default()
        };
        assert_eq!(least.validate(), Ok(()));
    }

    #[test]
    fn a_lease_that_would_spin_is_refused() {
        let e = error_of(|c| c.lease = Duration::ZERO);
        assert_eq!(e.field(), "lease");
        assert_eq!(
            e.to_string(),
            "lease: 0ns is too short: a lease is renewed every third of itself, so it must be at least 300ms (9s is the default)"
        );
        let e = error_of(|c| c.lease = Duration::from_millis(299));
        assert!(matches!(e, WorkerConfigError::LeaseTooShort { .. }), "{e}");
    }

    #[test]
    fn zero_sweep_concurrency_or_batch_is_refused() {
        let e = error_of(|c| c.sweep_every = Duration::ZERO);
        assert_eq!(
            e.to_string(),
            "sweep_every: 0ns is too short: it must be more than 0s (3s is the default)"
        );
        let e = error_of(|c| c.concurrency = 0);
        assert_eq!(
            e.to_string(),
            "concurrency: 0 is not enough: it must be at least 1 (64 is the default)"
        );
        let e = error_of(|c| c.batch = 0);
        assert_eq!(e.field(), "batch");
        assert!(e.to_string().contains("(512 is the default)"), "{e}");
    }

    #[test]
    fn a_retry_factor_below_one_or_a_jitter_outside_zero_to_one_is_refused() {
        for f in [0.5, f64::NAN, f64::INFINITY] {
            let e = error_of(|c| c.policy.retry.factor = f);
            assert_eq!(e.field(), "policy.retry.factor");
        }
        assert_eq!(
            error_of(|c| c.policy.retry.factor = 0.5).to_string(),
            "policy.retry.factor: 0.5 is not a growth factor: it must be at least 1 (2 is the default)"
        );
        for j in [-0.1, 1.5, f64::NAN] {
            let e = error_of(|c| c.policy.retry.jitter = j);
            assert_eq!(e.field(), "policy.retry.jitter");
        }
        assert_eq!(
            error_of(|c| c.policy.retry.jitter = 1.5).to_string(),
            "policy.retry.jitter: 1.5 is not a fraction from 0 to 1 (0.2 is the default)"
        );
    }
}
