//! Emit-to-start latency: a worker up and idle, then single emits offered
//! at fixed rates (at most `--in-flight` at once), each carrying the time
//! just before its emit; the handler takes the time first thing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use herald::Context;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;

use super::result::{cpu_ms, process_cpu, Percentiles, Point, Slow};
use super::setup::{Bench, Fresh, HANDLER};
use super::{Args, BenchError, Report};

/// How a paced producer offers single emits (latency, long horizon).
pub(super) struct Pace {
    /// Seconds of offering.
    pub(super) seconds: f64,
    /// Emits in flight at most.
    pub(super) in_flight: usize,
    /// Tenants the events are spread over.
    pub(super) tenants: u64,
}

/// Offers single emits of [`Stamp`]s at `rate` for `pace.seconds` (the
/// k-th due at k / rate, at most `pace.in_flight` at once; offering ends
/// with its window, so a store that cannot take `rate` is offered less,
/// not for longer). `next` numbers the events across calls. Returns the
/// events offered and the seconds offering took.
pub(super) async fn offer(
    bench: &Bench,
    pace: &Pace,
    rate: f64,
    next: &mut u64,
) -> Result<(u64, f64), BenchError> {
    let total = (rate * pace.seconds).round() as u64;
    let gate = Arc::new(Semaphore::new(pace.in_flight.max(1)));
    let start = Instant::now();
    let window_end = start + Duration::from_secs_f64(pace.seconds);
    let mut offered = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..total {
        let due = start + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let permit = gate.clone().acquire_owned().await.expect("open");
        if Instant::now() > window_end {
            break;
        }
        offered += 1;
        let client = bench.client.clone();
        let tenant = format!("tenant-{}", *next % pace.tenants.max(1));
        let seq = *next;
        *next += 1;
        tasks.spawn(async move {
            let payload = format!(r#"{{"t":{},"seq":{seq}}}"#, now_micros());
            let r = client
                .emit_json(&tenant, HANDLER, &payload, Default::default())
                .await;
            drop(permit);
            r
        });
        while let Some(done) = tasks.try_join_next() {
            done.expect("emit task")?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("emit task")?;
    }
    Ok((offered, start.elapsed().as_secs_f64()))
}

/// What a paced event carries.
#[derive(Deserialize)]
pub(super) struct Stamp {
    /// Microseconds since the epoch, just before the emit.
    pub(super) t: u64,
}

/// Microseconds since the epoch.
pub(super) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// How long the last events of a rate may take to run after offering ends.
const SETTLE: Duration = Duration::from_secs(60);

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    let seconds = args.seconds_or(20.0);
    if args.rate.iter().any(|r| r.is_nan() || *r <= 0.0) || seconds <= 0.0 {
        return Err(BenchError::Usage(
            "--rate and --seconds must be positive".into(),
        ));
    }
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    // With their ids and attempts, which name the outliers.
    let samples: Arc<Mutex<Vec<Slow>>> = Arc::default();
    let record = samples.clone();
    let worker = bench.worker(move |s: Stamp, run: Context| {
        let ms = now_micros().saturating_sub(s.t) as f64 / 1000.0;
        record.lock().expect("samples").push(Slow {
            event_id: run.event_id,
            ms,
            attempt: run.attempt,
        });
        async {}
    });
    // Let the worker settle (its first receive, the reconciler's election).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = process_cpu();
    let mut points = Vec::new();
    let mut next = 0u64;
    let pace = Pace {
        seconds,
        in_flight: args.in_flight,
        tenants: args.tenants,
    };
    for &rate in &args.rate {
        samples.lock().expect("samples").clear();
        bench.hook.call("run-start").await?;
        let (offered, offering) = offer(&bench, &pace, rate, &mut next).await?;
        let settle = Instant::now();
        while (samples.lock().expect("samples").len() as u64) < offered && settle.elapsed() < SETTLE
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bench.hook.call("run-end").await?;
        let taken = std::mem::take(&mut *samples.lock().expect("samples"));
        let point = Point {
            rate,
            achieved_rate: offered as f64 / offering,
            offered,
            completed: taken.len() as u64,
            latency_ms: Percentiles::of(taken.iter().map(|s| s.ms).collect()),
            slowest: Slow::slowest(taken),
        };
        eprintln!(
            "rate {rate}/s: offered {:.0}/s, {} of {} ran, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            point.achieved_rate,
            point.completed,
            point.offered,
            point.latency_ms.p50,
            point.latency_ms.p99,
            point.latency_ms.max
        );
        if let Some(worst) = point.slowest.first() {
            eprintln!(
                "  slowest: {} ({:.2} ms, attempt {})",
                worst.event_id, worst.ms, worst.attempt
            );
        }
        points.push(point);
    }
    let cpu = cpu_ms(cpu, process_cpu());
    worker.shutdown(Duration::from_secs(5)).await;
    let mut report = bench.report("latency");
    let first = points[0].clone();
    report.rate = Some(first.rate);
    report.achieved_rate = Some(first.achieved_rate);
    report.offered = Some(first.offered);
    report.completed = Some(first.completed);
    report.latency_ms = Some(first.latency_ms);
    report.seconds = Some(seconds);
    report.process_cpu_ms = Some(cpu);
    report.points = points;
    report
        .knobs
        .insert("in_flight".into(), json!(args.in_flight));
    report.knobs.insert("tenants".into(), json!(args.tenants));
    let lost: Vec<String> = report
        .points
        .iter()
        .filter(|p| p.completed < p.offered)
        .map(|p| format!("{} of {} at {}/s", p.completed, p.offered, p.rate))
        .collect();
    bench.close().await?;
    if !lost.is_empty() {
        return Err(BenchError::Failed(format!(
            "events did not run within {} s of the end of offering: {}",
            SETTLE.as_secs(),
            lost.join(", ")
        )));
    }
    Ok(report)
}
