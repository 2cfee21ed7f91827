//! What a benchmark reports: one JSON object (the last line on stdout, and
//! the `--out` file), in the shape every peer of `bench/compare.sh` prints.

use std::path::PathBuf;
use std::time::Duration;

use herald::EventId;
use serde::Serialize;
use serde_json::{Map, Value};

use super::BenchError;

/// One run's results. Fields a scenario does not measure are left out.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// `herald`.
    pub system: String,
    /// herald's version.
    pub version: String,
    /// `drain`, `latency`, `emit`, `topic`, `idle`, `long-horizon` or `rescue`.
    pub scenario: String,
    /// `sqlite` or `postgres`.
    pub store: String,
    /// `memory`, `nats` or `pubsub`.
    pub queue: String,
    /// Runnable events drained, or emitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Non-runnable events stored before the drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog: Option<u64>,
    /// `delayed` or `paused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog_kind: Option<String>,
    /// The timed phase, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Events run (drain) or stored (emit) per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_per_s: Option<f64>,
    /// Emit: single emits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub single_per_s: Option<f64>,
    /// Emit: events per second in batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batched_per_s: Option<f64>,
    /// Latency, one rate: events offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered: Option<u64>,
    /// Latency, one rate: events that ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
    /// Latency, one rate: the rate asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Latency, one rate: the rate offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved_rate: Option<f64>,
    /// Latency, one rate: emit-to-start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<Percentiles>,
    /// Latency: every rate (the first also at the top level).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<Point>,
    /// Long horizon: what each handler worked, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_ms: Option<f64>,
    /// Long horizon: figures per window of handler starts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// Rescue: `victim` or `rescuer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Rescue, victim: handlers running when it said so (it is killed then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<u64>,
    /// Rescue, rescuer: seconds from the kill to the last job's run (none
    /// when not every job ran within the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescue_s: Option<f64>,
    /// Rescue, rescuer: seconds from the kill to the first job's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_s: Option<f64>,
    /// Rescue, rescuer: whether it gave up before every job ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// Rescue, rescuer: how long it waited at most, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Topic: one entry per subscriber count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<super::topic::TopicPoint>,
    /// This process's CPU over the timed phase, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_cpu_ms: Option<f64>,
    /// Every setting that shapes the result.
    pub knobs: Map<String, Value>,
    /// Where to write the report too.
    #[serde(skip)]
    pub out: Option<PathBuf>,
}

/// Emit-to-start latency at one rate.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// The rate asked for, events/s.
    pub rate: f64,
    /// The rate offered (emits answered over the offering time).
    pub achieved_rate: f64,
    /// Events offered.
    pub offered: u64,
    /// Events that ran.
    pub completed: u64,
    /// Emit-to-start, ms.
    pub latency_ms: Percentiles,
    /// The slowest events, slowest first ([`SLOWEST`] at most): an
    /// outlier's id, to look up in the logs, and its attempt (above 1: its
    /// first claim's lease was lost, and it ran again after a rescue).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slowest: Vec<Slow>,
}

/// How many of the slowest events a latency point names.
pub const SLOWEST: usize = 5;

/// One event's emit-to-start: a sample of a latency point, and one of
/// its slowest.
#[derive(Clone, Debug, Serialize)]
pub struct Slow {
    /// The event.
    pub event_id: EventId,
    /// Emit-to-start, ms.
    pub ms: f64,
    /// The attempt that started (1 for a first run).
    pub attempt: u32,
}

impl Slow {
    /// The [`SLOWEST`] slowest of `samples`, slowest first.
    pub fn slowest(mut samples: Vec<Slow>) -> Vec<Slow> {
        samples.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        samples.truncate(SLOWEST);
        samples
    }
}

/// Long horizon: one window of handler starts.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// The window's end, seconds since offering began.
    pub t_s: f64,
    /// Handlers that started in the window.
    pub completed: u64,
    /// Their emit-to-start, ms.
    pub latency_ms: Percentiles,
}

/// p50, p99 and max of a sample, in ms.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Of samples in ms (sorted here); zeros for none.
    pub fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Percentiles::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: ms[ms.len() - 1],
        }
    }
}

impl Report {
    /// Prints the report as one JSON line on stdout, and writes it to `out`.
    pub fn print(&self) -> Result<(), BenchError> {
        let json = serde_json::to_string(self).expect("a report serializes");
        if let Some(path) = &self.out {
            std::fs::write(path, format!("{json}\n")).map_err(|e| BenchError::Write {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        }
        println!("{json}");
        Ok(())
    }
}

/// This process's CPU time so far (user + system).
pub(super) fn process_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |v: nix::sys::time::TimeVal| {
                Duration::new(v.tv_sec() as u64, v.tv_usec() as u32 * 1000)
            };
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Milliseconds between two CPU readings.
pub(super) fn cpu_ms(before: Duration, after: Duration) -> f64 {
    after.saturating_sub(before).as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_hundred_samples() {
        let p = Percentiles::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(p.p50, 51.0);
        assert_eq!(p.p99, 99.0);
        assert_eq!(p.max, 100.0);
        assert_eq!(Percentiles::of(vec![]).max, 0.0);
    }

    #[test]
    fn the_slowest_are_named_slowest_first_with_their_attempts() {
        let rescued = EventId::new();
        let samples: Vec<Slow> = (0..20)
            .map(|i| Slow {
                event_id: EventId::new(),
                ms: f64::from(i % 7),
                attempt: 1,
            })
            .chain([Slow {
                event_id: rescued,
                ms: 8600.0,
                attempt: 2,
            }])
            .collect();
        let slow = Slow::slowest(samples);
        assert_eq!(slow.len(), SLOWEST);
        assert_eq!(slow[0].event_id, rescued);
        assert_eq!((slow[0].ms, slow[0].attempt), (8600.0, 2));
        assert!(slow.windows(2).all(|w| w[0].ms >= w[1].ms));
        assert!(Slow::slowest(Vec::new()).is_empty());
    }
}
