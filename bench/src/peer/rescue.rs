//! Rescue after SIGKILL, in two processes: a victim that stores N events
//! and holds them in handlers that never return until it is killed, and a
//! rescuer on the same store and queue that runs them, timed from the
//! kill. The driver (`bench/compare.sh`) kills the victim between the two.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;

use super::drain::store_runnable;
use super::latency::now_micros;
use super::setup::{Bench, Fresh};
use super::{Args, BenchError, Report};

/// What a rescue event carries.
#[derive(Deserialize)]
struct Seq {
    seq: u64,
}

/// How long a victim's count of started handlers must stay still before
/// it says it is holding them.
const STILL: Duration = Duration::from_secs(1);
/// A victim not killed by then gives up.
const VICTIM_LIMIT: Duration = Duration::from_secs(600);

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    if !args.target.url.starts_with("postgres") {
        return Err(BenchError::Usage(
            "rescue needs a store two processes share: give a postgres:// --url".into(),
        ));
    }
    let events = args.events.unwrap_or(2000);
    match args.role.as_deref() {
        Some("victim") => victim(args, events).await,
        Some(_) => rescuer(args, events).await,
        None => Err(BenchError::Usage(
            "rescue needs --role victim or --role rescuer".into(),
        )),
    }
}

async fn victim(args: &Args, events: u64) -> Result<Report, BenchError> {
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    store_runnable(&bench, events, 16, 0).await?;
    let started = Arc::new(AtomicU64::new(0));
    let count = started.clone();
    let worker = bench.worker(move |_: Seq, _| {
        count.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>()
    });
    let t = Instant::now();
    let (mut last, mut still_since) = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = started.load(Ordering::SeqCst);
        if now != last {
            (last, still_since) = (now, Instant::now());
        }
        if now == events || (now > 0 && still_since.elapsed() >= STILL) {
            break;
        }
        if t.elapsed() > VICTIM_LIMIT {
            return Err(BenchError::Failed(format!(
                "the victim's handlers did not start in {} s",
                VICTIM_LIMIT.as_secs()
            )));
        }
    }
    bench.hook.call("victim-running").await?;
    let mut report = bench.report("rescue");
    report.role = Some("victim".into());
    report.events = Some(events);
    report.running = Some(last);
    report.print()?;
    eprintln!("victim: {last} handlers running, {events} events held; waiting to be killed");
    tokio::time::sleep(VICTIM_LIMIT).await;
    drop(worker);
    Err(BenchError::Failed(format!(
        "the victim was not killed in {} s",
        VICTIM_LIMIT.as_secs()
    )))
}

async fn rescuer(args: &Args, events: u64) -> Result<Report, BenchError> {
    let Some(killed_at) = args.killed_at else {
        return Err(BenchError::Usage(
            "--role rescuer needs --killed-at (ms since the epoch)".into(),
        ));
    };
    let bench = Bench::open(&args.target, Fresh::Keep).await?;
    bench.hook.call("rescue-start").await?;
    // Distinct events run, and the first and last such run (µs since the
    // epoch): an event run twice counts once.
    let ran: Arc<Mutex<(HashSet<u64>, u64, u64)>> = Arc::default();
    let record = ran.clone();
    let worker = bench.worker(move |s: Seq, _| {
        let now = now_micros();
        let mut r = record.lock().expect("ran");
        if r.0.insert(s.seq) {
            if r.1 == 0 {
                r.1 = now;
            }
            r.2 = now;
        }
        async {}
    });
    let t = Instant::now();
    let timeout_s = args.timeout.unwrap_or(120.0);
    let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
    while (ran.lock().expect("ran").0.len() as u64) < events && t.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bench.hook.call("rescue-end").await?;
    worker.shutdown(Duration::from_secs(5)).await;
    let (seen, first, last) = std::mem::take(&mut *ran.lock().expect("ran"));
    let completed = seen.len() as u64;
    let since_kill = |us: u64| (us as f64 / 1000.0 - killed_at as f64) / 1000.0;
    let timed_out = completed < events;
    eprintln!(
        "rescuer: {completed} of {events} ran; first {:.2} s, last {:.2} s after the kill{}",
        since_kill(first),
        since_kill(last),
        if timed_out { " (timed out)" } else { "" }
    );
    let mut report = bench.report("rescue");
    report.role = Some("rescuer".into());
    report.events = Some(events);
    report.completed = Some(completed);
    report.first_s = (first > 0).then(|| since_kill(first));
    report.rescue_s = (!timed_out).then(|| since_kill(last));
    report.timed_out = Some(timed_out);
    report.timeout_s = Some(timeout_s);
    let w = &bench.config.worker;
    report.knobs.insert(
        "rescue_after_s".into(),
        json!((w.lease + w.sweep_every).as_secs_f64()),
    );
    report.knobs.insert(
        "rescue_setting".into(),
        json!(format!(
            "worker.lease {} s, then the reconciler's next sweep (worker.sweep_every {} s); \
             an event the victim had not claimed, whose notification died with its \
             in-process queue, after worker.sweep_quiet {} s",
            w.lease.as_secs_f64(),
            w.sweep_every.as_secs_f64(),
            w.sweep_quiet.as_secs_f64()
        )),
    );
    bench.close().await?;
    Ok(report)
}
