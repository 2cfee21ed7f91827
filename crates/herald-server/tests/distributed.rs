//! herald distributed, through the real binary: three `herald serve`
//! workers on one PostgreSQL schema and one queue, 20,000 events, one
//! worker SIGKILLed mid-run and the broker restarted once. One body, run
//! for each queue: NATS JetStream (a nats-server of the test's own,
//! restarted with its store) and Google Pub/Sub (an emulator of the test's
//! own, restarted empty: its topic, subscription and every message in
//! flight are gone, and the workers must make them again and the reconciler
//! re-notify what was lost).
//!
//! Every run of the handler (a webhook served by this test) records itself
//! in a ledger table: the event, the run's lease token, the worker that ran
//! it, and when it started and ended. The assertions are read from the
//! ledger, not from herald's own counters:
//!
//! - every event ran to completion, and the store holds nothing afterwards;
//! - every run of an event had its own lease token;
//! - an event ran more than once only if the killed worker ran it first,
//!   and its next run started after the kill, and no sooner than a lease
//!   after the earlier run began: no two runs of an event overlapped under
//!   live leases.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use common::{herald, Server};
use herald_nats::testing::OwnServer;
use herald_postgres::testing::{connect_options, database_url, reachable, unreachable, TestSchema};
use herald_pubsub::testing::OwnEmulator;
use rand::Rng;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const EVENTS: usize = 20_000;
const BATCH: usize = 100;
const WORKERS: usize = 3;
/// The worker that is killed: never sent an emit, so no emit is lost with it.
const VICTIM: usize = 2;
const LEASE: Duration = Duration::from_secs(2);
/// Kill the victim once this many runs have started; restart the broker at the second.
const KILL_AT: u64 = 5_000;
const BROKER_RESTART_AT: u64 = 10_000;
/// How long the broker stays down: longer than a lease, so that deliveries
/// time out at the broker while their runs hold live leases in the store.
const BROKER_DOWN: Duration = Duration::from_secs(3);
/// The whole run must finish within this, or the test fails saying how far
/// it got (with each worker's last log lines). On the Pub/Sub emulator,
/// with one message per event, runs slowed to 15-30/s between the SIGKILL
/// and the emulator's restart (the reconciler's passes re-notified
/// thousands of events, one message each, and the emulator fell behind),
/// and the run did not finish within 420 s; with batched notifications
/// (ADR 0010) it takes 31-34 s here (2026-12-02), as on NATS.
const LIMIT: Duration = Duration::from_secs(240);

fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The ledger: one row per run, written by the webhook the workers call.
#[derive(Clone)]
struct Ledger {
    pool: PgPool,
    table: String,
    started: Arc<AtomicU64>,
}

impl Ledger {
    async fn create(pool: PgPool, schema: &str) -> Ledger {
        let table = format!("{schema}.ledger");
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(&format!(
            "CREATE TABLE {table} (
                run bigserial PRIMARY KEY,
                event_id text NOT NULL,
                lease_token text NOT NULL,
                worker int NOT NULL,
                started_us bigint NOT NULL,
                ended_us bigint
            )"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Ledger {
            pool,
            table,
            started: Arc::new(AtomicU64::new(0)),
        }
    }

    fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Runs of `worker` that have started and not ended.
    async fn in_flight(&self, worker: usize) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE worker = $1 AND ended_us IS NULL",
            self.table
        ))
        .bind(worker as i32)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// The handler: record the start, work 5–30 ms (200–400 ms on the victim,
/// so that its SIGKILL surely lands mid-handler), record the end, answer
/// 200. A worker killed mid-request leaves its run without an end.
async fn run(
    State(ledger): State<Ledger>,
    UrlPath(worker): UrlPath<i32>,
    headers: HeaderMap,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (Some(id), Some(token)) = (header("herald-event-id"), header("herald-lease-token")) else {
        return StatusCode::BAD_REQUEST;
    };
    if id.parse::<herald::EventId>().is_err() {
        return StatusCode::BAD_REQUEST;
    }
    let run: i64 = match sqlx::query_scalar(&format!(
        "INSERT INTO {} (event_id, lease_token, worker, started_us) VALUES ($1, $2, $3, $4) RETURNING run",
        ledger.table
    ))
    .bind(id)
    .bind(&token)
    .bind(worker)
    .bind(micros_now())
    .fetch_one(&ledger.pool)
    .await
    {
        Ok(run) => run,
        // The test's own database trouble: herald retries, and the
        // assertions will show an unexplained extra run.
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    ledger.started.fetch_add(1, Ordering::Relaxed);
    let work = if worker as usize == VICTIM {
        rand::thread_rng().gen_range(200..=400)
    } else {
        rand::thread_rng().gen_range(5..=30)
    };
    tokio::time::sleep(Duration::from_millis(work)).await;
    match sqlx::query(&format!(
        "UPDATE {} SET ended_us = $1 WHERE run = $2",
        ledger.table
    ))
    .bind(micros_now())
    .bind(run)
    .execute(&ledger.pool)
    .await
    {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Serves the ledger webhook on a free loopback port; returns its port.
async fn serve_ledger(ledger: Ledger) -> u16 {
    let app = axum::Router::new()
        .route("/run/{worker}", axum::routing::post(run))
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// The broker under test, of the test's own.
enum Broker {
    Nats(OwnServer),
    Pubsub(OwnEmulator),
}

impl Broker {
    /// Starts one; `None` (after the SKIPPED line, or a failure with
    /// `CI=true`) when it can't be run.
    async fn start(kind: &str, test: &str) -> Option<Broker> {
        match kind {
            "nats" => match OwnServer::start().await {
                Ok(n) => Some(Broker::Nats(n)),
                Err(e) => {
                    herald_nats::testing::unreachable(test, "a nats-server of its own", &e);
                    None
                }
            },
            _ => match OwnEmulator::start().await {
                Ok(e) => Some(Broker::Pubsub(e)),
                Err(e) => {
                    herald_pubsub::testing::unreachable(test, "an emulator of its own", &e);
                    None
                }
            },
        }
    }

    /// The queue's lines of `herald.toml`.
    fn config(&self) -> String {
        match self {
            Broker::Nats(n) => format!("queue = \"{}\"\nnats_stream = \"herald_dist\"", n.url()),
            // Unary pulls: the emulator ignores a stream's flow control and
            // keeps feeding a killed worker's stream (docs/pubsub.md,
            // "The emulator"), which the real service is not known to do.
            Broker::Pubsub(_) => {
                "queue = \"pubsub://herald-test/herald-dist?subscription=herald-dist-workers\"\npubsub_pull = \"unary\""
                    .into()
            }
        }
    }

    /// The environment a worker needs to find it.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Broker::Nats(_) => Vec::new(),
            Broker::Pubsub(e) => vec![("PUBSUB_EMULATOR_HOST", e.host())],
        }
    }

    fn stop(&mut self) {
        match self {
            Broker::Nats(n) => n.stop(),
            Broker::Pubsub(e) => e.stop(),
        }
    }

    async fn restart(&mut self) {
        match self {
            Broker::Nats(n) => n.restart().await.expect("restart nats-server"),
            Broker::Pubsub(e) => e.restart().await.expect("restart the emulator"),
        }
    }
}

/// `herald serve` for worker `n`: the same configuration as the others but
/// for its webhook's path, which tells the ledger who ran what.
fn worker(dir: &Path, n: usize, store: &str, schema: &str, broker: &Broker, ledger: u16) -> Server {
    let config = dir.join(format!("worker{n}.toml"));
    std::fs::write(
        &config,
        format!(
            r#"
store = "{store}"
pg_schema = "{schema}"
{queue}
listen = "127.0.0.1:0"
max_batch = {BATCH}

[worker]
concurrency = 16
lease = "{lease}ms"
sweep_every = "500ms"
sweep_quiet = "2s"
shutdown_grace = "10s"

[handlers.ledger]
kind = "webhook"
url = "http://127.0.0.1:{ledger}/run/{n}"
secret = "distributed-test"
timeout = "10s"
"#,
            lease = LEASE.as_millis(),
            queue = broker.config(),
        ),
    )
    .unwrap();
    let mut cmd = herald(dir);
    cmd.args(["serve", "--config"]).arg(&config).env(
        "HERALD_LOG",
        "info,herald::worker=debug,herald::worker::run=info,herald::worker::admission=info",
    );
    cmd.envs(broker.env());
    Server::start(cmd)
}

/// Emits every event through the API of the workers that stay alive,
/// batch by batch, and returns their ids. A batch refused for a reason
/// other than an outage fails the test.
async fn emit_all(bases: Vec<String>) -> Vec<String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut ids = Vec::with_capacity(EVENTS);
    for (b, start) in (0..EVENTS).step_by(BATCH).enumerate() {
        let events: Vec<Value> = (start..start + BATCH)
            .map(|n| json!({"tenant": "acme", "handler": "ledger", "payload": {"n": n}}))
            .collect();
        let base = &bases[b % bases.len()];
        let response = http
            .post(format!("{base}/v1/events/batch"))
            .json(&json!({ "events": events }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("emit batch {b} to {base}: {e}"));
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 201, "emit batch {b} to {base}: {body}");
        for r in body["results"].as_array().unwrap() {
            ids.push(r["id"].as_str().unwrap().to_string());
        }
    }
    ids
}

async fn stored_events(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {schema}.events"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[derive(Debug)]
struct Run {
    event_id: String,
    lease_token: String,
    worker: i32,
    started_us: i64,
    ended_us: Option<i64>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_survive_a_sigkill_and_a_nats_restart_and_every_event_runs() {
    survive(
        "nats",
        "three_workers_survive_a_sigkill_and_a_nats_restart_and_every_event_runs",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_survive_a_sigkill_and_a_pubsub_emulator_restart_and_every_event_runs() {
    survive(
        "pubsub",
        "three_workers_survive_a_sigkill_and_a_pubsub_emulator_restart_and_every_event_runs",
    )
    .await;
}

/// One broker's run at a time: each drives three workers and the machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The test, on the broker `kind`.
async fn survive(kind: &str, test: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let db = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &db, &e);
        return;
    }
    let Some(mut broker) = Broker::start(kind, test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &db);
    let ledger_schema = TestSchema::adopt(TestSchema::random_name());
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect_with(connect_options())
        .await
        .unwrap();
    let ledger = Ledger::create(pool.clone(), ledger_schema.name()).await;
    let port = serve_ledger(ledger.clone()).await;

    let mut workers: Vec<Server> = (0..WORKERS)
        .map(|n| worker(dir.path(), n, &db, schema.name(), &broker, port))
        .collect();
    let emit_to: Vec<String> = (0..WORKERS)
        .filter(|n| *n != VICTIM)
        .map(|n| workers[n].base.clone())
        .collect();
    let begun = Instant::now();
    let begun_us = micros_now();
    let emitter = tokio::spawn(emit_all(emit_to));

    // The kill: once enough has run, and while the victim is mid-handler.
    while ledger.started() < KILL_AT || ledger.in_flight(VICTIM).await == 0 {
        assert!(
            begun.elapsed() < LIMIT,
            "only {} runs started\n{}",
            ledger.started(),
            log_tails(&workers)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let in_flight_at_kill = ledger.in_flight(VICTIM).await;
    let killed_at = micros_now();
    workers[VICTIM].signal("-KILL");
    eprintln!(
        "{:?}: killed worker {VICTIM} with {in_flight_at_kill} runs in flight",
        begun.elapsed()
    );
    let _ = workers[VICTIM].wait(Duration::from_secs(10));

    // The broker's restart, with emits and runs still going.
    while ledger.started() < BROKER_RESTART_AT {
        assert!(
            begun.elapsed() < LIMIT,
            "only {} runs started\n{}",
            ledger.started(),
            log_tails(&workers)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    broker.stop();
    tokio::time::sleep(BROKER_DOWN).await;
    broker.restart().await;
    eprintln!("{:?}: restarted {kind}", begun.elapsed());

    let ids = tokio::time::timeout(LIMIT, emitter)
        .await
        .expect("every batch emitted in time")
        .unwrap();
    assert_eq!(ids.len(), EVENTS);
    eprintln!(
        "{:?}: emitted {EVENTS}; {} runs started",
        begun.elapsed(),
        ledger.started()
    );
    loop {
        let left = stored_events(&pool, schema.name()).await;
        if left == 0 {
            break;
        }
        assert!(
            begun.elapsed() < LIMIT,
            "{left} events still stored after {LIMIT:?}; {} runs started\n{}",
            ledger.started(),
            log_tails(&workers)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = begun.elapsed();
    for (n, w) in workers.iter_mut().enumerate() {
        if n != VICTIM {
            w.signal("-TERM");
            let status = w.wait(Duration::from_secs(30));
            assert!(status.success(), "worker {n}: {status}\n{}", w.stderr());
        }
    }

    let runs: Vec<Run> = sqlx::query_as::<_, (String, String, i32, i64, Option<i64>)>(&format!(
        "SELECT event_id, lease_token, worker, started_us, ended_us FROM {} ORDER BY event_id, started_us",
        ledger.table
    ))
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(event_id, lease_token, worker, started_us, ended_us)| Run {
        event_id,
        lease_token,
        worker,
        started_us,
        ended_us,
    })
    .collect();
    let mut by_event: std::collections::HashMap<String, Vec<&Run>> = Default::default();
    for r in &runs {
        by_event.entry(r.event_id.clone()).or_default().push(r);
    }
    let emitted: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(emitted.len(), EVENTS, "every emitted id is distinct");
    let unknown: Vec<_> = by_event.keys().filter(|id| !emitted.contains(id)).collect();
    assert!(
        unknown.is_empty(),
        "runs of events never emitted: {unknown:?}"
    );

    // What the workers logged of one event, for a failed check; times
    // from the test's start.
    let story = |id: &str, rs: &[&Run]| -> String {
        let mut out = format!(
            "killed at {:.3}s; runs (start..end, s):",
            (killed_at - begun_us) as f64 / 1e6
        );
        for r in rs {
            out.push_str(&format!(
                " [worker {} {:.3}..{}]",
                r.worker,
                (r.started_us - begun_us) as f64 / 1e6,
                r.ended_us.map_or("-".into(), |e| format!(
                    "{:.3}",
                    (e - begun_us) as f64 / 1e6
                ))
            ));
        }
        for (n, w) in workers.iter().enumerate() {
            out.push_str(&format!("\n--- worker {n} on {id} ---\n"));
            for line in w.stderr().lines().filter(|l| l.contains(id)) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    };
    let slack_us = 250_000;
    let lease_us = LEASE.as_micros() as i64;
    let mut reruns = 0;
    let mut lapsed: Vec<String> = Vec::new();
    // A request the victim sent just before it died may reach the ledger
    // a little later on a busy machine; none may arrive long after.
    let late: Vec<&Run> = runs
        .iter()
        .filter(|r| r.worker as usize == VICTIM && r.started_us > killed_at + 1_000_000)
        .collect();
    assert!(
        late.is_empty(),
        "runs began on the killed worker a second after its death: {late:?}"
    );
    for id in &ids {
        let Some(rs) = by_event.get(id) else {
            panic!("event {id} never ran")
        };
        let tokens: std::collections::HashSet<&str> =
            rs.iter().map(|r| r.lease_token.as_str()).collect();
        assert_eq!(
            tokens.len(),
            rs.len(),
            "event {id}: every run has its own lease token: {rs:?}"
        );
        let last = rs.last().unwrap();
        assert!(
            last.ended_us.is_some(),
            "event {id}: its last run did not complete: {rs:?}"
        );
        for pair in rs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            reruns += 1;
            assert!(
                b.started_us > a.started_us,
                "event {id}: runs out of order: {a:?} then {b:?}"
            );
            if a.worker as usize != VICTIM {
                // A live worker's lease can lapse on a starved machine (no
                // renewal for a whole lease); herald must then have noticed:
                // the handler cancelled, or its late result refused by the
                // fence. Anything else is an unexplained second run.
                let noticed = workers[a.worker as usize].stderr().lines().any(|l| {
                    l.contains(id.as_str())
                        && (l.contains("late result refused") || l.contains("lease lost"))
                });
                assert!(
                    noticed,
                    "event {id} ran again, though its earlier run was on a live worker that did not lose its lease: {a:?} then {b:?}\n{}",
                    story(id, rs)
                );
                lapsed.push(id.clone());
                continue;
            }
            assert!(
                b.started_us > killed_at,
                "event {id}: a second run began before the first one's worker died: {a:?} then {b:?}"
            );
            assert!(
                b.started_us - a.started_us >= lease_us - slack_us,
                "event {id}: the second run began {} ms after the first, under its live {LEASE:?} lease: {a:?} then {b:?}",
                (b.started_us - a.started_us) / 1000
            );
        }
    }
    // The victim's runs that its SIGKILL caught mid-handler: each ran again.
    let caught: Vec<&Run> = runs
        .iter()
        .filter(|r| r.worker as usize == VICTIM && r.started_us < killed_at && r.ended_us.is_none())
        .collect();
    assert!(
        !caught.is_empty(),
        "the kill caught no run mid-handler ({in_flight_at_kill} seemed in flight just before)"
    );
    for r in &caught {
        assert!(
            by_event[&r.event_id].len() >= 2,
            "event {} was caught by the kill mid-handler and never ran again: {:?}",
            r.event_id,
            by_event[&r.event_id]
        );
    }
    if !lapsed.is_empty() {
        eprintln!(
            "{} events ran again after a live worker's lease lapsed (each noticed by herald): {lapsed:?}",
            lapsed.len()
        );
    }
    assert_eq!(stored_events(&pool, schema.name()).await, 0);
    eprintln!(
        "{EVENTS} events, {} runs ({reruns} again, {} caught mid-handler by the kill, {} after a lapsed lease) in {took:?}",
        runs.len(),
        caught.len(),
        lapsed.len()
    );
    drop(broker);
}

/// The last lines each worker logged, for a failure's message.
fn log_tails(workers: &[Server]) -> String {
    workers
        .iter()
        .enumerate()
        .map(|(n, w)| {
            let log = w.stderr();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            format!(
                "--- worker {n}, last {} of {} lines:\n{tail}",
                lines.len().min(40),
                lines.len()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
