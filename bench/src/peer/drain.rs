//! The drain: N no-op events stored (untimed), optionally behind a backlog
//! of events that are not runnable, then a worker started and timed until
//! every runnable one has run. Optionally under concurrency limits
//! (`--limit-running`, `--limit-per-key` with `--keys`), set before the
//! runnable events are stored: the events a full limit holds are parked by
//! the claim and woken by the settle that frees a slot, so the drain ends
//! the same way, when every event has run.

use std::time::{Duration, Instant};

use herald::{
    EmitOptions, EmitRequest, EventId, Limit, LimitScope, Millis, NewEvent, Rule, RuleKind, RunAt,
};
use serde_json::json;

use super::hook::Hook;
use super::result::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh, HANDLER};
use super::{Args, BenchError, Report};

/// Events per store write while preparing.
const CHUNK: u64 = 5000;

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    let events = args.events.unwrap_or(200_000);
    let timeout = Duration::from_secs_f64(args.timeout.unwrap_or(600.0));
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    store_backlog(&bench, args).await?;
    bench.hook.call("after-backlog").await?;
    if args.backlog > 0 && args.backlog_kind == "paused" {
        park_backlog(&bench).await?;
        bench.hook.call("backlog-parked").await?;
    }
    set_limits(&bench, args).await?;
    store_runnable(&bench, events, args.tenants, args.keys).await?;
    bench.hook.call("drain-start").await?;

    let cpu = process_cpu();
    let t = Instant::now();
    let worker = bench.worker(|_: serde::de::IgnoredAny, _| async {});
    let mut halfway = None;
    loop {
        let done = worker.stats().done;
        if halfway.is_none() && done * 2 >= events {
            halfway = Some(bench.hook.spawn("mid-drain"));
        }
        if done >= events {
            break;
        }
        if t.elapsed() > timeout {
            worker.shutdown(Duration::ZERO).await;
            return Err(BenchError::Failed(format!(
                "the drain did not finish in {} s: {done} of {events} events ran",
                timeout.as_secs_f64()
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seconds = t.elapsed().as_secs_f64();
    let cpu = cpu_ms(cpu, process_cpu());
    // What the mid-drain hook started (the mid-analyze case's ANALYZE)
    // ends inside the timed phases, so that the readings at drain-end hold
    // all of its CPU, which the report takes off whole.
    Hook::finish(halfway.flatten(), "mid-drain").await?;
    bench.hook.call("drain-end").await?;
    worker.shutdown(Duration::from_secs(5)).await;

    // Every runnable event gone, every backlog event still stored.
    let left = bench.stored().await?;
    if left != args.backlog {
        return Err(BenchError::Failed(format!(
            "after the drain the store holds {left} events, not the backlog's {}",
            args.backlog
        )));
    }
    let mut report = bench.report("drain");
    report.events = Some(events);
    report.backlog = Some(args.backlog);
    report.backlog_kind = (args.backlog > 0).then(|| args.backlog_kind.clone());
    report.seconds = Some(seconds);
    report.events_per_s = Some(events as f64 / seconds);
    report.process_cpu_ms = Some(cpu);
    report.knobs.insert("tenants".into(), json!(args.tenants));
    if args.keys > 0 {
        report.knobs.insert("keys".into(), json!(args.keys));
        report.knobs.insert(
            "key_scopes".into(),
            json!(lcm(args.tenants.max(1), args.keys)),
        );
    }
    if let Some(n) = args.limit_running {
        report.knobs.insert("limit_running".into(), json!(n));
    }
    if let Some(n) = args.limit_per_key {
        report.knobs.insert("limit_per_key".into(), json!(n));
    }
    if args.backlog > 0 && args.backlog_kind == "paused" {
        report
            .knobs
            .insert("backlog_tenants".into(), json!(args.backlog_tenants));
    }
    bench.close().await?;
    Ok(report)
}

/// Sets the drain's concurrency limits on [`HANDLER`] (`--limit-running`,
/// `--limit-per-key`), if any.
async fn set_limits(bench: &Bench, args: &Args) -> Result<(), BenchError> {
    if args.limit_per_key.is_some() && args.keys == 0 {
        return Err(BenchError::Usage(
            "--limit-per-key limits events with a concurrency key: give them some with --keys"
                .into(),
        ));
    }
    let limits = [
        args.limit_running
            .map(|running| Limit::running(HANDLER, LimitScope::Handler, running)),
        args.limit_per_key
            .map(|running| Limit::running(HANDLER, LimitScope::Key { key: None }, running)),
    ];
    for limit in limits.into_iter().flatten() {
        limit
            .check()
            .map_err(|e| BenchError::Usage(format!("{limit:?}: {e}")))?;
        bench.client.set_limit(&limit).await?;
    }
    Ok(())
}

/// Emits `events` runnable events `{"seq": N}` in batches, spread over
/// `tenants` and, when `keys` is not 0, carrying the concurrency keys `k0`
/// … `k{keys-1}` round robin (untimed preparation).
pub(super) async fn store_runnable(
    bench: &Bench,
    events: u64,
    tenants: u64,
    keys: u64,
) -> Result<(), BenchError> {
    for start in (0..events).step_by(CHUNK as usize) {
        let n = CHUNK.min(events - start);
        let batch = (start..start + n)
            .map(|seq| {
                let mut options = EmitOptions::default();
                if keys > 0 {
                    options = options.concurrency_key(format!("k{}", seq % keys));
                }
                EmitRequest {
                    tenant: format!("tenant-{}", seq % tenants.max(1)),
                    handler: HANDLER.into(),
                    payload: format!(r#"{{"seq":{seq}}}"#),
                    options,
                }
            })
            .collect();
        bench.client.emit_batch(batch).await?;
    }
    Ok(())
}

/// Stores the backlog straight into the store (no notifications).
async fn store_backlog(bench: &Bench, args: &Args) -> Result<(), BenchError> {
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
    for start in (0..args.backlog).step_by(CHUNK as usize) {
        let n = CHUNK.min(args.backlog - start);
        let batch: Vec<NewEvent> = (start..start + n)
            .map(|i| NewEvent {
                singleton: None,
                concurrency_key: None,
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
    }
    Ok(())
}

/// Parks the paused backlog as the reconciler's sweeps would have done
/// long before, in the steady state this case stands for (a notification
/// of a held event is acked and the next sweep parks the event): sweep
/// passes with no quiet period until one finds nothing. Untimed, between
/// the `after-backlog` and `backlog-parked` phases, so that the hook can
/// measure the one-time cost of parking apart from the drain.
async fn park_backlog(bench: &Bench) -> Result<(), BenchError> {
    /// Notifications per sweep call; a call parks up to 16 times as many.
    const LIMIT: usize = 1000;
    let mut pass = None;
    loop {
        let page = bench.store.sweep(Duration::ZERO, pass, LIMIT).await?;
        if !page.due.is_empty() {
            return Err(BenchError::Failed(format!(
                "parking the paused backlog: the sweep found {} events to notify, \
                 but only paused events are stored yet",
                page.due.len()
            )));
        }
        if page.complete {
            break;
        }
        pass = Some(page.pass);
    }
    Ok(())
}

/// The least common multiple: the tenant-key pairs that `b` keys round
/// robin over `a` tenants round robin make.
fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}
