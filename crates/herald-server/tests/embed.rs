//! herald-server as a library: a Rust program reads a `herald.toml` with
//! the server's own config loader, builds its webhook handler from the
//! `[handlers.NAME]` table, runs a worker with it, and serves herald's
//! HTTP API (and dashboard) from its own listener. An event emitted through
//! that API reaches the webhook, signed.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use axum::{body::Bytes, http::HeaderMap, routing::post, Router};
use herald::{Client, MemoryQueue, Worker};
use herald_server::config::{self, Overrides, StoreLocation};
use herald_server::runners::RunWatch;
use herald_server::serve::{self, api, auth, recent, telemetry};
use herald_sqlite::SqliteStore;
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_embeds_the_config_the_handlers_and_the_api() {
    // The webhook's receiver: whatever it is sent goes to `hooks`.
    let (to_test, mut hooks) = mpsc::unbounded_channel::<(HeaderMap, Bytes)>();
    let receiver = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let to_test = to_test.clone();
            async move {
                let _ = to_test.send((headers, body));
                "ok"
            }
        }),
    );
    let hook_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_addr = hook_listener.local_addr().unwrap();
    tokio::spawn(axum::serve(hook_listener, receiver).into_future());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(
        &file,
        format!(
            "store = \"sqlite://{}\"\n[worker]\nlease = \"2s\"\n[handlers.notify]\nkind = \"webhook\"\nurl = \"http://{hook_addr}/hook\"\nsecret = \"s3cret\"\n",
            dir.path().join("herald.db").display()
        ),
    )
    .unwrap();
    let config = config::load(
        &Overrides {
            config: Some(file),
            ..Overrides::default()
        },
        &|_| None,
    )
    .expect("the config loads");
    let StoreLocation::Sqlite(path) = &config.store else {
        panic!("a SQLite store: {}", config.store)
    };
    let store = Arc::new(SqliteStore::open(path).unwrap());
    let queue = Arc::new(MemoryQueue::new(config.worker.lease));

    // The handlers of the [handlers.NAME] tables, as `herald serve` builds them.
    let handlers = serve::build_handlers(&config, &RunWatch::none()).expect("handlers build");
    assert_eq!(handlers.len(), 1);
    let tracker = Arc::new(recent::Tracker::default());
    let mut builder = Worker::builder(store.clone(), queue.clone())
        .config(config.worker.clone())
        .observer(tracker.clone());
    let mut names = Vec::new();
    for (name, handler) in handlers {
        names.push(name.clone());
        builder = builder.raw_handler(name, handler);
    }
    let worker = builder.start();

    // herald's API on this program's own listener.
    let state = Arc::new(api::AppState {
        schedules: store.clone(),
        client: Client::new(store.clone(), queue.clone()),
        tokens: auth::Tokens::new(&config.auth),
        tracker,
        metrics: telemetry::install().expect("a metrics recorder"),
        max_batch: config.max_batch,
        max_request_bytes: config.max_request_bytes,
        handlers: names,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, api::router(state)).into_future());

    let http = reqwest::Client::new();
    let page = http.get(format!("{base}/")).send().await.unwrap();
    assert!(
        page.status().is_success(),
        "the dashboard: {}",
        page.status()
    );
    let emitted = http
        .post(format!("{base}/v1/events"))
        .json(&serde_json::json!({
            "tenant": "acme",
            "handler": "notify",
            "payload": {"to": "ada@example.com"}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(emitted.status(), 201, "{}", emitted.text().await.unwrap());
    let id = emitted.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .expect("an id")
        .to_string();

    let (headers, body) = tokio::time::timeout(Duration::from_secs(20), hooks.recv())
        .await
        .expect("the webhook is called within 20 s")
        .expect("a delivery");
    assert_eq!(headers["herald-event-id"], id.as_str());
    assert!(
        headers.contains_key("herald-signature"),
        "signed: {headers:?}"
    );
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        body.to_string().contains("ada@example.com"),
        "the payload is delivered: {body}"
    );
    worker.shutdown(Duration::from_secs(5)).await;
}
