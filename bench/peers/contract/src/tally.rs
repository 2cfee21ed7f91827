//! What the handlers report to the scenario: runs counted, latencies, and a
//! worker's failure.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// Epoch microseconds, the clock both ends of a latency sample read.
pub fn epoch_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Runs counted by the handlers, watched by the scenario.
#[derive(Debug, Default)]
pub struct Tally {
    ran: AtomicU64,
    /// The count at which `half` is notified (0: never).
    half_at: AtomicU64,
    /// The count at which `done` is notified (0: never).
    done_at: AtomicU64,
    pub(crate) half: Notify,
    pub(crate) done: Notify,
    /// Handler start minus the job's `t_us`, microseconds (latency runs).
    latencies_us: Mutex<Vec<i64>>,
    /// Set before the workers are stopped: a worker ending then is expected.
    stopping: AtomicBool,
    failure: Mutex<Option<String>>,
    pub(crate) failed: Notify,
}

impl Tally {
    /// Called by the handler first thing, with the job's `t_us`.
    pub fn ran(&self, t_us: i64) {
        if t_us > 0 {
            let start_us = epoch_micros();
            if let Ok(mut lat) = self.latencies_us.lock() {
                lat.push(start_us - t_us);
            }
        }
        let n = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.half_at.load(Ordering::SeqCst) {
            self.half.notify_one();
        }
        if n == self.done_at.load(Ordering::SeqCst) {
            self.done.notify_one();
        }
    }

    /// Records a worker's failure; the scenario ends with it.
    pub fn fail(&self, why: impl Into<String>) {
        if let Ok(mut slot) = self.failure.lock() {
            slot.get_or_insert(why.into());
        }
        self.failed.notify_one();
    }

    /// Spawns a worker task: an error, a panic, or an end before the
    /// workers were asked to stop is recorded as the run's failure.
    pub fn watch<F>(self: &Arc<Self>, what: &'static str, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let tally = self.clone();
        let inner = tokio::spawn(task);
        tokio::spawn(async move {
            match inner.await {
                Ok(Ok(())) if tally.stopping.load(Ordering::SeqCst) => {}
                Ok(Ok(())) => tally.fail(format!("{what} ended before it was stopped")),
                Ok(Err(e)) => tally.fail(format!("{what} failed: {e:#}")),
                Err(e) => tally.fail(format!("{what} panicked: {e}")),
            }
        })
    }

    /// How many jobs have run.
    pub fn count(&self) -> u64 {
        self.ran.load(Ordering::SeqCst)
    }

    pub(crate) fn expect(&self, half_at: u64, done_at: u64) {
        self.half_at.store(half_at, Ordering::SeqCst);
        self.done_at.store(done_at, Ordering::SeqCst);
    }

    pub(crate) fn stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    pub(crate) fn latencies_sorted(&self) -> Vec<i64> {
        let mut lat = self
            .latencies_us
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        lat.sort_unstable();
        lat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn half_and_done_fire_at_their_counts() {
        let tally = Arc::new(Tally::default());
        tally.expect(2, 3);
        tally.ran(0);
        tally.ran(0);
        tokio::time::timeout(std::time::Duration::from_secs(1), tally.half.notified())
            .await
            .expect("half at 2");
        tally.ran(epoch_micros() - 1_000);
        tokio::time::timeout(std::time::Duration::from_secs(1), tally.done.notified())
            .await
            .expect("done at 3");
        assert_eq!(tally.count(), 3);
        assert_eq!(
            tally.latencies_sorted().len(),
            1,
            "only jobs with t_us are sampled"
        );
    }

    #[tokio::test]
    async fn a_worker_ending_early_is_a_failure_but_not_once_stopping() {
        let tally = Arc::new(Tally::default());
        tally.watch("worker", async { Ok(()) }).await.unwrap();
        assert_eq!(
            tally.failure().as_deref(),
            Some("worker ended before it was stopped")
        );

        let tally = Arc::new(Tally::default());
        tally.stopping();
        tally.watch("worker", async { Ok(()) }).await.unwrap();
        assert_eq!(tally.failure(), None);

        let tally = Arc::new(Tally::default());
        tally.stopping();
        tally
            .watch("worker", async { Err(anyhow::anyhow!("connection lost")) })
            .await
            .unwrap();
        assert_eq!(
            tally.failure().as_deref(),
            Some("worker failed: connection lost")
        );
    }
}
