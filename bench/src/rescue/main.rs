//! Rescue time after SIGKILL, on PostgreSQL + NATS JetStream with real
//! `herald serve` worker processes: how long after a worker dies do its
//! events start again on another worker?
//!
//! `cargo build --release -p herald-server -p herald-bench`, then
//!
//! `$CARGO_TARGET_DIR/release/rescue --kills 20 --lease-secs 3` (or `bench/rescue.sh`)
//!
//! # The setup
//!
//! A fresh schema (migrated with `herald migrate`) and NATS stream; three
//! workers (`--workers`), each with its own `herald.toml` that differs only
//! in the URL of its webhook handler `hold`: worker `wN` posts to
//! `/run/wN` on an HTTP server inside this program, so every request says
//! which process ran the event (`Herald-Event-Id` says which event).
//! `worker.lease` is `--lease-secs` (3 s); `sweep_quiet` is an hour, so the
//! reconciler re-notifies no event for being quiet (see below for what it
//! still does).
//!
//! # A round
//!
//! 1. Emit `--events-per-round` (6) events through the library. The first
//!    run of each event is held: its webhook request gets no answer yet.
//!    Later runs are answered 200 at once.
//! 2. When all have started, wait `--kill-delay-ms` (default: random, up to
//!    one lease, so that kills land at every phase of the heartbeat), then
//!    SIGKILL the worker holding the most of them; the kill instant is taken
//!    just before the signal. The store is asked when each of its events'
//!    leases lapses ("lease left").
//! 3. For each of the killed worker's events, the instant its next run's
//!    request arrives (from another worker) gives its rescue time.
//! 4. Release the held requests, wait until the store holds none of the
//!    round's events, and start the killed worker again (a fresh process,
//!    same config); wait for it to listen.
//!
//! # What determines the rescue time
//!
//! The dead worker's notifications are unacknowledged NATS deliveries. The
//! consumer's `AckWait` equals the lease, and it restarts with every
//! in-progress ack, which the heartbeat sends every `lease / 3` right after
//! renewing the PostgreSQL leases (to now + lease). So:
//!
//! - an event whose lease was renewed before the kill is redelivered
//!   `lease` after the last in-progress ack, just after its PostgreSQL lease
//!   lapsed; another worker claims it at once. Rescue = the lease left at
//!   the kill, between `lease - lease/3` and `lease`, plus the claim;
//! - an event killed before its first renewal is redelivered `lease` after
//!   its first delivery, a few milliseconds before its PostgreSQL lease
//!   (taken at the claim, after the delivery) lapses. The claim then finds
//!   a live lease, and the worker naks the notification until the lease's
//!   expiry plus a random 0 to 1 s (`Policy::lease_jitter`). Rescue = the
//!   lease left, plus up to 1 s.
//!
//! The expected bound is therefore `lease + max(lease/3, 1 s)`: 4 s for a
//! 3 s lease. The program prints the figures against it, and "rescue minus
//! lease left": the delay herald adds after the lease has lapsed.
//!
//! The reconciler is a second path: at each sweep (every `sweep_every`,
//! 5 s) the elected worker re-notifies pending events whose lease lapsed
//! after their last notification, whatever `sweep_quiet` is. It only wins
//! when NATS is late. `--no-reconcile` turns it off on every worker, to see
//! NATS alone.
//!
//! NATS server 2.9 is late now and then: a dead worker's pull request
//! (`batch 1, expires 5s`, see herald-nats) stays in the consumer's waiting
//! queue after the kill; when a redelivery is offered to it, the server
//! sends the next message a second time (delivery count 1) instead, and
//! redelivers the skipped one only one `AckWait` later. Fixed in
//! nats-server by nats-io/nats-server#5305 and #5338 (2024); 2.9.10 has it.
//! Such an event is rescued by the next sweep or after `2 × lease`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use clap::Parser;
use herald::{Client, Millis};
use herald_bench::fleet::{self, quantile, Scratch, Worker};
use rand::Rng;
use tokio::sync::watch;

mod front;
mod hook;

use front::Front;
use hook::{run, App, Log};

#[derive(Parser)]
struct Args {
    /// The `herald` binary (default: $CARGO_TARGET_DIR/release/herald).
    #[arg(long)]
    herald: Option<PathBuf>,
    /// The PostgreSQL database (a scratch schema is made in it).
    #[arg(long, default_value = fleet::DEFAULT_STORE)]
    store: String,
    /// The fleet's queue: `nats` or `pubsub`.
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
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// `worker.lease` in seconds (also the NATS consumer's AckWait);
    /// default: herald's own default lease.
    #[arg(long)]
    lease_secs: Option<u64>,
    /// `fleet`: `--workers` processes on PostgreSQL + NATS, the one holding
    /// the most events is killed and the others rescue them. `restart`: one
    /// process with the in-process queue, killed and started again at once
    /// on the same address (the embedded deployment, on `--store`).
    #[arg(long, default_value = "fleet")]
    shape: Shape,
    /// For `--shape restart`: store the events in SQLite (a file in the
    /// scratch directory) instead of `--store`.
    #[arg(long)]
    sqlite: bool,
    /// Rounds, each with one SIGKILL.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Events emitted per round.
    #[arg(long, default_value_t = 6)]
    events_per_round: usize,
    /// Milliseconds from "all started" to the kill (default: random, from
    /// 0 to one lease).
    #[arg(long)]
    kill_delay_ms: Option<u64>,
    /// Print each rescued event.
    #[arg(long)]
    verbose: bool,
    /// `worker.reconcile = false` on every worker: only NATS redelivery
    /// rescues events.
    #[arg(long)]
    no_reconcile: bool,
    /// `HERALD_LOG` for the workers.
    #[arg(long)]
    worker_log: Option<String>,
    /// Keep the configs and the workers' logs (their directory is printed).
    #[arg(long)]
    keep_logs: bool,
}

/// Which deployment is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    /// Several workers on PostgreSQL + NATS; one is killed.
    Fleet,
    /// One worker with the in-process queue, killed and restarted at once.
    Restart,
}

/// One rescued event.
struct Rescue {
    round: usize,
    event: String,
    /// From the kill to its next run's start.
    rescue: Duration,
    /// From its first run's start to the kill.
    age: Duration,
    /// Its lease's expiry minus the kill's wall-clock time (unknown when
    /// the store is read through the killed worker).
    lease_left_ms: Option<i64>,
    by: String,
}

/// Polls `check` every 5 ms until it is true; panics with `what` past `limit`.
async fn wait_for(limit: Duration, what: impl Fn() -> String, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > limit {
            panic!("{} (waited {limit:?})", what());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn secs(d: f64) -> String {
    format!("{d:.3}")
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    let restart = args.shape == Shape::Restart;
    let broker = fleet::Broker::choose(&args.queue, &args.nats, &args.pubsub);
    let workers_n = if restart { 1 } else { args.workers };
    assert!(restart || workers_n >= 2, "--workers must be at least 2");
    let herald = fleet::herald_binary(args.herald.clone());
    let default_lease = herald::WorkerConfig::default().lease;
    let lease = args.lease_secs.map_or(default_lease, Duration::from_secs);
    let heartbeat = lease / 3;
    let lease_jitter = herald::decision::Policy::default().lease_jitter;
    // Fleet: NATS redelivers after AckWait (= the lease) or a lost claim
    // waits up to the jitter. Restart: the lease lapses, and the restarted
    // process's reconciler sweeps at least every heartbeat.
    let bound = if restart {
        lease + heartbeat
    } else {
        lease + heartbeat.max(lease_jitter)
    };
    let store_label = if restart && args.sqlite {
        "sqlite".to_string()
    } else {
        "postgres".to_string()
    };
    println!(
        "rescue: shape {:?}, {} worker(s), store {}, queue {}, lease {:?}{} (heartbeat every {:?}), reconciler {}, {} kills, {} events per round, kill delay {}",
        args.shape,
        workers_n,
        store_label,
        if restart { "in-process" } else { broker.label() },
        lease,
        if args.lease_secs.is_none() { " (herald's default)" } else { "" },
        heartbeat,
        if args.no_reconcile { "off" } else { "on" },
        args.kills,
        args.events_per_round,
        match args.kill_delay_ms {
            Some(ms) => format!("{ms} ms"),
            None => format!("random from 0 to {lease:?}"),
        }
    );

    let app = Arc::new(App {
        log: Mutex::new(Log::default()),
        released: watch::channel(0).0,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the webhook server");
    let hooks = format!("http://{}", listener.local_addr().expect("its address"));
    let router = axum::Router::new()
        .route("/run/{worker}", post(run))
        .with_state(app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let mut scratch = Scratch::create(&herald, &args.store, &broker, "rescue").await;
    scratch.keep_dir = args.keep_logs;
    scratch
        .queue_keys
        .push(("pubsub_pull".into(), fleet::toml_string(&args.pubsub_pull)));
    let mut worker_keys: Vec<(&str, String)> = vec![
        // Re-notifying quiet events is not rescue.
        ("sweep_quiet", "\"1h\"".into()),
        ("reconcile", (!args.no_reconcile).to_string()),
    ];
    if let Some(l) = args.lease_secs {
        worker_keys.push(("lease", fleet::toml_string(&format!("{l}s"))));
    }
    let handler = |name: &str| {
        format!(
            "[handlers.hold]\nkind = \"webhook\"\nurl = {}\nsecret = \"bench\"\ntimeout = \"5m\"\n",
            fleet::toml_string(&format!("{hooks}/run/{name}"))
        )
    };
    let specs: Vec<_> = (1..=workers_n)
        .map(|i| {
            let name = format!("w{i}");
            let config = if restart {
                // A fixed address: the restarted process is the same worker.
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("a free port")
                    .port();
                let store = if args.sqlite {
                    format!(
                        "store = {}\n",
                        fleet::toml_string(&scratch.dir().join("herald.db").display().to_string())
                    )
                } else {
                    format!(
                        "store = {}\npg_schema = {}\n",
                        fleet::toml_string(&scratch.store_url),
                        fleet::toml_string(&scratch.name)
                    )
                };
                let mut text = format!(
                    "{store}queue = \"memory\"\nlisten = \"127.0.0.1:{port}\"\n\n[worker]\n"
                );
                for (k, v) in &worker_keys {
                    text.push_str(&format!("{k} = {v}\n"));
                }
                text.push('\n');
                text.push_str(&handler(&name));
                text
            } else {
                scratch.herald_toml(&worker_keys, &handler(&name))
            };
            let path = scratch.write(&format!("{name}.toml"), &config);
            let mut spec = scratch.worker(&herald, &name, &path, &[]);
            spec.log_level = args.worker_log.clone();
            spec
        })
        .collect();
    let start_limit = Duration::from_secs(30);
    let mut workers = Worker::start_all(&specs, start_limit).await;
    let front = if restart {
        Front::Api(reqwest::Client::new(), workers[0].base.clone())
    } else {
        let store = Arc::new(scratch.store(4).await);
        let queue = scratch.queue(lease).await.queue();
        Front::Library(Client::new(store, queue.clone()), queue)
    };

    let mut rescues: Vec<Rescue> = Vec::new();
    let mut per_kill_max: Vec<f64> = Vec::new();
    let rescue_limit = lease * 10 + Duration::from_secs(10);
    for round in 1..=args.kills {
        app.log.lock().expect("log lock").round = round;
        let ids = front.emit(round, args.events_per_round).await;
        let keys: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let started = |log: &Log| {
            keys.iter()
                .filter(|k| log.events.get(*k).is_some_and(|s| !s.runs.is_empty()))
                .count()
        };
        wait_for(
            Duration::from_secs(30),
            || {
                format!(
                    "round {round}: only {} of {} events started",
                    started(&app.log.lock().expect("log lock")),
                    keys.len()
                )
            },
            || started(&app.log.lock().expect("log lock")) == keys.len(),
        )
        .await;
        let delay = args
            .kill_delay_ms
            .map(Duration::from_millis)
            .unwrap_or_else(|| {
                Duration::from_millis(rand::thread_rng().gen_range(0..lease.as_millis() as u64))
            });
        tokio::time::sleep(delay).await;

        // The worker holding the most of the round's events.
        let mut held: HashMap<String, Vec<String>> = HashMap::new();
        {
            let log = app.log.lock().expect("log lock");
            for k in &keys {
                held.entry(log.events[k].runs[0].worker.clone())
                    .or_default()
                    .push(k.clone());
            }
        }
        let (victim, victim_events) = held
            .iter()
            .max_by_key(|(w, evs)| (evs.len(), std::cmp::Reverse((*w).clone())))
            .map(|(w, evs)| (w.clone(), evs.clone()))
            .expect("some events");
        let index = workers
            .iter()
            .position(|w| w.name() == victim)
            .expect("the victim is one of the workers");
        let expiries = front.lease_expiries(&victim_events).await;
        let kill_wall = Millis::now();
        let kill_at = workers[index].kill().await;
        if restart {
            let spec = workers[index].spec.clone();
            workers[index] = spec.spawn().listening(start_limit).await;
        }
        let lease_left: HashMap<String, Option<i64>> = victim_events
            .iter()
            .map(|k| (k.clone(), expiries.get(k).map(|e| e - kill_wall.0)))
            .collect();

        let rescued = |log: &Log| {
            victim_events
                .iter()
                .filter(|k| log.events[*k].runs.len() >= 2)
                .count()
        };
        wait_for(
            rescue_limit,
            || {
                let log = app.log.lock().expect("log lock");
                format!(
                    "round {round}: {} of the {} events of the killed worker {victim} started again; the workers' logs end:\n{}",
                    rescued(&log),
                    victim_events.len(),
                    workers
                        .iter()
                        .map(|w| format!("--- {} ---\n{}\n", w.name(), w.spec.log_tail(15)))
                        .collect::<String>()
                )
            },
            || rescued(&app.log.lock().expect("log lock")) == victim_events.len(),
        )
        .await;
        let mut round_max: f64 = 0.0;
        {
            let log = app.log.lock().expect("log lock");
            for k in &victim_events {
                let seen = &log.events[k];
                let (first, next) = (&seen.runs[0], &seen.runs[1]);
                if !restart {
                    assert_ne!(
                        next.worker, victim,
                        "event {k} ran again on the killed worker"
                    );
                }
                assert_ne!(next.token, first.token, "a new run has a new lease token");
                let r = Rescue {
                    round,
                    event: k.clone(),
                    rescue: next.at.saturating_duration_since(kill_at),
                    age: kill_at.saturating_duration_since(first.at),
                    lease_left_ms: lease_left[k],
                    by: next.worker.clone(),
                };
                round_max = round_max.max(r.rescue.as_secs_f64());
                if args.verbose {
                    println!(
                        "  round {} event {} ran {:.3}s on {victim} before the kill; lease left {}; rescued by {} after {:.3}s",
                        r.round,
                        r.event,
                        r.age.as_secs_f64(),
                        r.lease_left_ms
                            .map_or("unknown".to_string(), |ms| format!("{:.3}s", ms as f64 / 1000.0)),
                        r.by,
                        r.rescue.as_secs_f64()
                    );
                }
                rescues.push(r);
            }
        }
        per_kill_max.push(round_max);
        println!(
            "round {round}: killed {victim} holding {} of {} ({:.3}s after all started); its events ran again after at most {:.3}s",
            victim_events.len(),
            keys.len(),
            delay.as_secs_f64(),
            round_max
        );

        app.released.send_replace(round);
        let mut left = ids.clone();
        let done_start = Instant::now();
        while !left.is_empty() {
            let mut still = Vec::new();
            for id in left {
                if front.stored(id).await {
                    still.push(id);
                }
            }
            left = still;
            if done_start.elapsed() > Duration::from_secs(30) {
                panic!(
                    "round {round}: {} events not done 30 s after the release: {left:?}",
                    left.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        {
            let log = app.log.lock().expect("log lock");
            for k in &keys {
                let runs = log.events[k].runs.len();
                let want = if victim_events.contains(k) { 2 } else { 1 };
                assert_eq!(
                    runs, want,
                    "round {round}: event {k} ran {runs} times, expected {want}"
                );
            }
        }
        if !restart {
            let spec = workers[index].spec.clone();
            workers[index] = spec.spawn().listening(start_limit).await;
        }
        for w in workers.iter_mut() {
            w.check_alive(&format!("after round {round}"));
        }
    }

    let mut r: Vec<f64> = rescues.iter().map(|r| r.rescue.as_secs_f64()).collect();
    r.sort_by(f64::total_cmp);
    per_kill_max.sort_by(f64::total_cmp);
    let known: Vec<(f64, f64)> = rescues
        .iter()
        .filter_map(|r| Some((r.rescue.as_secs_f64(), r.lease_left_ms? as f64 / 1000.0)))
        .collect();
    let mut over: Vec<f64> = known.iter().map(|(r, l)| r - l).collect();
    over.sort_by(f64::total_cmp);
    let mut left: Vec<f64> = known.iter().map(|(_, l)| *l).collect();
    left.sort_by(f64::total_cmp);
    let lease_figures = if known.is_empty() {
        "lease_left_at_kill_s: unknown (the store is read through the killed worker)".to_string()
    } else {
        format!(
            "lease_left_at_kill_s: min={} median={} max={} rescue_minus_lease_left_s: min={} median={} p90={} max={}",
            secs(quantile(&left, 0.0)),
            secs(quantile(&left, 0.5)),
            secs(quantile(&left, 1.0)),
            secs(quantile(&over, 0.0)),
            secs(quantile(&over, 0.5)),
            secs(quantile(&over, 0.9)),
            secs(quantile(&over, 1.0)),
        )
    };
    println!(
        "rescue shape={:?} store={} workers={} lease_s={} reconcile={} kills={} events={} rescue_s: min={} median={} p90={} max={} per_kill_max_s: median={} max={} {} bound_s={} over_bound={}",
        args.shape,
        store_label,
        workers_n,
        lease.as_secs_f64(),
        !args.no_reconcile,
        args.kills,
        r.len(),
        secs(quantile(&r, 0.0)),
        secs(quantile(&r, 0.5)),
        secs(quantile(&r, 0.9)),
        secs(quantile(&r, 1.0)),
        secs(quantile(&per_kill_max, 0.5)),
        secs(quantile(&per_kill_max, 1.0)),
        lease_figures,
        secs(bound.as_secs_f64()),
        r.iter().filter(|s| **s > bound.as_secs_f64()).count(),
    );
    if let Front::Library(_, queue) = &front {
        queue.close().await;
    }
    for w in workers.iter_mut() {
        w.kill().await;
    }
    drop(workers);
    drop(scratch);
}
