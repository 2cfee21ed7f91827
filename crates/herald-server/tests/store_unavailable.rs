//! Emits while PostgreSQL does not answer (a crash, a partition: its
//! connections black-holed) fail within the client's emit timeout, as
//! `StoreError::Unavailable`, and the HTTP API answers 503
//! `store_unavailable` within it too, for single emits, concurrent ones
//! (written together by group commit) and batches. Once the database
//! answers again, emits succeed.
//!
//! The database is the shared PostgreSQL, reached through a TCP proxy of
//! the test's own that can stop forwarding (the black hole) without
//! closing anything, as a server that froze or a network that drops
//! packets does.

mod common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use herald::{Client, ClientError, EmitOptions, MemoryQueue, StoreError};
use herald_postgres::testing::{self, fresh_schema};
use herald_postgres::PgStore;
use herald_server::serve::{api, auth, recent, telemetry};
use tokio::net::TcpListener;

/// The emit timeout the test sets.
const BOUND: Duration = Duration::from_secs(2);
/// What an answer may take beyond the bound (a loaded machine).
const SLACK: Duration = Duration::from_millis(1500);

fn assert_unavailable(what: &str, out: Result<herald::Emitted, ClientError>) {
    match out {
        Err(ClientError::Store(StoreError::Unavailable { op: "emit", .. })) => {}
        other => panic!("{what}: expected the store to be unavailable, got {other:?}"),
    }
}

/// Runs `f`, and fails the test if it takes longer than the bound and its
/// slack (it waits up to a minute more, so that a hang shows as a
/// failure, not as a test that never ends).
async fn within_bound<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let out = tokio::time::timeout(BOUND + SLACK + Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer at all"));
    let took = t.elapsed();
    assert!(
        took <= BOUND + SLACK,
        "{what}: answered after {took:?}, over the bound of {BOUND:?}"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_answer_store_unavailable_within_the_bound_while_postgres_does_not_answer() {
    let test = "emits_answer_store_unavailable_within_the_bound";
    let Some((_direct, schema)) = fresh_schema(test).await else {
        return;
    };
    let direct = testing::connect_options();
    let proxy = Proxy::start(format!("{}:{}", direct.get_host(), direct.get_port())).await;
    let pool = herald_postgres::pool_options()
        .max_connections(4)
        .connect_lazy_with(direct.clone().port(proxy.port));
    let store = Arc::new(PgStore::from_pool(pool, schema.name()).await.unwrap());
    let client = Client::new(store.clone(), Arc::new(MemoryQueue::default())).emit_timeout(BOUND);
    let state = Arc::new(api::AppState {
        schedules: store,
        client: client.clone(),
        tokens: auth::Tokens::new(&Default::default()),
        tracker: Arc::new(recent::Tracker::default()),
        metrics: telemetry::install().expect("a metrics recorder"),
        max_batch: 100,
        max_request_bytes: 1 << 20,
        handlers: Vec::new(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, api::router(state)).into_future());
    let http = reqwest::Client::new();
    let emit = |key: Option<&str>| {
        let client = client.clone();
        let options = match key {
            Some(k) => EmitOptions::default().idempotency_key(k),
            None => EmitOptions::default(),
        };
        async move { client.emit_json("acme", "h", "{}", options).await }
    };

    // The database answers: a keyed and an unkeyed emit go through.
    emit(None)
        .await
        .expect("an emit while the database answers");
    emit(Some("warm")).await.expect("a keyed emit");

    proxy.hold(true);
    assert_unavailable(
        "a single emit",
        within_bound("a single emit", emit(None)).await,
    );
    assert_unavailable(
        "a keyed emit",
        within_bound("a keyed emit", emit(Some("k1"))).await,
    );
    // Concurrent emits: the group commit writes those that wait together.
    let concurrent = within_bound("concurrent emits", async {
        let emits: Vec<_> = (0..20)
            .map(|i| tokio::spawn(emit(Some(&format!("c{i}")))))
            .collect();
        let mut out = Vec::new();
        for e in emits {
            out.push(e.await.unwrap());
        }
        out
    })
    .await;
    for out in concurrent {
        assert_unavailable("a concurrent emit", out);
    }
    let answer = within_bound("the HTTP API's emit", async {
        http.post(format!("{base}/v1/events"))
            .json(&serde_json::json!({"tenant": "acme", "handler": "h", "payload": {}}))
            .send()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(answer.status(), 503);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    let answer = within_bound("the HTTP API's batch", async {
        http.post(format!("{base}/v1/events/batch"))
            .json(&serde_json::json!({"events": [
                {"tenant": "acme", "handler": "h", "payload": 1},
                {"tenant": "acme", "handler": "h", "payload": 2},
            ]}))
            .send()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(answer.status(), 503);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");

    // The database answers again: emits succeed (the pool's connections
    // were held, not closed).
    proxy.hold(false);
    let t = Instant::now();
    loop {
        match emit(Some("after")).await {
            Ok(_) => break,
            Err(e) if t.elapsed() < Duration::from_secs(30) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("emits still fail 30 s after the database answers again: {e}"),
        }
    }
}
