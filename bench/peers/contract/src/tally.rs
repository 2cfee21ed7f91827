//! What the handlers report to the scenario: runs counted, latencies (with
//! their start times, for the long horizon's windows), the distinct jobs a
//! rescuer ran, the work a handler does, and a worker's failure.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::sync::Notify;

/// Epoch microseconds, the clock both ends of a latency sample read.
pub fn epoch_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What a handler does after it has reported its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Returns at once (drain, latency, idle).
    #[default]
    Plain,
    /// Works this long (long-horizon).
    Work(Duration),
    /// Never returns (the rescue's victim).
    Victim,
    /// Returns at once; runs are counted once per job (the rescue's rescuer).
    Rescuer,
}

/// Runs counted by the handlers, watched by the scenario.
#[derive(Debug, Default)]
pub struct Tally {
    mode: Mode,
    /// Runs, or in rescuer mode distinct jobs run.
    ran: AtomicU64,
    /// Every handler start, duplicates included (rescuer mode).
    starts: AtomicU64,
    /// Rescuer mode: the seqs run so far.
    seen: Mutex<HashSet<u64>>,
    /// Epoch µs of the first handler start (0: none yet).
    first_us: AtomicI64,
    /// Epoch µs of the last handler start that ran a job not run before.
    last_new_us: AtomicI64,
    /// The count at which `half` is notified (0: never).
    half_at: AtomicU64,
    /// The count at which `done` is notified (0: never).
    done_at: AtomicU64,
    pub(crate) half: Notify,
    pub(crate) done: Notify,
    /// (handler start, handler start minus the job's `t_us`), epoch µs and
    /// µs, for the jobs that carry a `t_us`.
    samples_us: Mutex<Vec<(i64, i64)>>,
    /// Set before the workers are stopped: a worker ending then is expected.
    stopping: AtomicBool,
    failure: Mutex<Option<String>>,
    pub(crate) failed: Notify,
}

impl Tally {
    pub(crate) fn new(mode: Mode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Called by the handler first thing, with the job's `seq` and `t_us`;
    /// then the handler awaits [`Tally::work`].
    pub fn ran(&self, seq: u64, t_us: i64) {
        let start_us = epoch_micros();
        if t_us > 0 {
            if let Ok(mut samples) = self.samples_us.lock() {
                samples.push((start_us, start_us - t_us));
            }
        }
        if self.mode == Mode::Rescuer {
            let _ = self
                .first_us
                .compare_exchange(0, start_us, Ordering::SeqCst, Ordering::SeqCst);
            self.starts.fetch_add(1, Ordering::SeqCst);
            let new = self.seen.lock().map(|mut s| s.insert(seq)).unwrap_or(true);
            if !new {
                return;
            }
            self.last_new_us.fetch_max(start_us, Ordering::SeqCst);
        }
        let n = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.half_at.load(Ordering::SeqCst) {
            self.half.notify_one();
        }
        if n == self.done_at.load(Ordering::SeqCst) {
            self.done.notify_one();
        }
    }

    /// The handler's work, awaited after [`Tally::ran`]: `--work-ms` in the
    /// long horizon, forever in the rescue's victim, nothing otherwise.
    pub async fn work(&self) {
        match self.mode {
            Mode::Work(d) if !d.is_zero() => tokio::time::sleep(d).await,
            Mode::Victim => std::future::pending::<()>().await,
            _ => {}
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

    /// How many jobs have run (in the rescuer: how many distinct jobs).
    pub fn count(&self) -> u64 {
        self.ran.load(Ordering::SeqCst)
    }

    /// Rescuer: every handler start, a job run twice counted twice.
    pub(crate) fn starts(&self) -> u64 {
        self.starts.load(Ordering::SeqCst)
    }

    /// Rescuer: epoch µs of the first handler start, if any.
    pub(crate) fn first_us(&self) -> Option<i64> {
        Some(self.first_us.load(Ordering::SeqCst)).filter(|t| *t > 0)
    }

    /// Rescuer: epoch µs of the last start of a job not run before, if any.
    pub(crate) fn last_new_us(&self) -> Option<i64> {
        Some(self.last_new_us.load(Ordering::SeqCst)).filter(|t| *t > 0)
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

    fn samples(&self) -> Vec<(i64, i64)> {
        self.samples_us
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn latencies_sorted(&self) -> Vec<i64> {
        let mut lat: Vec<i64> = self.samples().into_iter().map(|s| s.1).collect();
        lat.sort_unstable();
        lat
    }

    /// The per-window figures of the samples: see [`windows`].
    pub(crate) fn windows(&self, t0_us: i64, window_s: f64) -> Vec<Value> {
        windows(&self.samples(), t0_us, window_s)
    }
}

/// Windows of `window_s` seconds from `t0_us` (epoch µs) by handler start:
/// `{"t_s": end of the window in seconds since t0, "completed": handlers
/// started in it, "latency_ms": {p50, p99, max} of theirs}`. A window in
/// which no handler started is reported with `completed` 0 and null
/// percentiles, so a stall shows as a gap; a start before `t0_us` counts in
/// the first window.
pub(crate) fn windows(samples_us: &[(i64, i64)], t0_us: i64, window_s: f64) -> Vec<Value> {
    if samples_us.is_empty() || window_s <= 0.0 {
        return Vec::new();
    }
    let index = |at: i64| ((at - t0_us).max(0) as f64 / 1e6 / window_s) as usize;
    let n = samples_us.iter().map(|s| index(s.0) + 1).max().unwrap_or(0);
    let mut by_window = vec![Vec::new(); n];
    for &(at, lat) in samples_us {
        by_window[index(at)].push(lat);
    }
    by_window
        .into_iter()
        .enumerate()
        .map(|(i, mut lat)| {
            lat.sort_unstable();
            json!({
                "t_s": crate::scenario::round3((i + 1) as f64 * window_s),
                "completed": lat.len(),
                "latency_ms": crate::scenario::percentiles(&lat),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn half_and_done_fire_at_their_counts() {
        let tally = Arc::new(Tally::default());
        tally.expect(2, 3);
        tally.ran(0, 0);
        tally.ran(1, 0);
        tokio::time::timeout(std::time::Duration::from_secs(1), tally.half.notified())
            .await
            .expect("half at 2");
        tally.ran(2, epoch_micros() - 1_000);
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

    #[test]
    fn only_the_rescuer_counts_a_job_run_twice_once() {
        let plain = Tally::default();
        plain.ran(7, 0);
        plain.ran(7, 0);
        assert_eq!(plain.count(), 2);

        let rescuer = Tally::new(Mode::Rescuer);
        rescuer.expect(0, 3);
        assert_eq!((rescuer.first_us(), rescuer.last_new_us()), (None, None));
        rescuer.ran(7, 0);
        let first = rescuer.first_us().expect("a first start");
        rescuer.ran(8, 0);
        std::thread::sleep(Duration::from_millis(2));
        let last_new = rescuer.last_new_us().expect("a last new start");
        rescuer.ran(7, 0);
        rescuer.ran(8, 0);
        assert_eq!(rescuer.count(), 2, "distinct jobs");
        assert_eq!(rescuer.starts(), 4, "every start");
        assert_eq!(rescuer.first_us(), Some(first));
        assert_eq!(
            rescuer.last_new_us(),
            Some(last_new),
            "a repeat does not move the last new start"
        );
        assert!(first <= last_new);
        rescuer.ran(9, 0);
        assert_eq!(rescuer.count(), 3);
        assert!(rescuer.last_new_us().unwrap() > last_new);
    }

    #[tokio::test]
    async fn work_sleeps_in_the_long_horizon_and_pends_in_the_victim() {
        let t = std::time::Instant::now();
        Tally::default().work().await;
        Tally::new(Mode::Rescuer).work().await;
        Tally::new(Mode::Work(Duration::ZERO)).work().await;
        assert!(t.elapsed() < Duration::from_millis(20));
        let t = std::time::Instant::now();
        Tally::new(Mode::Work(Duration::from_millis(30)))
            .work()
            .await;
        assert!(t.elapsed() >= Duration::from_millis(30));
        let victim = Tally::new(Mode::Victim);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), victim.work())
                .await
                .is_err(),
            "the victim's work never ends"
        );
    }

    #[test]
    fn windows_by_handler_start_with_gaps_reported_empty() {
        let t0 = 1_000_000_000;
        let s = |at_s: f64, lat_ms: i64| (t0 + (at_s * 1e6) as i64, lat_ms * 1000);
        // 10 s windows: [0,10) three starts, [10,20) none, [20,30) one; one
        // start just before t0 counts in the first.
        let samples = [s(0.5, 4), s(9.999, 2), s(-0.1, 6), s(25.0, 40)];
        let w = windows(&samples, t0, 10.0);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0]["t_s"], json!(10.0));
        assert_eq!(w[0]["completed"], json!(3));
        assert_eq!(
            w[0]["latency_ms"],
            json!({"p50": 4.0, "p99": 6.0, "max": 6.0})
        );
        assert_eq!(w[1]["t_s"], json!(20.0));
        assert_eq!(w[1]["completed"], json!(0));
        assert_eq!(
            w[1]["latency_ms"],
            json!({"p50": null, "p99": null, "max": null})
        );
        assert_eq!(w[2]["t_s"], json!(30.0));
        assert_eq!(w[2]["completed"], json!(1));
        assert_eq!(w[2]["latency_ms"]["max"], json!(40.0));
        // A start exactly at a window's end opens the next window.
        let w = windows(&[s(10.0, 1)], t0, 10.0);
        assert_eq!(w.len(), 2);
        assert_eq!(w[1]["completed"], json!(1));
        assert!(windows(&[], t0, 10.0).is_empty());
        // Fractional windows keep their end exact to the millisecond.
        let w = windows(&[s(0.1, 1), s(0.35, 1)], t0, 0.25);
        assert_eq!(w.len(), 2);
        assert_eq!(w[1]["t_s"], json!(0.5));
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
