//! No-op drain by a fleet of real `herald serve` worker processes on
//! PostgreSQL + NATS JetStream (or, with `--queue pubsub`, the Pub/Sub
//! emulator): emit E events (not timed) while no worker runs, then start N
//! workers and time until every event is done.
//!
//! `cargo build --release -p herald-server -p herald-bench`, then
//!
//! `$CARGO_TARGET_DIR/release/fleet-drain --workers 3 --events 200000 --pg-cpu ../shared/tools/pg-cpu`
//!
//! (`bench/fleet-drain.sh` runs 1, 2 and 3 workers, three times each, and
//! prints the medians.)
//!
//! Each run gets a fresh schema, migrated with `herald migrate`, and a
//! fresh NATS stream; both are removed at the end. The events are emitted
//! through the library (a `herald::Client` on a `PgStore` and a `NatsQueue`
//! on the same schema and stream) for a handler `noop`, which every worker
//! registers with `--noop-handler noop`. The stream must hold one
//! notification per event before the workers start (NATS; the emulator
//! can't say how many messages it holds). On Pub/Sub the workers'
//! `pubsub_max_outstanding` is `concurrency + batch`, what a worker can
//! hold at once.
//!
//! The workers share one `herald.toml`: `[worker] concurrency` and `batch`
//! from the flags (1024 and 512, as the in-process `drain`), the lease
//! (default 30 s, also the consumer's `AckWait`), and `sweep_quiet = "1h"`:
//! the reconciler re-notifies only events not notified for an hour, so the
//! NATS notifications alone drive the workers.
//!
//! What is timed: from spawning the N processes until the sum of their
//! `herald_events_done_total` (read from each worker's `/metrics` every
//! 20 ms, which costs PostgreSQL nothing) reaches E; the store is then
//! checked to hold none of the events. Printed: `drain_s` and `events_per_s`
//! over that whole time; `startup_s`, from the spawn to the last worker's
//! "listening on" line; `steady_events_per_s`, the events done after the
//! last worker listened over the time after it; `max_unacked`, the most
//! notifications delivered and not yet acked (sampled from the consumer
//! every 500 ms); `lease_renewals`, from the workers' `/metrics`. With `--pg-cpu` the
//! PostgreSQL server's CPU during the drain (the whole server: anything
//! else using it is counted too), per 1,000 events; also the workers' own
//! CPU, the broker's (with `--broker-pid`), how busy the machine's
//! cores were, and the load average before the drain (other work on the
//! machine skews every figure).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use herald::{Client, EmitOptions, EmitRequest};
use herald_bench::cpu;
use herald_bench::fleet::{self, Scratch, Worker};

#[derive(Parser)]
struct Args {
    /// The `herald` binary (default: $CARGO_TARGET_DIR/release/herald).
    #[arg(long)]
    herald: Option<PathBuf>,
    /// The PostgreSQL database (a scratch schema is made in it).
    #[arg(long, default_value = fleet::DEFAULT_STORE)]
    store: String,
    /// The queue: `nats` or `pubsub`.
    #[arg(long, default_value = "nats")]
    queue: String,
    /// The NATS server (a scratch stream is made on it).
    #[arg(long, default_value = fleet::DEFAULT_NATS)]
    nats: String,
    /// The Pub/Sub emulator, `HOST:PORT` (a scratch topic is made on it).
    #[arg(long, default_value = fleet::DEFAULT_PUBSUB)]
    pubsub: String,
    /// The workers' `pubsub_pull`: `unary` or `streaming`. Unary by
    /// default: this bench runs on the emulator, which ignores a stream's
    /// flow control and keeps feeding a killed worker's stream
    /// (docs/pubsub.md); `streaming` measures that path anyway.
    #[arg(long, default_value = "unary")]
    pubsub_pull: String,
    /// `herald serve` worker processes.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Events to drain.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// `worker.concurrency` of each worker.
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
    /// `worker.batch` of each worker.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// `worker.lease` in seconds (also the NATS consumer's AckWait).
    #[arg(long, default_value_t = 30)]
    lease_secs: u64,
    /// Most events per notification, for the emitter and the workers
    /// (`notify_max_ids`; 1 is one message per event, as before batched
    /// notifications). Default: herald's.
    #[arg(long)]
    notify_max_ids: Option<usize>,
    /// Events per emit batch.
    #[arg(long, default_value_t = 1000)]
    emit_batch: usize,
    /// Emit batches in flight at once.
    #[arg(long, default_value_t = 4)]
    emitters: usize,
    /// Give up (and fail) if the drain takes longer than this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// The `pg-cpu` tool: measure PostgreSQL's CPU time during the drain.
    #[arg(long)]
    pg_cpu: Option<PathBuf>,
    /// The broker's process id (nats-server, or the emulator's java):
    /// measure its CPU time during the drain.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// `HERALD_LOG` for the workers.
    #[arg(long)]
    worker_log: Option<String>,
    /// Keep the config and the workers' logs (their directory is printed).
    #[arg(long)]
    keep_logs: bool,
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    assert!(args.workers >= 1, "--workers must be at least 1");
    let herald = fleet::herald_binary(args.herald.clone());
    let lease = Duration::from_secs(args.lease_secs);
    let broker = fleet::Broker::choose(&args.queue, &args.nats, &args.pubsub);
    let mut scratch = Scratch::create(&herald, &args.store, &broker, "drain").await;
    scratch.keep_dir = args.keep_logs;
    scratch.queue_keys.push((
        "pubsub_max_outstanding".into(),
        (args.concurrency + args.batch).to_string(),
    ));
    scratch
        .queue_keys
        .push(("pubsub_pull".into(), fleet::toml_string(&args.pubsub_pull)));
    let store = Arc::new(scratch.store(8).await);
    let mut limits = herald::MessageLimits::default();
    if let Some(ids) = args.notify_max_ids {
        limits.ids = ids;
        scratch
            .queue_keys
            .push(("notify_max_ids".into(), ids.to_string()));
    }
    let bench_queue = scratch.queue_with(lease, limits).await;
    let queue = bench_queue.queue();
    let client = Client::new(store.clone(), queue.clone());

    // Emit (not timed), several batches at once: each batch's notifications
    // are published one by one, each waiting for the server's ack.
    let t = Instant::now();
    let mut starts = (0..args.events).step_by(args.emit_batch.max(1));
    let mut inflight = tokio::task::JoinSet::new();
    loop {
        while inflight.len() < args.emitters.max(1) {
            let Some(from) = starts.next() else { break };
            let to = (from + args.emit_batch).min(args.events);
            let client = client.clone();
            inflight.spawn(async move {
                let batch: Vec<EmitRequest> = (from..to)
                    .map(|i| EmitRequest {
                        tenant: format!("tenant-{}", i % 16),
                        handler: "noop".into(),
                        payload: format!(r#"{{"i":{i}}}"#),
                        options: EmitOptions::default(),
                    })
                    .collect();
                client.emit_batch(batch).await.expect("emit");
            });
        }
        match inflight.join_next().await {
            Some(r) => r.expect("an emit task"),
            None => break,
        }
    }
    let emit_s = t.elapsed().as_secs_f64();
    // Messages on the stream before the drain: one per event, or fewer
    // where notifications name several events (at most 64 each by default).
    let messages = bench_queue.waiting().await;
    if let Some(n) = messages {
        let least = (args.events as u64).div_ceil(herald::MessageLimits::default().ids as u64);
        assert!(
            (least..=args.events as u64).contains(&n),
            "the stream must hold the notifications of every event before the drain: {n} messages for {} events",
            args.events
        );
    }
    // Start from a vacuumed, analyzed table, as the in-process drain does.
    sqlx::raw_sql(&format!("VACUUM (ANALYZE) \"{}\".events", scratch.name))
        .execute(store.pool())
        .await
        .expect("vacuum the events table");

    let config = scratch.herald_toml(
        &[
            ("concurrency", args.concurrency.to_string()),
            ("batch", args.batch.to_string()),
            (
                "lease",
                fleet::toml_string(&format!("{}s", args.lease_secs)),
            ),
            // Only the queue's notifications drive the workers.
            ("sweep_quiet", "\"1h\"".into()),
        ],
        "",
    );
    let config_path = scratch.write("herald.toml", &config);
    let specs: Vec<_> = (1..=args.workers)
        .map(|i| {
            let mut s = scratch.worker(
                &herald,
                &format!("w{i}"),
                &config_path,
                &["--noop-handler", "noop"],
            );
            s.log_level = args.worker_log.clone();
            s
        })
        .collect();
    let http = reqwest::Client::new();

    let load = cpu::load_average().unwrap_or(f64::NAN);
    let pg_before = cpu::pg_ticks(args.pg_cpu.as_deref());
    let broker_before = args
        .broker_pid
        .and_then(|p| cpu::process_ticks(&p.to_string()));
    let machine_before = cpu::machine_ticks();
    let t0 = Instant::now();
    let mut workers = Worker::start_all(&specs, Duration::from_secs(60)).await;
    let listening = workers
        .iter()
        .map(|w| w.listening_at)
        .max()
        .expect("at least one worker");
    let startup = listening - t0;
    let done_at_listening = total_done(&workers, &http).await.0;
    let limit = Duration::from_secs(args.timeout_secs);
    // Notifications delivered and not yet acked, sampled every 500 ms: runs
    // claimed (or about to be) and not yet settled and acked.
    let mut max_unacked: Option<usize> = None;
    let mut sampled = Instant::now();
    let (done, per_worker) = loop {
        if sampled.elapsed() >= Duration::from_millis(500) {
            sampled = Instant::now();
            if let Some(n) = bench_queue.unacked().await {
                max_unacked = Some(max_unacked.unwrap_or(0).max(n));
            }
        }
        let (done, per_worker) = total_done(&workers, &http).await;
        if done >= args.events as u64 {
            break (done, per_worker);
        }
        if t0.elapsed() > limit {
            let logs: String = workers
                .iter()
                .map(|w| format!("--- {} ---\n{}\n", w.name(), w.spec.log_tail(15)))
                .collect();
            panic!(
                "the drain did not finish within {limit:?}: {done} of {} done ({per_worker:?}); logs:\n{logs}",
                args.events
            );
        }
        for w in workers.iter_mut() {
            w.check_alive("during the drain");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drain = t0.elapsed();
    let pg_after = cpu::pg_ticks(args.pg_cpu.as_deref());
    let broker_after = args
        .broker_pid
        .and_then(|p| cpu::process_ticks(&p.to_string()));
    let machine_after = cpu::machine_ticks();
    let workers_ticks: Option<u64> = workers.iter().map(|w| w.cpu_ticks()).sum();
    let mut renewals = 0;
    for w in &workers {
        renewals += w
            .metric(&http, "herald_lease_renewals_total")
            .await
            .unwrap_or_else(|e| panic!("read {}'s /metrics: {e}", w.name()));
    }
    for w in workers.iter_mut() {
        w.kill().await;
    }

    let left: u64 = client
        .handler_counts(&herald::CountsQuery::totals())
        .await
        .expect("counts")
        .iter()
        .filter(|c| c.handler == "noop")
        .map(|c| c.total())
        .sum();
    assert_eq!(
        left, 0,
        "every event must be done (and deleted) after the drain; {done} runs were counted done"
    );

    let per_1000 = |ms: Option<u64>, what: &str| match ms {
        Some(ms) => format!(
            " {what}_cpu_ms={ms} {what}_cpu_ms_per_1000={:.1}",
            ms as f64 * 1000.0 / args.events as f64
        ),
        None => String::new(),
    };
    let busy = match (machine_before, machine_after) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => format!(
            " machine_busy_pct={:.0}",
            (b1 - b0) as f64 * 100.0 / (t1 - t0) as f64
        ),
        _ => String::new(),
    };
    let after_listening = (drain - startup).as_secs_f64();
    println!(
        "fleet-drain queue={} workers={} events={} concurrency={} batch={} lease_s={} emit_s={:.1} startup_s={:.3} drain_s={:.3} events_per_s={:.0} steady_events_per_s={:.0} done_per_worker={} max_unacked={} lease_renewals={renewals} messages={}{}{}{}{} load_before={load:.1}",
        broker.label(),
        args.workers,
        args.events,
        args.concurrency,
        args.batch,
        args.lease_secs,
        emit_s,
        startup.as_secs_f64(),
        drain.as_secs_f64(),
        args.events as f64 / drain.as_secs_f64(),
        (args.events as u64).saturating_sub(done_at_listening) as f64 / after_listening,
        per_worker
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("/"),
        max_unacked.map_or("-".to_string(), |n| n.to_string()),
        messages.map_or("-".to_string(), |n| n.to_string()),
        per_1000(cpu::ms_between(pg_before, pg_after), "pg"),
        per_1000(workers_ticks.map(|t| t * 1000 / cpu::ticks_per_second()), "workers"),
        per_1000(cpu::ms_between(broker_before, broker_after), "broker"),
        busy,
    );
    queue.close().await;
    drop(workers);
    drop(scratch);
}

/// Done runs over all workers, and per worker.
async fn total_done(workers: &[Worker], http: &reqwest::Client) -> (u64, Vec<u64>) {
    let mut per = Vec::with_capacity(workers.len());
    for w in workers {
        let d = w
            .done(http)
            .await
            .unwrap_or_else(|e| panic!("read {}'s /metrics: {e}", w.name()));
        per.push(d);
    }
    (per.iter().sum(), per)
}
