//! `herald serve` through the real binary: a random port, a temporary
//! store, HTTP requests, `/v1/stats` and `/metrics`, and SIGTERM.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{sha256_hex, Server};
use herald_postgres::testing::{database_url, reachable, unreachable};
use serde_json::{json, Value};

/// API tokens; the config holds their SHA-256.
const OP_TOKEN: &str = "op-token";
const ACME_TOKEN: &str = "acme-token";

/// `herald` with its logs at info, for the assertions on stderr.
fn herald(dir: &Path) -> Command {
    let mut c = common::herald(dir);
    c.env("HERALD_LOG", "info");
    c
}

async fn get(s: &Server, path: &str, token: Option<&str>) -> (u16, Value, String) {
    let mut req = reqwest::Client::new().get(s.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("GET");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

async fn post(s: &Server, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(s.url(path)).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("POST");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Emits 10 events one by one and 40 in a batch with `token`, waits until
/// all 50 ran, and checks `/v1/stats` (as `operator`) and `/metrics`.
async fn emit_and_watch(s: &Server, token: Option<&str>, operator: Option<&str>) {
    for n in 0..10 {
        let (status, v) = post(
            s,
            "/v1/events",
            token,
            json!({"tenant": "acme", "handler": "work", "payload": {"n": n}}),
        )
        .await;
        assert_eq!(status, 201, "{v}");
    }
    let batch: Vec<Value> = (10..50)
        .map(|n| json!({"tenant": "acme", "handler": "work", "payload": {"n": n}}))
        .collect();
    let (status, v) = post(s, "/v1/events/batch", token, json!({"events": batch})).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 40);
    // One that stays: its handler is not configured.
    let (status, _) = post(
        s,
        "/v1/events",
        token,
        json!({"tenant": "acme", "handler": "elsewhere", "payload": null}),
    )
    .await;
    assert_eq!(status, 201);

    // `/v1/stats` reads the store's counts before the recent activity, so a
    // run can end between the two reads: wait until both agree.
    let left = json!([{"tenant": "acme", "handler": "elsewhere", "waiting": 1, "running": 0, "delayed": 0, "held": 0, "dead": 0, "done": 0, "estimated": false, "paused": false, "blocked": false}]);
    let mut stats = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        stats = get(s, "/v1/stats", operator).await.1;
        let work = &stats["recent"]["handlers"]["work"];
        // Every run started, and every run's event is deleted (done). A
        // rate times the rounded window is not a count: it agreed only in
        // parts of each second.
        if stats["by_handler"] == left && work["emit_to_start_seconds"]["samples"] == 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let work = &stats["recent"]["handlers"]["work"];
    assert_eq!(work["emit_to_start_seconds"]["samples"], 50, "{stats}");
    assert!(
        work["emit_to_start_seconds"]["p99"].as_f64().is_some(),
        "{stats}"
    );
    assert_eq!(stats["handlers"], json!(["work"]));
    assert_eq!(stats["by_handler"], left, "done events are deleted");

    // A run's counters move just after its settle commits: poll them too.
    let want = [
        "herald_events_emitted_total{handler=\"work\"} 50",
        "herald_events_emitted_total{handler=\"elsewhere\"} 1",
        "herald_events_done_total{handler=\"work\"} 50",
        "herald_emit_to_start_seconds_count{handler=\"work\"} 50",
        "herald_handler_duration_seconds_count{handler=\"work\"} 50",
        "herald_runs_in_flight{handler=\"work\"} 0",
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (status, _, metrics) = get(s, "/metrics", None).await;
        assert_eq!(status, 200);
        if want.iter().all(|l| metrics.contains(l)) || Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for line in want {
        assert!(metrics.contains(line), "{line:?} not in\n{metrics}");
    }
}

#[tokio::test]
async fn serve_on_sqlite_emits_runs_reports_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "sqlite://{}"
listen = "127.0.0.1:0"
[worker]
concurrency = 8
lease = "5s"
shutdown_grace = "5s"
[auth]
operator_token_sha256 = "{}"
[auth.tenants]
acme = "{}"
"#,
            db.display(),
            sha256_hex(OP_TOKEN),
            sha256_hex(ACME_TOKEN)
        ),
    )
    .unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--config"])
        .arg(&config)
        .args(["--noop-handler", "work"]);
    let mut s = Server::start(cmd);

    let (status, v, _) = get(&s, "/v1/stats", None).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "missing_token");
    emit_and_watch(&s, Some(ACME_TOKEN), Some(OP_TOKEN)).await;
    // The tenant's view has its counts, but no server-wide figures.
    let (_, v, _) = get(&s, "/v1/stats", Some(ACME_TOKEN)).await;
    assert_eq!(v["by_handler"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["recent"], Value::Null);
    let (status, _, doc) = get(&s, "/openapi.json", None).await;
    assert_eq!(status, 200);
    assert!(doc.contains("\"openapi\": \"3.1.0\""));

    s.signal("-TERM");
    let status = s.wait(Duration::from_secs(20));
    assert!(status.success(), "exit {status}; stderr:\n{}", s.stderr());
    assert!(
        s.stderr().contains("herald serve stopped"),
        "{}",
        s.stderr()
    );
    assert!(db.exists());
}

#[tokio::test]
async fn serve_without_configuration_uses_herald_db_here_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut s = Server::start(cmd);
    assert!(
        s.stderr().contains("no API token is configured") || {
            std::thread::sleep(Duration::from_millis(200));
            s.stderr().contains("no API token is configured")
        }
    );
    // Open mode: no token needed, and a configured-looking one is ignored.
    let (status, v) = post(
        &s,
        "/v1/events",
        None,
        json!({"tenant": "t", "handler": "h", "payload": [1, 2]}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let (_, v, _) = get(&s, "/v1/stats", Some("whatever")).await;
    assert_eq!(v["by_handler"][0]["waiting"], 1, "{v}");
    assert_eq!(v["handlers"], json!([]));
    s.signal("-INT");
    let status = s.wait(Duration::from_secs(20));
    assert!(status.success(), "exit {status}; stderr:\n{}", s.stderr());
    assert!(
        dir.path().join("herald.db").exists(),
        "./herald.db is the default store"
    );
}

#[test]
fn env_overrides_the_file_and_flags_override_env() {
    let dir = tempfile::tempdir().unwrap();
    // The file's listen address is taken (we hold it), the env's is bad,
    // the flag's is good: the flag wins.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(
        dir.path().join("herald.toml"),
        format!("listen = \"{}\"\n", taken.local_addr().unwrap()),
    )
    .unwrap();
    let out = herald(dir.path())
        .args(["serve"])
        .env("HERALD_LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("environment variable HERALD_LISTEN: listen: \"not-an-address\" is not an IP address and port"),
        "{stderr}"
    );
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .env("HERALD_LISTEN", "not-an-address");
    let mut s = Server::start(cmd);
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(20)).success());
    // With neither, the file's (taken) address is used, and the error says so.
    let out = herald(dir.path()).args(["serve"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    drop(taken);
}

#[test]
fn configuration_errors_name_the_key_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "[worker]\nconcurency = 4\n",
            "worker.concurency: unknown key; expected one of `concurrency`",
        ),
        (
            "[worker]\nlease = \"a while\"\n",
            "worker.lease: \"a while\" is not a duration",
        ),
        (
            "[handlers.send_email]\nkind = \"webhook\"\nurl = \"/hooks\"\n",
            "handlers.send_email.url: relative URL without a base",
        ),
        (
            "listen = \"0.0.0.0:7878\"\n",
            "listen: 0.0.0.0:7878 is not a loopback address, and no API token is configured",
        ),
        (
            "[auth]\noperator_token_sha256 = \"op-token\"\n",
            "auth.operator_token_sha256: is 8 characters long",
        ),
        ("store = \"redis://x\"\n", "store: \"redis\" is not a store"),
    ];
    for (file, want) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, file).unwrap();
        let out = herald(dir.path())
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file:?} was accepted");
        assert!(stderr.contains(want), "{file:?}: {stderr}");
        assert!(stderr.contains("bad.toml"), "names the file: {stderr}");
    }
    let out = herald(dir.path())
        .args(["serve", "--config", "missing.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read the config file missing.toml")
    );
}

#[tokio::test]
async fn serve_on_postgres_emits_runs_and_stops_on_sigterm() {
    let test = "serve_on_postgres_emits_runs_and_stops_on_sigterm";
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &url);
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--store", &url, "--listen", "127.0.0.1:0"])
        .args(["--noop-handler", "work"])
        .env("HERALD_PG_SCHEMA", schema.name())
        .env("HERALD_WORKER_SWEEP_EVERY", "1s");
    let mut s = Server::start(cmd);
    emit_and_watch(&s, None, None).await;
    s.signal("-TERM");
    let status = s.wait(Duration::from_secs(30));
    assert!(status.success(), "exit {status}; stderr:\n{}", s.stderr());
}

/// SIGTERM waits for running handlers up to the grace period; a second
/// signal cancels them at once. The cancelled command is killed, and its
/// event is released for the next worker with its attempt given back.
#[tokio::test]
async fn a_second_signal_cancels_running_commands_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    std::fs::write(
        dir.path().join("herald.toml"),
        format!(
            "[worker]\nshutdown_grace = \"1h\"\n\n[handlers.slow]\nkind = \"command\"\nprogram = \"/bin/sh\"\nargs = [\"-c\", \"touch {}; sleep 1000\"]\ntimeout = \"1h\"\n",
            marker.display()
        ),
    )
    .unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut s = Server::start(cmd);
    let (status, v) = post(
        &s,
        "/v1/events",
        None,
        json!({"tenant": "t", "handler": "slow", "payload": {}}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let start = Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the first signal waits for the running command (grace 1h)"
    );
    let second = Instant::now();
    s.signal("-TERM");
    let status = s.wait(Duration::from_secs(20));
    assert!(status.success(), "exit {status}; stderr:\n{}", s.stderr());
    assert!(
        second.elapsed() < Duration::from_secs(10),
        "took {:?}",
        second.elapsed()
    );
    // The event is stored, pending, unleased, its attempt given back.
    let store = herald_sqlite::SqliteStore::open(dir.path().join("herald.db")).unwrap();
    let event = herald::backend::Operator::get(&store, id.parse().unwrap())
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(event.state, herald::EventState::Pending);
    assert_eq!((event.attempt, event.lease), (0, None));
}

/// `queue = "nats://…"`: the same run as on the in-process queue, with the
/// notifications going through NATS JetStream.
#[tokio::test]
async fn serve_on_nats_emits_runs_reports_and_stops_on_sigterm() {
    let url = herald_nats::testing::nats_url();
    if let Err(e) = herald_nats::testing::connect().await {
        herald_nats::testing::unreachable(
            "serve_on_nats_emits_runs_reports_and_stops_on_sigterm",
            &url,
            &e,
        );
        return;
    }
    let stream = herald_nats::testing::TestStream::adopt(herald_nats::testing::random_prefix());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "sqlite://{}"
queue = "{url}"
nats_stream = "{}"
listen = "127.0.0.1:0"
[worker]
concurrency = 8
lease = "5s"
shutdown_grace = "5s"
[auth]
operator_token_sha256 = "{}"
[auth.tenants]
acme = "{}"
"#,
            dir.path().join("events.db").display(),
            stream.name(),
            sha256_hex(OP_TOKEN),
            sha256_hex(ACME_TOKEN)
        ),
    )
    .unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--config"])
        .arg(&config)
        .args(["--noop-handler", "work"]);
    let mut s = Server::start(cmd);
    emit_and_watch(&s, Some(ACME_TOKEN), Some(OP_TOKEN)).await;
    s.signal("-TERM");
    let status = s.wait(Duration::from_secs(20));
    assert!(status.success(), "exit {status}; stderr:\n{}", s.stderr());
    drop(stream);
}

// ---- NATS replicas, MaxAckPending and credentials, through the binary.

/// `herald serve` on NATS with the stream `stream`, a temporary SQLite
/// store in `dir`, and a no-op handler `work`.
fn herald_on_nats(dir: &Path, url: &str, stream: &str) -> Command {
    let mut cmd = herald(dir);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--queue", url])
        .args(["--noop-handler", "work"])
        .env("HERALD_STORE", dir.join("events.db"))
        .env("HERALD_NATS_STREAM", stream)
        .env("HERALD_WORKER_SHUTDOWN_GRACE", "5s");
    cmd
}

/// The consumer's `MaxAckPending` and replicas are herald's settings when
/// herald creates it; a worker that needs more pending is refused with the
/// fix, and one configured for other replicas runs with a warning.
#[tokio::test]
async fn serve_on_nats_creates_the_consumer_from_its_settings_and_checks_it() {
    let test = "serve_on_nats_creates_the_consumer_from_its_settings_and_checks_it";
    let url = herald_nats::testing::nats_url();
    let client = match herald_nats::testing::connect().await {
        Ok(c) => c,
        Err(e) => {
            herald_nats::testing::unreachable(test, &url, &e);
            return;
        }
    };
    let stream = herald_nats::testing::TestStream::adopt(herald_nats::testing::random_prefix());
    let name = stream.name().to_string();
    let dir = tempfile::tempdir().unwrap();

    let mut cmd = herald_on_nats(dir.path(), &url, &name);
    cmd.env("HERALD_NATS_REPLICAS", "1")
        .env("HERALD_NATS_MAX_ACK_PENDING", "4321");
    let mut s = Server::start(cmd);
    // A queue with the same settings passes the check; it reads the consumer.
    let queue = herald_nats::NatsQueue::with_client(
        client,
        herald_nats::NatsConfig {
            max_ack_pending: 4321,
            ..herald_nats::NatsConfig::new(&url, &name, herald::WorkerConfig::default().lease)
        },
    )
    .await
    .unwrap();
    let info = queue
        .jetstream()
        .get_stream(&name)
        .await
        .unwrap()
        .consumer_info(format!("{name}_workers"))
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.max_ack_pending, 4321);
    assert_eq!(info.config.num_replicas, 0, "as many as its stream");
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(20)).success());

    let out = herald_on_nats(dir.path(), &url, &name)
        .env("HERALD_NATS_MAX_ACK_PENDING", "9999")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("herald: queue {url}: queue is misconfigured: consumer {name}_workers: max_ack_pending is 4321, herald needs at least 9999 or unlimited (-1)")),
        "{stderr}"
    );

    let mut cmd = herald_on_nats(dir.path(), &url, &name);
    cmd.env("HERALD_NATS_REPLICAS", "3")
        .env("HERALD_NATS_MAX_ACK_PENDING", "4321");
    let mut s = Server::start(cmd);
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(20)).success());
    assert!(
        s.stderr().contains(&format!(
            "stream {name}: num_replicas is 1, herald is configured for 3"
        )),
        "{}",
        s.stderr()
    );
    drop(stream);
}

/// The password in `queue` is used, and shown nowhere: not in the
/// "listening on" line, not in the logs (even at trace level), not in the
/// error when the server refuses it.
#[tokio::test]
async fn serve_on_nats_with_a_password_never_shows_it() {
    let test = "serve_on_nats_with_a_password_never_shows_it";
    let password = "s3cret-pw";
    let nats = match herald_nats::testing::OwnServer::start_with(&[
        "--user", "herald", "--pass", password,
    ])
    .await
    {
        Ok(n) => n,
        Err(e) => {
            herald_nats::testing::unreachable(test, "a nats-server of its own", &e);
            return;
        }
    };
    let port = nats.port();
    let shown = format!("nats://herald:***@127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();

    let out = herald_on_nats(
        dir.path(),
        &format!("nats://herald:wrong-pw@127.0.0.1:{port}"),
        "herald",
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("herald: queue {shown}: queue is misconfigured: connect to {shown}: the server refused user \"herald\" with the password in the URL (authorization violation)")),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-pw"), "{stderr}");

    let url = format!("nats://herald:{password}@127.0.0.1:{port}");
    let mut child = herald_on_nats(dir.path(), &url, "herald")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        first.contains(&format!(", queue {shown}, handlers: work)")),
        "{first}"
    );
    assert!(!first.contains(password), "{first}");

    let mut cmd = herald_on_nats(dir.path(), &url, "herald");
    cmd.env("HERALD_LOG", "trace");
    let mut s = Server::start(cmd);
    let (status, v) = post(
        &s,
        "/v1/events",
        None,
        json!({"tenant": "acme", "handler": "work", "payload": {}}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, stats, _) = get(&s, "/v1/stats", None).await;
        if stats["recent"]["handlers"]["work"]["emit_to_start_seconds"]["samples"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the event never ran: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(20)).success());
    let stderr = s.stderr();
    assert!(stderr.contains(&format!("queue={shown}")), "{stderr}");
    assert!(!stderr.contains(password), "the password is in the logs");
}

/// `pg_max_connections` bounds the pool: under a burst of emits and runs,
/// the server never holds more connections than that (counted by the
/// server itself, through an `application_name` of the test's own).
#[tokio::test]
async fn serve_on_postgres_keeps_to_pg_max_connections() {
    let test = "serve_on_postgres_keeps_to_pg_max_connections";
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &url);
    let app = schema.name().to_string();
    let sep = if url.contains('?') { '&' } else { '?' };
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--store", &format!("{url}{sep}application_name={app}")])
        .args(["--noop-handler", "work"])
        .env("HERALD_PG_SCHEMA", schema.name())
        .env("HERALD_PG_MAX_CONNECTIONS", "2");
    let mut s = Server::start(cmd);

    let watcher = sqlx::PgPool::connect(&url).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let most = tokio::spawn({
        let stop = stop.clone();
        let app = app.clone();
        async move {
            let mut most = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&app)
                .fetch_one(&watcher)
                .await
                .unwrap();
                most = most.max(n);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        }
    });
    let batches: Vec<_> = (0..10)
        .map(|b| {
            let events: Vec<Value> = (0..100)
                .map(
                    |n| json!({"tenant": "acme", "handler": "work", "payload": {"n": b * 100 + n}}),
                )
                .collect();
            let request = reqwest::Client::new()
                .post(s.url("/v1/events/batch"))
                .json(&json!({ "events": events }));
            tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
        })
        .collect();
    for batch in batches {
        assert_eq!(batch.await.unwrap(), 201);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, stats, _) = get(&s, "/v1/stats", None).await;
        if stats["recent"]["handlers"]["work"]["emit_to_start_seconds"]["samples"] == 1000 {
            break;
        }
        assert!(Instant::now() < deadline, "not every event ran: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = most.await.unwrap();
    assert!((1..=2).contains(&most), "{most} connections");
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(30)).success());
}
