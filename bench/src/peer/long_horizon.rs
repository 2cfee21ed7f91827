//! The long horizon: single emits offered at one fixed rate for many
//! minutes to a handler that works `--work-ms`, with emit-to-start latency
//! per window, so a store whose plans or dead tuples degrade over time
//! shows it (the driver samples the tables meanwhile).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::latency::{now_micros, offer, Pace, Stamp};
use super::result::{cpu_ms, process_cpu, Percentiles, Window};
use super::setup::{Bench, Fresh};
use super::{Args, BenchError, Report};

/// How long the last events may take to run after offering ends.
const SETTLE: Duration = Duration::from_secs(60);

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    let rate = args.rate[0];
    let seconds = args.seconds_or(600.0);
    if !(rate > 0.0 && seconds > 0.0 && args.window > 0.0 && args.work_ms >= 0.0) {
        return Err(BenchError::Usage(
            "--rate, --seconds and --window must be positive, --work-ms not negative".into(),
        ));
    }
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    // (handler start, µs since the epoch; emit-to-start, ms)
    let samples: Arc<Mutex<Vec<(u64, f64)>>> = Arc::default();
    let record = samples.clone();
    let work = Duration::from_secs_f64(args.work_ms / 1000.0);
    let worker = bench.worker(move |s: Stamp, _| {
        let now = now_micros();
        record
            .lock()
            .expect("samples")
            .push((now, now.saturating_sub(s.t) as f64 / 1000.0));
        tokio::time::sleep(work)
    });
    // Let the worker settle (its first receive, the reconciler's election).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pace = Pace {
        seconds,
        in_flight: args.in_flight,
        tenants: args.tenants,
    };
    bench.hook.call("run-start").await?;
    let cpu = process_cpu();
    let t0 = now_micros();
    let (offered, offering) = offer(&bench, &pace, rate, &mut 0).await?;
    let settle = Instant::now();
    while (samples.lock().expect("samples").len() as u64) < offered && settle.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bench.hook.call("run-end").await?;
    let cpu = cpu_ms(cpu, process_cpu());
    let taken = std::mem::take(&mut *samples.lock().expect("samples"));
    worker.shutdown(Duration::from_secs(5)).await;
    let completed = taken.len() as u64;
    let windows = windows(&taken, t0, args.window);
    eprintln!(
        "offered {offered} at {:.0}/s, {completed} ran; {} windows, worst p99 {:.1} ms",
        offered as f64 / offering,
        windows.len(),
        windows.iter().map(|w| w.latency_ms.p99).fold(0.0, f64::max)
    );
    let mut report = bench.report("long-horizon");
    report.rate = Some(rate);
    report.seconds = Some(seconds);
    report.work_ms = Some(args.work_ms);
    report.offered = Some(offered);
    report.completed = Some(completed);
    report.achieved_rate = Some(offered as f64 / offering);
    report.latency_ms = Some(Percentiles::of(taken.into_iter().map(|s| s.1).collect()));
    report.windows = windows;
    report.process_cpu_ms = Some(cpu);
    report
        .knobs
        .insert("in_flight".into(), json!(args.in_flight));
    report.knobs.insert("tenants".into(), json!(args.tenants));
    report.knobs.insert("window_s".into(), json!(args.window));
    bench.close().await?;
    if completed < offered {
        return Err(BenchError::Failed(format!(
            "{completed} of {offered} offered events ran within {} s of the end of offering",
            SETTLE.as_secs()
        )));
    }
    Ok(report)
}

/// Per-window figures of (start µs, latency ms) samples, windows of
/// `window` seconds from `t0` by handler start; a window with no start is
/// reported empty, so a stall shows as a gap.
fn windows(samples: &[(u64, f64)], t0: u64, window: f64) -> Vec<Window> {
    let index = |at: u64| (at.saturating_sub(t0) as f64 / 1e6 / window) as usize;
    let n = samples.iter().map(|s| index(s.0) + 1).max().unwrap_or(0);
    let mut by_window = vec![Vec::new(); n];
    for &(at, ms) in samples {
        by_window[index(at)].push(ms);
    }
    by_window
        .into_iter()
        .enumerate()
        .map(|(i, ms)| Window {
            t_s: (i + 1) as f64 * window,
            completed: ms.len() as u64,
            latency_ms: Percentiles::of(ms),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_by_start_with_gaps_left_empty() {
        let t0 = 1_000_000_000;
        let s = |secs: f64, ms: f64| (t0 + (secs * 1e6) as u64, ms);
        let w = windows(&[s(0.5, 1.0), s(9.9, 3.0), s(25.0, 7.0)], t0, 10.0);
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[0].t_s, w[0].completed, w[0].latency_ms.max),
            (10.0, 2, 3.0)
        );
        assert_eq!((w[1].t_s, w[1].completed), (20.0, 0), "a stall is a gap");
        assert_eq!(
            (w[2].t_s, w[2].completed, w[2].latency_ms.p50),
            (30.0, 1, 7.0)
        );
        assert!(windows(&[], t0, 10.0).is_empty());
    }
}
