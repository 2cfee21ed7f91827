//! Recent activity for `GET /v1/stats`: runs done and failed per second, and
//! the emit-to-start latency, over the last minute. Fed by the worker
//! through [`herald::RunObserver`]; kept in this process only.
//!
//! A ring of one-second slots per handler (and one for all of them). Each
//! slot counts runs and keeps a histogram of latencies with logarithmic
//! buckets (eight per power of two: a quantile is within about 6 % of
//! the truth).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herald::{RunObserver, RunSettled};
use serde::Serialize;

/// The window, in one-second slots.
pub const WINDOW_SECONDS: u64 = 60;

/// Sub-buckets per power of two.
const SUB: u32 = 8;

/// The histogram bucket of a latency in microseconds.
fn bucket(micros: u64) -> u16 {
    if micros < u64::from(SUB) {
        return micros as u16;
    }
    let exp = 63 - micros.leading_zeros(); // >= 3
    let sub = ((micros >> (exp - 3)) & u64::from(SUB - 1)) as u32;
    (SUB + (exp - 3) * SUB + sub) as u16
}

/// The middle of a bucket, in microseconds.
fn bucket_middle(b: u16) -> f64 {
    let b = u32::from(b);
    if b < SUB {
        return f64::from(b);
    }
    let exp = (b - SUB) / SUB + 3;
    let sub = (b - SUB) % SUB;
    let width = 2f64.powi(exp as i32 - 3);
    let low = 2f64.powi(exp as i32) + f64::from(sub) * width;
    low + width / 2.0
}

#[derive(Clone, Default)]
struct Slot {
    /// The second (since the tracker started) this slot holds.
    second: u64,
    started: u64,
    done: u64,
    failed: u64,
    dead: u64,
    latency: BTreeMap<u16, u64>,
}

#[derive(Clone)]
struct Ring {
    slots: Vec<Slot>,
}

impl Ring {
    fn new() -> Self {
        Ring {
            slots: vec![
                Slot {
                    second: u64::MAX,
                    ..Slot::default()
                };
                WINDOW_SECONDS as usize
            ],
        }
    }

    fn slot(&mut self, second: u64) -> &mut Slot {
        let s = &mut self.slots[(second % WINDOW_SECONDS) as usize];
        if s.second != second {
            *s = Slot {
                second,
                ..Slot::default()
            };
        }
        s
    }

    fn summary(&self, now: u64, span: f64) -> Recent {
        let mut total = Slot::default();
        for s in &self.slots {
            if s.second != u64::MAX && s.second + WINDOW_SECONDS > now && s.second <= now {
                total.started += s.started;
                total.done += s.done;
                total.failed += s.failed;
                total.dead += s.dead;
                for (b, n) in &s.latency {
                    *total.latency.entry(*b).or_default() += n;
                }
            }
        }
        let samples: u64 = total.latency.values().sum();
        let quantile = |q: f64| -> Option<f64> {
            if samples == 0 {
                return None;
            }
            let rank = ((q * samples as f64).ceil() as u64).clamp(1, samples);
            let mut seen = 0;
            for (b, n) in &total.latency {
                seen += n;
                if seen >= rank {
                    return Some(round(bucket_middle(*b) / 1e6));
                }
            }
            None
        };
        let max = total
            .latency
            .keys()
            .next_back()
            .map(|b| round(bucket_middle(*b) / 1e6));
        Recent {
            window_seconds: span.round() as u64,
            started_per_second: round(total.started as f64 / span),
            done_per_second: round(total.done as f64 / span),
            failed_per_second: round(total.failed as f64 / span),
            dead_per_second: round(total.dead as f64 / span),
            emit_to_start_seconds: Latency {
                samples,
                p50: quantile(0.50),
                p99: quantile(0.99),
                max,
            },
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Throughput and latency over the window.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Recent {
    /// The window the rates are over: 60 s, or less since the server started.
    pub window_seconds: u64,
    /// Runs started per second.
    pub started_per_second: f64,
    /// Runs that finished done, per second.
    pub done_per_second: f64,
    /// Failed attempts (retried or dead), per second.
    pub failed_per_second: f64,
    /// Events moved to dead by a run, per second.
    pub dead_per_second: f64,
    /// Run start minus the event's `run_at`.
    pub emit_to_start_seconds: Latency,
}

/// Latency quantiles, in seconds; `null` without samples.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Latency {
    /// How many runs started in the window.
    pub samples: u64,
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// The largest (its bucket's middle).
    pub max: Option<f64>,
}

/// The whole server's and each handler's recent activity.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RecentStats {
    /// All handlers together.
    #[serde(flatten)]
    pub total: Recent,
    /// Per handler name.
    pub handlers: BTreeMap<String, Recent>,
}

/// The tracker: a [`RunObserver`] for the worker, read by the stats endpoint.
pub struct Tracker {
    started: Instant,
    rings: Mutex<(Ring, HashMap<String, Ring>)>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            started: Instant::now(),
            rings: Mutex::new((Ring::new(), HashMap::new())),
        }
    }
}

impl Tracker {
    fn second(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn with(&self, handler: &str, f: impl Fn(&mut Slot)) {
        let second = self.second();
        let mut rings = self.rings.lock().expect("stats lock");
        f(rings.0.slot(second));
        let ring = match rings.1.get_mut(handler) {
            Some(r) => r,
            None => rings.1.entry(handler.to_string()).or_insert_with(Ring::new),
        };
        f(ring.slot(second));
    }

    /// The last minute's figures.
    pub fn snapshot(&self) -> RecentStats {
        let elapsed = self.started.elapsed();
        let now = elapsed.as_secs();
        let span = elapsed.as_secs_f64().clamp(1.0, WINDOW_SECONDS as f64);
        let rings = self.rings.lock().expect("stats lock");
        RecentStats {
            total: rings.0.summary(now, span),
            handlers: rings
                .1
                .iter()
                .map(|(name, ring)| (name.clone(), ring.summary(now, span)))
                .collect(),
        }
    }
}

impl RunObserver for Tracker {
    fn started(&self, handler: &str, waited: Duration) {
        let b = bucket(waited.as_micros().min(u128::from(u64::MAX)) as u64);
        self.with(handler, |s| {
            s.started += 1;
            *s.latency.entry(b).or_default() += 1;
        });
    }

    fn settled(&self, handler: &str, how: RunSettled) {
        self.with(handler, |s| match how {
            RunSettled::Done => s.done += 1,
            RunSettled::Retried => s.failed += 1,
            RunSettled::Dead => {
                s.failed += 1;
                s.dead += 1;
            }
            RunSettled::Snoozed | RunSettled::Cancelled => {}
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_within_a_sixteenth() {
        let mut last = 0;
        for micros in (0..100_000u64).chain([1 << 20, 1 << 30, u64::MAX >> 1]) {
            let b = bucket(micros);
            assert!(b >= last, "{micros}");
            last = b;
            let mid = bucket_middle(b);
            let err = (mid - micros as f64).abs() / (micros.max(1) as f64);
            assert!(err <= 1.0 / 16.0 + 1e-9 || micros < 8, "{micros}: {mid}");
        }
    }

    #[test]
    fn quantiles_and_rates_over_the_window() {
        let t = Tracker::default();
        for i in 1..=100u64 {
            t.started("h", Duration::from_millis(i));
            t.settled(
                "h",
                if i <= 90 {
                    RunSettled::Done
                } else {
                    RunSettled::Dead
                },
            );
        }
        t.settled("other", RunSettled::Retried);
        let s = t.snapshot();
        assert_eq!(s.total.emit_to_start_seconds.samples, 100);
        let p50 = s.total.emit_to_start_seconds.p50.unwrap();
        assert!((p50 - 0.050).abs() < 0.050 / 16.0, "{p50}");
        let p99 = s.total.emit_to_start_seconds.p99.unwrap();
        assert!((p99 - 0.099).abs() < 0.099 / 16.0, "{p99}");
        // Under a second old: the rates are over one second.
        assert_eq!(s.total.window_seconds, 1);
        assert_eq!(s.total.done_per_second, 90.0);
        assert_eq!(s.total.failed_per_second, 11.0);
        assert_eq!(s.handlers["h"].dead_per_second, 10.0);
        assert_eq!(s.handlers["other"].emit_to_start_seconds.p50, None);
    }

    #[test]
    fn old_slots_leave_the_window() {
        let mut ring = Ring::new();
        ring.slot(0).done = 5;
        ring.slot(59).done = 1;
        assert_eq!(ring.summary(59, 60.0).done_per_second, round(6.0 / 60.0));
        assert_eq!(ring.summary(60, 60.0).done_per_second, round(1.0 / 60.0));
        // Reusing slot 0 for second 60 resets it.
        ring.slot(60).done = 2;
        assert_eq!(ring.summary(60, 60.0).done_per_second, round(3.0 / 60.0));
    }
}
