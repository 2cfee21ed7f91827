//! Limits across processes, through the real binary: three `herald
//! serve` workers on one PostgreSQL schema and a nats-server of the test's
//! own, their limits declared in their herald.toml.
//!
//! A per-key limit of 2, 600 events over 10 keys, and one worker
//! SIGKILLed while it runs some:
//!
//! Every run of the handler (a webhook served by this test) records itself
//! in a ledger table: the event, the worker, when it started and ended.
//! The assertions are read from the ledger:
//!
//! - every event ran to completion, and the store holds nothing afterwards;
//! - at no instant did a key have more than 2 runs, counting a run of the
//!   killed worker that never ended as live until half a lease after the
//!   kill (its lease, renewed every lease/3, cannot lapse sooner);
//! - every key whose slot the killed worker held had 2 runs at once on the
//!   other workers again within lease + lease/3 + 1 s of the kill: its
//!   slot lapsed with the lease and the reconciler handed it on.
//!
//! A rate of 20 starts a second (burst 1) on the handler, 100 events: no
//! window of the ledger's start times holds more than the rate's bound
//! (20 + the burst in a second), and every event ran once.

use std::collections::HashMap;
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
use rand::Rng;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const KEYS: usize = 10;
const EVENTS: usize = 600;
const WORKERS: usize = 3;
/// The worker that is killed: never sent an emit.
const VICTIM: usize = 2;
const PER_KEY: i64 = 2;
const LEASE: Duration = Duration::from_secs(2);
/// Kill the victim once this many runs have started and it runs some.
const KILL_AT: u64 = 60;
const LIMIT: Duration = Duration::from_secs(180);

fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

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
            "CREATE TABLE {table} (run bigserial PRIMARY KEY, event_id text NOT NULL, \
             worker int NOT NULL, started_us bigint NOT NULL, ended_us bigint)"
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

/// The handler: record the start, work 60–160 ms (400–800 ms on the
/// victim, so that its SIGKILL lands mid-run), record the end.
async fn run(
    State(ledger): State<Ledger>,
    UrlPath(worker): UrlPath<i32>,
    headers: HeaderMap,
) -> StatusCode {
    let Some(id) = headers
        .get("herald-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return StatusCode::BAD_REQUEST;
    };
    let run: i64 = match sqlx::query_scalar(&format!(
        "INSERT INTO {} (event_id, worker, started_us) VALUES ($1, $2, $3) RETURNING run",
        ledger.table
    ))
    .bind(id)
    .bind(worker)
    .bind(micros_now())
    .fetch_one(&ledger.pool)
    .await
    {
        Ok(run) => run,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    ledger.started.fetch_add(1, Ordering::Relaxed);
    let work = if worker as usize == VICTIM {
        rand::thread_rng().gen_range(400..=800)
    } else {
        rand::thread_rng().gen_range(60..=160)
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

async fn serve_ledger(ledger: Ledger) -> u16 {
    let app = axum::Router::new()
        .route("/run/{worker}", axum::routing::post(run))
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// `herald serve` for worker `n`, with the handler's limit (`limit`, the
/// lines of `[handlers.ledger.limit]`) in its configuration.
fn worker(
    dir: &Path,
    n: usize,
    (store, schema, nats): (&str, &str, &str),
    ledger: u16,
    limit: &str,
) -> Server {
    let config = dir.join(format!("worker{n}.toml"));
    std::fs::write(
        &config,
        format!(
            r#"
store = "{store}"
pg_schema = "{schema}"
queue = "{nats}"
nats_stream = "herald_limits"
listen = "127.0.0.1:0"

[worker]
concurrency = 16
lease = "{lease}ms"
sweep_every = "500ms"
sweep_quiet = "2s"
shutdown_grace = "10s"

[handlers.ledger]
kind = "webhook"
url = "http://127.0.0.1:{ledger}/run/{n}"
secret = "limits-test"
timeout = "10s"

[handlers.ledger.limit]
{limit}
"#,
            lease = LEASE.as_millis(),
        ),
    )
    .unwrap();
    let mut cmd = herald(dir);
    cmd.args(["serve", "--config"]).arg(&config);
    Server::start(cmd)
}

/// Emits every event, key `k{i % KEYS}`, in batches of 50, through the
/// workers that stay alive; returns each id with its key.
async fn emit_all(bases: Vec<String>) -> HashMap<String, String> {
    let http = reqwest::Client::new();
    let mut keys = HashMap::new();
    for (b, start) in (0..EVENTS).step_by(50).enumerate() {
        let batch: Vec<(String, Value)> = (start..start + 50)
            .map(|i| {
                let key = format!("k{}", i % KEYS);
                let event = json!({"tenant": "acme", "handler": "ledger", "payload": {"n": i},
                                   "concurrency_key": key});
                (key, event)
            })
            .collect();
        let base = &bases[b % bases.len()];
        let body = json!({"events": batch.iter().map(|(_, e)| e).collect::<Vec<_>>()});
        let response = http
            .post(format!("{base}/v1/events/batch"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let v: Value = response.json().await.unwrap();
        for (r, (key, _)) in v["results"].as_array().unwrap().iter().zip(batch) {
            keys.insert(r["id"].as_str().unwrap().to_string(), key);
        }
    }
    keys
}

struct Run {
    event_id: String,
    worker: i32,
    started_us: i64,
    ended_us: Option<i64>,
}

/// The most runs of one key live at once, over `runs` (start, end), and
/// the first instant at or after `from` when `want` are live at once.
fn overlaps(runs: &[(i64, i64)], from: i64, want: i64) -> (i64, Option<i64>) {
    let mut edges: Vec<(i64, i64)> = Vec::new();
    for &(s, e) in runs {
        edges.push((s, 1));
        edges.push((e, -1));
    }
    // Ends before starts at the same instant: a slot handed on is not two.
    edges.sort();
    let (mut live, mut most, mut reached) = (0, 0, None);
    for (t, d) in edges {
        live += d;
        most = most.max(live);
        if reached.is_none() && t >= from && live >= want {
            reached = Some(t);
        }
    }
    (most, reached)
}

/// Three `herald serve` workers with the handler's limit `limit`, on a
/// schema of their own, a nats-server of the test's own and the ledger.
struct Fleet {
    workers: Vec<Server>,
    ledger: Ledger,
    pool: PgPool,
    schema: TestSchema,
    _ledger_schema: TestSchema,
    _nats: OwnServer,
    _dir: tempfile::TempDir,
}

impl Fleet {
    /// `None` (after saying so, or failing with `CI=true`) when PostgreSQL
    /// or nats-server cannot be had.
    async fn start(test: &str, limit: &str) -> Option<Fleet> {
        let db = database_url();
        if let Err(e) = reachable().await {
            unreachable(test, &db, &e);
            return None;
        }
        let nats = match OwnServer::start().await {
            Ok(n) => n,
            Err(e) => {
                herald_nats::testing::unreachable(test, "a nats-server of its own", &e);
                return None;
            }
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
        let nats_url = nats.url();
        let workers = (0..WORKERS)
            .map(|n| worker(dir.path(), n, (&db, schema.name(), &nats_url), port, limit))
            .collect();
        Some(Fleet {
            workers,
            ledger,
            pool,
            schema,
            _ledger_schema: ledger_schema,
            _nats: nats,
            _dir: dir,
        })
    }

    /// Waits until the store holds no event, at most until `LIMIT` after `begun`.
    async fn drained(&self, begun: Instant) {
        loop {
            let left: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {}.events",
                self.schema.name()
            ))
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if left == 0 {
                return;
            }
            assert!(
                begun.elapsed() < LIMIT,
                "{left} events still stored after {LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every worker but `killed` with SIGTERM; each must exit cleanly.
    fn stop(&mut self, killed: Option<usize>) {
        for (n, w) in self.workers.iter_mut().enumerate() {
            if Some(n) != killed {
                w.signal("-TERM");
                let status = w.wait(Duration::from_secs(30));
                assert!(status.success(), "worker {n}: {status}\n{}", w.stderr());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_key_limit_holds_across_three_servers_and_a_killed_one_s_slots_come_back() {
    const TEST: &str =
        "a_per_key_limit_holds_across_three_servers_and_a_killed_one_s_slots_come_back";
    let Some(mut fleet) = Fleet::start(TEST, &format!("per_key = {PER_KEY}")).await else {
        return;
    };
    let (ledger, pool) = (fleet.ledger.clone(), fleet.pool.clone());
    let emit_to: Vec<String> = (0..WORKERS)
        .filter(|n| *n != VICTIM)
        .map(|n| fleet.workers[n].base.clone())
        .collect();
    let begun = Instant::now();
    let emitter = tokio::spawn(emit_all(emit_to));
    while ledger.started.load(Ordering::Relaxed) < KILL_AT || ledger.in_flight(VICTIM).await == 0 {
        assert!(begun.elapsed() < LIMIT, "the victim never ran anything");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = micros_now();
    fleet.workers[VICTIM].signal("-KILL");
    let _ = fleet.workers[VICTIM].wait(Duration::from_secs(10));
    let keys = emitter.await.unwrap();
    fleet.drained(begun).await;
    fleet.stop(Some(VICTIM));
    let runs: Vec<Run> = sqlx::query_as::<_, (String, i32, i64, Option<i64>)>(&format!(
        "SELECT event_id, worker, started_us, ended_us FROM {}",
        ledger.table
    ))
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(event_id, worker, started_us, ended_us)| Run {
        event_id,
        worker,
        started_us,
        ended_us,
    })
    .collect();
    let finished: std::collections::HashSet<&str> = runs
        .iter()
        // A run of the victim that ended before the kill finished too.
        .filter(|r| {
            r.ended_us
                .is_some_and(|e| r.worker as usize != VICTIM || e < killed_at)
        })
        .map(|r| r.event_id.as_str())
        .collect();
    let missing = keys
        .keys()
        .filter(|id| !finished.contains(id.as_str()))
        .count();
    assert_eq!(
        missing, 0,
        "every event ran to its end (on the victim before the kill, or on a live worker)"
    );
    let lease_us = LEASE.as_micros() as i64;
    let victim_end = killed_at + lease_us / 2;
    let mut by_key: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    let mut victim_keys: Vec<&str> = Vec::new();
    for r in &runs {
        let key = keys[&r.event_id].as_str();
        let end = match r.ended_us {
            Some(e) if r.worker as usize != VICTIM || e < killed_at => e,
            _ if r.worker as usize == VICTIM => {
                victim_keys.push(key);
                victim_end
            }
            _ => panic!("a live worker's run of {} never ended", r.event_id),
        };
        by_key.entry(key).or_default().push((r.started_us, end));
    }
    let bound_us = lease_us + lease_us / 3 + 1_000_000;
    let mut worst_return = 0;
    for (key, spans) in &by_key {
        let (most, _) = overlaps(spans, 0, PER_KEY);
        assert!(
            most <= PER_KEY,
            "key {key} had {most} runs at once (limit {PER_KEY})"
        );
        assert_eq!(most, PER_KEY, "key {key} never used its {PER_KEY} slots");
    }
    victim_keys.sort_unstable();
    victim_keys.dedup();
    assert!(!victim_keys.is_empty(), "the victim was killed mid-run");
    for key in &victim_keys {
        let others: Vec<(i64, i64)> = runs
            .iter()
            .filter(|r| r.worker as usize != VICTIM && keys[&r.event_id] == *key)
            .map(|r| (r.started_us, r.ended_us.unwrap()))
            .collect();
        let (_, back) = overlaps(&others, killed_at, PER_KEY);
        let back =
            back.unwrap_or_else(|| panic!("key {key} never had {PER_KEY} runs after the kill"));
        worst_return = worst_return.max(back - killed_at);
        assert!(
            back - killed_at <= bound_us,
            "key {key}: its slot came back {:.2} s after the kill (bound {:.2} s)",
            (back - killed_at) as f64 / 1e6,
            bound_us as f64 / 1e6
        );
    }
    eprintln!(
        "{} runs of {EVENTS} events; keys the victim held: {victim_keys:?}; slots back within {:.2} s of the kill (lease {:?}); took {:?}",
        runs.len(),
        worst_return as f64 / 1e6,
        LEASE,
        begun.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_holds_across_three_servers() {
    const TEST: &str = "a_rate_holds_across_three_servers";
    const RATE: usize = 20;
    const RATED: usize = 100;
    let Some(mut fleet) = Fleet::start(TEST, &format!("rate = \"{RATE}/1s\"")).await else {
        return;
    };
    let http = reqwest::Client::new();
    let events: Vec<Value> = (0..RATED)
        .map(|i| json!({"tenant": "acme", "handler": "ledger", "payload": {"n": i}}))
        .collect();
    let response = http
        .post(format!("{}/v1/events/batch", fleet.workers[0].base))
        .json(&json!({ "events": events }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    fleet.drained(Instant::now()).await;
    fleet.stop(None);
    let mut starts: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT started_us FROM {}", fleet.ledger.table))
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    starts.sort_unstable();
    assert_eq!(starts.len(), RATED, "every event ran once");
    // The GCRA's bound: in any window of a period, at most starts + burst
    // begin. The ledger sees a start when the webhook's request arrives,
    // some milliseconds after the claim: the window is a period less 100 ms.
    let window_us = 900_000;
    let most = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|&&t| t < starts[i] + window_us)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most <= RATE + 1,
        "{most} starts within 0.9 s (rate {RATE}/s, burst 1)"
    );
    let span = (starts[RATED - 1] - starts[0]) as f64 / 1e6;
    assert!(
        span >= (RATED - 1) as f64 / RATE as f64 * 0.9,
        "{RATED} starts spread over {span:.2} s at {RATE}/s"
    );
    eprintln!("{RATED} starts over {span:.2} s at {RATE}/s; at most {most} within 0.9 s");
}
