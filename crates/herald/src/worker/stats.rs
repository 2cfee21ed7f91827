//! Counters of what a worker did.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated by the worker's tasks.
        #[derive(Debug, Default)]
        pub struct WorkerStats {
            $($(#[$doc])* pub(crate) $name: AtomicU64,)*
        }

        /// A copy of [`WorkerStats`] at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl WorkerStats {
            /// Reads every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Notifications received.
    received,
    /// Messages on the queue that were not notifications; dropped.
    garbage,
    /// Claims won (an event claimed ahead of a free slot counts when
    /// claimed, before its handler starts).
    claimed,
    /// Runs that finished done.
    done,
    /// Runs that failed and will be retried.
    retried,
    /// Runs that failed with no attempts left, or for good.
    dead,
    /// Runs that snoozed (shutdown's cancellations count as `cancelled`).
    snoozed,
    /// Runs cancelled by shutdown.
    cancelled,
    /// Leases lost while running (renewal failed).
    lease_lost,
    /// Settlements the store refused because the lease token no longer matched.
    fenced_out,
    /// Notifications dropped (missing, finished, paused or blocked events, unknown handlers).
    dropped,
    /// Notifications put back on the queue without running (not due, leased, lost claim, store failure).
    requeued,
    /// Events whose last attempt's worker died; moved to dead.
    buried,
    /// Lease renewals that succeeded.
    renewed,
    /// Store calls that failed.
    store_errors,
    /// Notifications the reconciler published.
    reconciled,
    /// Reconciler sweeps completed by this worker while it led (with a
    /// queue that forgets on restart, the first one, at start, notifies
    /// every due event last notified before the queue began).
    sweeps,
    /// Occurrences' events the scheduler stored while this worker led it.
    scheduled,
}

impl WorkerStats {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}
