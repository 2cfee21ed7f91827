//! The drain: N no-op events stored (untimed), optionally behind a backlog
//! of events that are not runnable, then a worker started and timed until
//! every runnable one has run.

use std::time::{Duration, Instant};

use herald::{EmitOptions, EmitRequest, EventId, Millis, NewEvent, Rule, RuleKind, RunAt};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::hook::Hook;
use super::report::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh, HANDLER};
use super::{BenchError, Report, Target};

/// Options of `herald bench drain`.
#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    /// Runnable events to drain.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Events that are not runnable, stored first (see --backlog-kind).
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// `delayed`: due a day from now; `paused`: of the same handler, paused
    /// for --backlog-tenants tenants, due an hour ago (in front of every
    /// runnable event). Both are stored without notifications, as in a
    /// steady state: a delayed event's notification waits in the queue, a
    /// paused one's was dropped when it arrived and the sweep has parked
    /// the event since (done here before the drain, untimed: phase
    /// `backlog-parked`).
    #[arg(long, default_value = "delayed", value_parser = ["delayed", "paused"])]
    backlog_kind: String,
    /// Paused backlog: the tenants it is spread over, each with a pause.
    #[arg(long, default_value_t = 1000)]
    backlog_tenants: u64,
    /// Tenants the runnable events are spread over.
    #[arg(long, default_value_t = 16)]
    tenants: u64,
    /// Give up when the drain has not finished in this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    #[command(flatten)]
    target: Target,
}

/// Events per store write while preparing.
const CHUNK: u64 = 5000;

pub(super) async fn run(args: DrainArgs) -> Result<Report, BenchError> {
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    store_backlog(&bench, &args).await?;
    bench.hook.call("after-backlog").await?;
    if args.backlog > 0 && args.backlog_kind == "paused" {
        park_backlog(&bench, args.backlog).await?;
        bench.hook.call("backlog-parked").await?;
    }
    store_runnable(&bench, args.events, args.tenants).await?;
    bench.hook.call("drain-start").await?;

    let cpu = process_cpu();
    let t = Instant::now();
    let worker = bench.worker(|_: serde::de::IgnoredAny, _| async {});
    let bar = progress(args.events, "draining");
    let mut halfway = None;
    loop {
        let done = worker.stats().done;
        bar.set_position(done);
        if halfway.is_none() && done * 2 >= args.events {
            halfway = Some(bench.hook.spawn("mid-drain"));
        }
        if done >= args.events {
            break;
        }
        if t.elapsed() > Duration::from_secs(args.timeout) {
            worker.shutdown(Duration::ZERO).await;
            return Err(BenchError::Failed(format!(
                "the drain did not finish in {} s: {done} of {} events ran",
                args.timeout, args.events
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seconds = t.elapsed().as_secs_f64();
    let cpu = cpu_ms(cpu, process_cpu());
    bar.finish_and_clear();
    // What the mid-drain hook started (the mid-analyze case's ANALYZE)
    // ends inside the timed phases, so that the readings at drain-end hold
    // all of its CPU, which the report takes off whole.
    Hook::finish(halfway.flatten(), "mid-drain").await?;
    bench.hook.call("drain-end").await?;
    worker.shutdown(Duration::from_secs(5)).await;

    // Every runnable event gone, every backlog event still stored.
    let left: u64 = bench
        .client
        .handler_counts(&herald::CountsQuery::totals())
        .await?
        .iter()
        .map(|c| c.total())
        .sum();
    if left != args.backlog {
        return Err(BenchError::Failed(format!(
            "after the drain the store holds {left} events, not the backlog's {}",
            args.backlog
        )));
    }
    let mut report = bench.report("drain");
    report.events = Some(args.events);
    report.backlog = Some(args.backlog);
    report.backlog_kind = (args.backlog > 0).then(|| args.backlog_kind.clone());
    report.seconds = Some(seconds);
    report.events_per_s = Some(args.events as f64 / seconds);
    report.process_cpu_ms = Some(cpu);
    report.knobs.insert("tenants".into(), json!(args.tenants));
    if args.backlog > 0 && args.backlog_kind == "paused" {
        report
            .knobs
            .insert("backlog_tenants".into(), json!(args.backlog_tenants));
    }
    bench.close().await?;
    Ok(report)
}

/// Emits `events` runnable events `{"seq": N}` in batches, spread over
/// `tenants`, with a progress bar (untimed preparation).
pub(super) async fn store_runnable(
    bench: &Bench,
    events: u64,
    tenants: u64,
) -> Result<(), BenchError> {
    let bar = progress(events, "storing");
    for start in (0..events).step_by(CHUNK as usize) {
        let n = CHUNK.min(events - start);
        let batch = (start..start + n)
            .map(|seq| EmitRequest {
                tenant: format!("tenant-{}", seq % tenants.max(1)),
                handler: HANDLER.into(),
                payload: format!(r#"{{"seq":{seq}}}"#),
                options: EmitOptions::default(),
            })
            .collect();
        bench.client.emit_batch(batch).await?;
        bar.inc(n);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Stores the backlog straight into the store (no notifications).
async fn store_backlog(bench: &Bench, args: &DrainArgs) -> Result<(), BenchError> {
    if args.backlog == 0 {
        return Ok(());
    }
    let paused = args.backlog_kind == "paused";
    let tenants = args.backlog_tenants.max(1);
    let tenant = |i: u64| {
        if paused {
            format!("paused-{}", i % tenants)
        } else {
            format!("tenant-{}", i % args.tenants.max(1))
        }
    };
    if paused {
        for i in 0..tenants.min(args.backlog) {
            bench
                .store
                .add_rule(&Rule {
                    tenant: tenant(i),
                    handler: HANDLER.into(),
                    kind: RuleKind::Pause,
                })
                .await?;
        }
    }
    let run_at = if paused {
        RunAt::At(Millis::now().minus(Duration::from_secs(3600)))
    } else {
        RunAt::After(Duration::from_secs(86_400))
    };
    let bar = progress(args.backlog, "storing the backlog");
    for start in (0..args.backlog).step_by(CHUNK as usize) {
        let n = CHUNK.min(args.backlog - start);
        let batch: Vec<NewEvent> = (start..start + n)
            .map(|i| NewEvent {
                id: EventId::new(),
                tenant: tenant(i),
                handler: HANDLER.into(),
                payload: format!(r#"{{"i":{i}}}"#),
                run_at,
                max_attempts: 10,
                idempotency_key: None,
                topic: None,
            })
            .collect();
        bench.store.emit(&batch).await?;
        bar.inc(n);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Parks the paused backlog as the reconciler's sweeps would have done
/// long before, in the steady state this case stands for (a notification
/// of a held event is acked and the next sweep parks the event): sweep
/// passes with no quiet period until one finds nothing. Untimed, between
/// the `after-backlog` and `backlog-parked` phases, so that the hook can
/// measure the one-time cost of parking apart from the drain.
async fn park_backlog(bench: &Bench, backlog: u64) -> Result<(), BenchError> {
    /// Notifications per sweep call; a call parks up to 16 times as many.
    const LIMIT: usize = 1000;
    let bar = progress(backlog, "parking the backlog");
    let mut pass = None;
    let mut calls = 0u64;
    loop {
        let page = bench.store.sweep(Duration::ZERO, pass, LIMIT).await?;
        if !page.due.is_empty() {
            return Err(BenchError::Failed(format!(
                "parking the paused backlog: the sweep found {} events to notify, \
                 but only paused events are stored yet",
                page.due.len()
            )));
        }
        calls += 1;
        bar.set_position((calls * (LIMIT as u64) * 16).min(backlog));
        if page.complete {
            break;
        }
        pass = Some(page.pass);
    }
    bar.finish_and_clear();
    Ok(())
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(super) fn progress(len: u64, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what);
    bar
}
