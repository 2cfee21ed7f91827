//! The chaos soak: `herald serve` processes running command handlers that
//! write a ledger, a producer emitting over HTTP with idempotency keys,
//! and faults at random (seeded) — SIGKILL (also at a handler's spawn),
//! SIGSTOP past the lease, NATS restarts, PostgreSQL crashes and
//! terminated backends, pause/block storms, garbage and forged
//! notifications. At the end, the invariants of docs/semantics.md and
//! docs/handlers.md are checked against the ledger and the store.
//!
//! Run it with `bench/chaos.sh`, which builds herald, starts the private
//! PostgreSQL cluster (and the Pub/Sub emulator) and cleans up on every
//! exit path. The ledger, the configs and the servers' logs stay in the
//! work directory.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use herald_bench::fleet::{self, Broker, Scratch, WorkerSpec};

mod deployment;
mod faults;
mod invariants;
mod ledger;
mod producer;
mod report;
mod servers;
mod services;

use faults::Chaos;
use invariants::{Evidence, FinalEvent};
use ledger::Ledger;
use servers::Servers;
use services::{Nats, Pg};

/// Seconds since the Unix epoch, as the handler script's `$EPOCHREALTIME`.
pub(crate) fn wall() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

#[derive(Parser)]
#[command(args_override_self = true)]
struct Args {
    /// The `herald` binary.
    #[arg(long)]
    herald: Option<PathBuf>,
    /// `postgres` (a fleet on the private cluster) or `sqlite` (one
    /// embedded server with the in-process queue).
    #[arg(long, default_value = "postgres")]
    store: String,
    /// The fleet's queue: `nats` (a private nats-server) or `pubsub`.
    #[arg(long, default_value = "nats")]
    queue: String,
    /// The private cluster's URL (`postgres://postgres@127.0.0.1:PORT/postgres`).
    #[arg(long)]
    pg_url: Option<String>,
    /// The cluster's data directory (for `pg_ctl`).
    #[arg(long)]
    pg_data: Option<PathBuf>,
    /// PostgreSQL's binaries.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pg_bin: PathBuf,
    /// The private nats-server's port.
    #[arg(long, default_value_t = 14222)]
    nats_port: u16,
    /// The Pub/Sub emulator, `HOST:PORT`.
    #[arg(long, default_value = fleet::DEFAULT_PUBSUB)]
    pubsub: String,
    /// Where the ledger, configs, logs and the pid file go.
    #[arg(long)]
    workdir: PathBuf,
    /// Events the producer emits.
    #[arg(long, default_value_t = 2500)]
    events: usize,
    /// Seconds of faults (the producer spreads its events over 90 % of it).
    #[arg(long, default_value_t = 240)]
    fault_secs: u64,
    /// The longest wait for quiescence after the faults.
    #[arg(long, default_value_t = 90)]
    settle_secs: u64,
    /// The seed of every random choice (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// `worker.lease` in seconds.
    #[arg(long, default_value_t = 3)]
    lease_secs: u64,
    /// `herald serve` processes (1 with `--store sqlite`).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Concurrent emit requests.
    #[arg(long, default_value_t = 8)]
    emitters: usize,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Every pending and dead event of the soak's tenants, through the API.
async fn list_events(http: &reqwest::Client, base: &str) -> Result<Vec<FinalEvent>, String> {
    let mut out = Vec::new();
    for tenant in [deployment::TENANT, deployment::STORM_TENANT] {
        for state in ["pending", "dead"] {
            let mut after: Option<String> = None;
            loop {
                let mut url = format!("{base}/v1/events?tenant={tenant}&state={state}&limit=1000");
                if let Some(a) = &after {
                    url.push_str(&format!("&after={a}"));
                }
                let body: serde_json::Value = http
                    .get(&url)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .map_err(|e| format!("GET {url}: {e}"))?
                    .json()
                    .await
                    .map_err(|e| format!("GET {url}: {e}"))?;
                for e in body["events"].as_array().into_iter().flatten() {
                    out.push(FinalEvent {
                        id: e["id"].as_str().unwrap_or_default().to_string(),
                        handler: e["handler"].as_str().unwrap_or_default().to_string(),
                        state: e["state"].as_str().unwrap_or(state).to_string(),
                        attempt: e["attempt"].as_u64().unwrap_or(0) as u32,
                        max_attempts: e["max_attempts"].as_u64().unwrap_or(0) as u32,
                    });
                }
                match body["next"].as_str() {
                    Some(n) => after = Some(n.to_string()),
                    None => break,
                }
            }
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    let seed = args
        .seed
        .unwrap_or_else(|| wall().to_bits() % 1_000_000_007);
    let sqlite = args.store == "sqlite";
    let herald = fleet::herald_binary(args.herald.clone());
    let lease = args.lease_secs as f64;
    let workdir = args.workdir.clone();
    std::fs::create_dir_all(&workdir).expect("the work directory");
    let pidfile = workdir.join("pids");
    let ledger_path = workdir.join("ledger");
    let script = deployment::write_script(&workdir, &ledger_path);
    let handlers = deployment::handler_tables(&script, &ledger_path);
    let worker_keys = deployment::worker_keys(args.lease_secs);
    println!(
        "chaos: seed {seed}, store {}, queue {}, lease {} s, {} events over {} s of faults, work directory {}",
        args.store,
        if sqlite { "in-process" } else { &args.queue },
        args.lease_secs,
        args.events,
        args.fault_secs,
        workdir.display()
    );

    // The deployment.
    let mut nats = None;
    let mut scratch = None;
    let mut pg = None;
    let specs: Vec<WorkerSpec> = if sqlite {
        let config = format!(
            "store = {}\nqueue = \"memory\"\nlisten = \"127.0.0.1:{}\"\n\n[worker]\n{}\n{handlers}",
            fleet::toml_string(&workdir.join("herald.db").display().to_string()),
            free_port(),
            worker_keys
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect::<String>()
        );
        let path = workdir.join("s1.toml");
        std::fs::write(&path, config).expect("write the config");
        vec![WorkerSpec::new(
            "s1",
            &herald,
            &path,
            &workdir.join("s1.log"),
        )]
    } else {
        let pg_url = args.pg_url.clone().expect("--pg-url");
        pg = Some(Pg::new(
            args.pg_bin.clone(),
            args.pg_data.clone().expect("--pg-data"),
            pg_url.clone(),
        ));
        let broker = if args.queue == "nats" {
            let n = Nats::start(
                args.nats_port,
                workdir.join("nats-store"),
                workdir.join("nats.log"),
                pidfile.clone(),
            )
            .await;
            let url = n.url();
            nats = Some(n);
            Broker::Nats(url)
        } else {
            Broker::Pubsub(args.pubsub.clone())
        };
        let mut s = Scratch::create(&herald, &pg_url, &broker, "chaos").await;
        // The emulator serves unary pulls (docs/pubsub.md).
        s.queue_keys
            .push(("pubsub_pull".into(), "\"unary\"".into()));
        let config = s.herald_toml(&worker_keys, &handlers);
        let specs = (1..=args.workers)
            .map(|i| {
                let name = format!("s{i}");
                let path = workdir.join(format!("{name}.toml"));
                std::fs::write(&path, &config).expect("write the config");
                let mut spec =
                    WorkerSpec::new(&name, &herald, &path, &workdir.join(format!("{name}.log")));
                if let Broker::Pubsub(host) = &broker {
                    spec.env.push(("PUBSUB_EMULATOR_HOST".into(), host.clone()));
                }
                spec
            })
            .collect();
        scratch = Some(s);
        specs
    };
    // The queue for forged notifications (the broker's, not the servers').
    let queue = match &scratch {
        Some(s) => Some(s.queue(Duration::from_secs(args.lease_secs)).await),
        None => None,
    };

    let mut servers = Servers::new(specs, pidfile.clone());
    for slot in 0..servers.len() {
        servers.start(slot).await;
    }
    let bases = servers.bases.clone();

    // The ledger, read as it grows.
    let ledger = Arc::new(Mutex::new(Ledger::new(ledger_path.clone())));
    let tail = {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            loop {
                ledger.lock().expect("ledger").poll(wall());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let plan = producer::plan(args.events, seed);
    let produce_secs = args.fault_secs as f64 * 0.9;
    let producer = tokio::spawn(producer::run(
        plan,
        produce_secs,
        args.emitters,
        bases.clone(),
        seed,
    ));

    let mut chaos = Chaos::new(
        servers,
        pg,
        nats,
        queue,
        ledger.clone(),
        lease,
        sqlite,
        seed,
    );
    let started = wall();
    chaos.run_until(started + args.fault_secs as f64).await;
    chaos.heal().await;
    println!(
        "faults done after {:.0} s: {} injected; waiting for the producer and quiescence",
        wall() - started,
        chaos.faults.len()
    );

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client");
    let any_base = || {
        bases
            .read()
            .expect("bases")
            .iter()
            .flatten()
            .next()
            .cloned()
            .expect("a server is up")
    };
    // The schedule keeps emitting: pause it so that quiescence comes.
    let _ = http
        .post(format!(
            "{}/v1/tenants/{}/schedules/{}/pause",
            any_base(),
            deployment::TENANT,
            deployment::SCHEDULE
        ))
        .send()
        .await;
    let produced = producer.await.expect("the producer");
    let settle_from = wall();
    let mut notes = Vec::new();
    loop {
        chaos.servers.reap_and_restart().await;
        let pending = list_events(&http, &any_base())
            .await
            .map(|evs| evs.iter().filter(|e| e.state == "pending").count());
        let live = ledger.lock().expect("ledger").live_count();
        if pending == Ok(0) && live == 0 {
            notes.push(format!(
                "quiet {:.0} s after the faults",
                wall() - settle_from
            ));
            break;
        }
        if wall() - settle_from > args.settle_secs as f64 {
            notes.push(format!(
                "not quiet {} s after the faults: {pending:?} pending, {live} runs going",
                args.settle_secs
            ));
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let final_events = match list_events(&http, &any_base()).await {
        Ok(e) => e,
        Err(e) => {
            notes.push(format!("final listing failed: {e}"));
            Vec::new()
        }
    };

    chaos.servers.kill_all().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tail.abort();
    let ledger = {
        let mut l = ledger.lock().expect("ledger");
        l.poll(wall());
        std::mem::replace(&mut *l, Ledger::new(ledger_path.clone()))
    };
    let leftover = ledger.live_pids();
    for pid in &leftover {
        services::signal(*pid, "KILL");
    }
    if !ledger.bad_lines.is_empty() {
        notes.push(format!(
            "{} unreadable ledger lines, first: {:?}",
            ledger.bad_lines.len(),
            ledger.bad_lines.first()
        ));
    }
    let integrity = sqlite.then(
        || match rusqlite::Connection::open(workdir.join("herald.db")) {
            Ok(c) => c
                .prepare("PRAGMA integrity_check")
                .and_then(|mut s| {
                    s.query_map([], |r| r.get::<_, String>(0))
                        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                })
                .map(|rows| rows.join("; "))
                .unwrap_or_else(|e| format!("integrity_check failed: {e}")),
            Err(e) => format!("cannot open the database: {e}"),
        },
    );
    let acked = produced
        .events
        .iter()
        .filter(|e| !e.acks.is_empty())
        .count();
    notes.push(format!(
        "producer: {} of {} events acknowledged, {} requests ({} not 2xx); {} runs in the ledger; {} scheduled runs",
        acked,
        produced.events.len(),
        produced.events.iter().map(|e| e.attempts.len()).sum::<usize>(),
        produced
            .events
            .iter()
            .flat_map(|e| &e.attempts)
            .filter(|a| !a.outcome.starts_with('2'))
            .count(),
        ledger.runs.len(),
        ledger.runs.iter().filter(|r| r.handler == "sched").count(),
    ));
    notes.extend(chaos.trouble.iter().map(|t| format!("harness: {t}")));

    let extra = chaos.extra_sums.lock().expect("sums").clone();
    let evidence = Evidence {
        runs: &ledger.runs,
        incarnations: &chaos.servers.incarnations,
        faults: &chaos.faults,
        produced: &produced.events,
        extra_sums: &extra,
        final_events: &final_events,
        lease,
        unexpected_exits: &chaos.servers.unexpected_exits,
        integrity,
        leftover_pids: &leftover,
    };
    let checks = evidence.check_all();
    // Rescue time is timing on a shared machine: measured and reported
    // beside its bound, not an invariant (a loaded 2-core runner would
    // fail it at random).
    let (rescues, over) = evidence.rescues();
    let faults_text: String = chaos
        .faults
        .iter()
        .map(|f| {
            format!(
                "{:.3} {:.3} {} slot={:?} {}\n",
                f.start,
                f.end,
                f.kind.name(),
                f.slot,
                f.detail
            )
        })
        .collect();
    let _ = std::fs::write(workdir.join("faults.txt"), faults_text);
    let failures_text: String = checks
        .iter()
        .flat_map(|c| c.failures.iter().map(move |f| format!("{}: {f}\n", c.name)))
        .collect();
    let _ = std::fs::write(workdir.join("failures.txt"), failures_text);
    let failed = report::print(&chaos.faults, &checks, (&rescues, &over), lease, &notes);

    if let Some(q) = &chaos.queue {
        q.queue().close().await;
    }
    // The scratch schema and stream go first, while NATS still runs.
    drop(scratch);
    if let Some(n) = chaos.nats.as_mut() {
        n.kill().await;
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
