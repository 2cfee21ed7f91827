//! `herald serve` in a hostile environment (issue 50): PostgreSQL
//! unreachable or read-only at start and mid-run, SQLite on a full disk,
//! NATS unreachable at start and mid-run, and a clock minutes off. Each
//! case runs the real binary and checks for a clear error and a non-zero
//! exit at start, or, mid-run, a process that keeps running, logs a
//! bounded number of warnings, and recovers with nothing lost.
//! docs/serve.md, "Hostile environment", describes what is checked here.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::Server;
use herald_postgres::testing::{database_url, reachable, unreachable};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

fn herald(dir: &Path) -> Command {
    let mut c = common::herald(dir);
    c.env("HERALD_LOG", "info");
    c
}

async fn emit(s: &Server, handler: &str, delay: Option<&str>) -> (u16, Value) {
    let mut body = json!({"tenant": "acme", "handler": handler, "payload": {}});
    if let Some(d) = delay {
        body["delay"] = json!(d);
    }
    let r = reqwest::Client::new()
        .post(s.url("/v1/events"))
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("POST /v1/events");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `herald_events_done_total` of `handler`, from `/metrics`.
async fn done(s: &Server, handler: &str) -> u64 {
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("herald_events_done_total{{handler=\"{handler}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Waits until `n` events of `handler` are done; panics past `limit`.
async fn wait_done(s: &Server, handler: &str, n: u64, limit: Duration) {
    let t = Instant::now();
    loop {
        let d = done(s, handler).await;
        if d >= n {
            assert_eq!(d, n, "more runs than events");
            return;
        }
        assert!(
            t.elapsed() < limit,
            "{d} of {n} events done after {limit:?}; stderr:\n{}",
            s.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of `log` at WARN or ERROR.
fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

/// A port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `cmd` to its end (at most `limit`), returning its status, stderr
/// and how long it took.
fn run_to_exit(mut cmd: Command, limit: Duration) -> (std::process::ExitStatus, String, Duration) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, reader.join().unwrap(), t.elapsed());
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still running after {limit:?}; stderr:\n{}",
                reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---- PostgreSQL unreachable at start.

/// With nothing listening, `herald serve` exits 1 within
/// `pg_acquire_timeout`, naming the store (without its password) and the
/// cause.
#[test]
fn postgres_refusing_connections_at_start_is_a_clear_exit_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("postgres://postgres:hunter2@127.0.0.1:{port}/test"))
        .env("HERALD_PG_ACQUIRE_TIMEOUT", "2s");
    let (status, stderr, took) = run_to_exit(cmd, Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(7), "took {took:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "cannot open the store at postgres://postgres@127.0.0.1:{port}/test"
        )) && last.contains("Connection refused")
            && last.contains("tried for 2s"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// A port that accepts connections and never answers (a frozen server, a
/// partition): the same, with "did not answer".
#[test]
fn postgres_black_holed_at_start_is_a_clear_exit_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    // The kernel completes connections into the backlog; nothing reads.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("postgres://postgres:hunter2@127.0.0.1:{port}/test"))
        .env("HERALD_PG_ACQUIRE_TIMEOUT", "2s");
    let (status, stderr, took) = run_to_exit(cmd, Duration::from_secs(30));
    drop(hole);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(7), "took {took:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "cannot open the store at postgres://postgres@127.0.0.1:{port}/test"
        )) && last.contains("did not answer"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

// ---- PostgreSQL read-only.

/// A database of the test's own, dropped on drop.
struct OwnDatabase {
    name: String,
}

impl OwnDatabase {
    async fn create() -> OwnDatabase {
        let name = format!("herald_hostile_{:016x}", rand::random::<u64>());
        admin(&format!("CREATE DATABASE {name}")).await;
        OwnDatabase { name }
    }

    fn url(&self) -> String {
        let o = herald_postgres::testing::connect_options();
        format!(
            "postgres://{}@{}:{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            self.name
        )
    }

    /// Sets `default_transaction_read_only` and ends every session, so
    /// that the pool's next connections have the new setting.
    async fn read_only(&self, on: bool) {
        let set = if on { "on" } else { "off" };
        admin(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = {set}",
            self.name
        ))
        .await;
        admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'",
            self.name
        ))
        .await;
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(admin(&format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )));
        })
        .join()
        .unwrap();
    }
}

/// Runs `sql` on the shared server's `test` database.
async fn admin(sql: &str) {
    let mut conn = PgConnection::connect(&database_url()).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
    let _ = conn.close().await;
}

/// A read-only database at start: exit 1 naming the store and the cause.
/// Made read-only mid-run: emits answer 503 with PostgreSQL's message,
/// the server keeps running with a bounded number of warnings, and once
/// the database takes writes again every acknowledged event runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_postgres_is_refused_at_start_and_answers_503_mid_run() {
    let test = "read_only_postgres_is_refused_at_start_and_answers_503_mid_run";
    if let Err(e) = reachable().await {
        unreachable(test, &database_url(), &e);
        return;
    }
    let db = OwnDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let migrate = herald(dir.path())
        .args(["migrate", "--store", &db.url()])
        .output()
        .unwrap();
    assert!(migrate.status.success(), "{migrate:?}");
    let serve = || {
        let mut cmd = herald(dir.path());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--store", &db.url()])
            .args(["--noop-handler", "work"])
            .env("HERALD_WORKER_SWEEP_EVERY", "1s");
        cmd
    };

    db.read_only(true).await;
    let (status, stderr, _) = run_to_exit(serve(), Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot open the store at postgres://postgres@")
            && last.contains(&db.name)
            && last.contains("read-only"),
        "{stderr}"
    );

    db.read_only(false).await;
    let s = Server::start(serve());
    assert_eq!(emit(&s, "work", None).await.0, 201);
    wait_done(&s, "work", 1, Duration::from_secs(20)).await;
    db.read_only(true).await;
    let before = s.stderr().len();
    for _ in 0..5 {
        let (status, body) = emit(&s, "work", None).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("read-only transaction"), "{body}");
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = s.stderr()[before..].to_string();
    let n = warnings(&during).len();
    eprintln!("{n} warnings in 10 s read-only:\n{during}");
    assert!(n <= 40, "{n} warnings in 10 s:\n{during}");
    db.read_only(false).await;
    let t = Instant::now();
    let mut stored = 0;
    while stored < 3 {
        match emit(&s, "work", None).await.0 {
            201 => stored += 1,
            _ if t.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => panic!("emits still answer {other} 30 s after writes are back"),
        }
    }
    wait_done(&s, "work", 4, Duration::from_secs(30)).await;
}

// ---- PostgreSQL going away mid-run.

/// PostgreSQL stops answering for 10 s: the process keeps running, logs a
/// bounded number of warnings, and once the database answers again the
/// events emitted before the outage run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rides_out_a_postgres_outage_and_recovers_by_itself() {
    let test = "serve_rides_out_a_postgres_outage_and_recovers_by_itself";
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &url);
    let direct = herald_postgres::testing::connect_options();
    let proxy = Proxy::start(format!("{}:{}", direct.get_host(), direct.get_port())).await;
    let proxied = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        direct.get_username(),
        proxy.port,
        direct.get_database().unwrap_or("test")
    );
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store", &proxied])
        .args(["--noop-handler", "work"])
        .env("HERALD_PG_SCHEMA", schema.name())
        .env("HERALD_EMIT_TIMEOUT", "2s")
        .env("HERALD_PG_ACQUIRE_TIMEOUT", "2s")
        .env("HERALD_WORKER_SWEEP_EVERY", "1s");
    let mut s = Server::start(cmd);
    assert_eq!(emit(&s, "work", None).await.0, 201);
    wait_done(&s, "work", 1, Duration::from_secs(20)).await;
    // Delayed events that come due during the outage.
    for _ in 0..3 {
        assert_eq!(emit(&s, "work", Some("2s")).await.0, 201);
    }

    proxy.hold(true);
    let before = s.stderr().len();
    let (status, body) = emit(&s, "work", None).await;
    assert_eq!(status, 503, "{body}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(s.child.try_wait().unwrap().is_none(), "serve exited");
    let during = s.stderr()[before..].to_string();
    let n = warnings(&during).len();
    eprintln!("{n} warnings in 10 s of outage:\n{during}");
    assert!(n <= 40, "{n} warnings in 10 s of outage:\n{during}");

    proxy.hold(false);
    // The 503 may have stored its event all the same (docs/nats.md, "What
    // happens on failures"): 4 or 5 runs.
    let t = Instant::now();
    while done(&s, "work").await < 4 {
        assert!(t.elapsed() < Duration::from_secs(60), "{}", s.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs = done(&s, "work").await;
    assert!(runs == 4 || runs == 5, "{runs} runs");
    assert_eq!(emit(&s, "work", None).await.0, 201);
    wait_done(&s, "work", runs + 1, Duration::from_secs(20)).await;
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(30)).success());
}

// ---- SQLite on a full disk.

/// A 2 MiB tmpfs, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// SQLite's disk fills up: emits answer 503 naming the disk, nothing is
/// half-written (integrity check ok, every acknowledged event runs), the
/// server keeps running, and emits succeed once space is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_answers_503_and_recovers_once_space_is_freed() {
    let test = "sqlite_on_a_full_disk_answers_503_and_recovers_once_space_is_freed";
    let disk = match SmallDisk::mount() {
        Ok(d) => d,
        Err(e) => {
            assert!(
                !herald_postgres::testing::in_ci(),
                "{test}: cannot mount a tmpfs (needs root): {e}"
            );
            eprintln!("SKIPPED {test}: cannot mount a tmpfs (needs root): {e}");
            return;
        }
    };
    let db = disk.path().join("events.db");
    let filler = disk.path().join("filler");
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(&db)
        .args(["--noop-handler", "parked"]);
    let mut s = Server::start(cmd);
    // Events nobody runs (the handler is paused) fill the disk.
    let r = reqwest::Client::new()
        .put(s.url("/v1/tenants/acme/handlers/parked/pause"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "pause: {:?}", r.text().await);
    // Leave a little room, then fill it with emits.
    std::fs::write(&filler, vec![0u8; 1 << 20]).unwrap();
    let payload = "x".repeat(4000);
    let mut acknowledged = 0u64;
    let full = loop {
        let r = reqwest::Client::new()
            .post(s.url("/v1/events"))
            .json(&json!({"tenant": "acme", "handler": "parked", "payload": payload}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        match status {
            201 => acknowledged += 1,
            _ => break (status, body),
        }
        assert!(acknowledged < 2000, "the disk never filled");
    };
    eprintln!("{acknowledged} events stored before the disk filled: {full:?}");
    assert_eq!(full.0, 503, "{:?}", full.1);
    assert_eq!(full.1["error"]["code"], "store_unavailable", "{:?}", full.1);
    assert!(
        full.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk is full"),
        "{:?}",
        full.1
    );
    // It keeps answering the same request the same way, and keeps running.
    // (A smaller event may still fit in the last free page.)
    let again = reqwest::Client::new()
        .post(s.url("/v1/events"))
        .json(&json!({"tenant": "acme", "handler": "parked", "payload": payload}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 503);
    assert!(s.child.try_wait().unwrap().is_none(), "serve exited");

    std::fs::remove_file(&filler).unwrap();
    assert_eq!(emit(&s, "parked", None).await.0, 201);
    acknowledged += 1;
    let r = reqwest::Client::new()
        .delete(s.url("/v1/tenants/acme/handlers/parked/pause"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "unpause: {:?}", r.text().await);
    wait_done(&s, "parked", acknowledged, Duration::from_secs(60)).await;
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(30)).success());
    let check = Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA integrity_check")
        .output();
    match check {
        Ok(out) => assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok"),
        Err(e) => {
            let conn = rusqlite_check(&db);
            assert_eq!(conn, "ok", "integrity_check (sqlite3 not run: {e})");
        }
    }
}

/// Without the `sqlite3` command: whether herald's SQLite store opens the
/// file (a damaged one fails to open).
fn rusqlite_check(db: &Path) -> String {
    match herald_sqlite::SqliteStore::open(db) {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

// ---- NATS unreachable at start and mid-run.

/// With nothing listening, `herald serve` exits 1 after trying for
/// `CONNECT_WAIT` (10 s), naming the queue.
#[test]
fn nats_unreachable_at_start_is_a_clear_exit_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--queue"])
        .arg(format!("nats://u:hunter2@127.0.0.1:{port}"))
        .env("HERALD_STORE", dir.path().join("events.db"));
    let (status, stderr, took) = run_to_exit(cmd, Duration::from_secs(60));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(20), "took {took:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("127.0.0.1:{port}")) && last.contains("tried for 10s"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// A private nats-server killed mid-run: emits keep answering, the worker
/// logs a bounded number of warnings, and once the server is back every
/// event emitted during the outage runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rides_out_a_nats_outage_and_runs_what_was_emitted_during_it() {
    let test = "serve_rides_out_a_nats_outage_and_runs_what_was_emitted_during_it";
    let mut nats = match herald_nats::testing::OwnServer::start().await {
        Ok(n) => n,
        Err(e) => {
            herald_nats::testing::unreachable(test, "nats-server", &e);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = herald(dir.path());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--queue", &nats.url()])
        .args(["--noop-handler", "work"])
        .env("HERALD_STORE", dir.path().join("events.db"))
        .env("HERALD_WORKER_SWEEP_EVERY", "1s")
        .env("HERALD_WORKER_SWEEP_QUIET", "2s");
    let mut s = Server::start(cmd);
    assert_eq!(emit(&s, "work", None).await.0, 201);
    wait_done(&s, "work", 1, Duration::from_secs(20)).await;

    nats.stop();
    let before = s.stderr().len();
    for _ in 0..5 {
        let t = Instant::now();
        let (status, body) = emit(&s, "work", None).await;
        assert_eq!(status, 201, "{body}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "an emit took {:?}",
            t.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(s.child.try_wait().unwrap().is_none(), "serve exited");
    let during = s.stderr()[before..].to_string();
    let n = warnings(&during).len();
    eprintln!("{n} warnings in 10 s without NATS:\n{during}");
    assert!(n <= 40, "{n} warnings in 10 s without NATS:\n{during}");

    nats.restart().await.unwrap();
    wait_done(&s, "work", 6, Duration::from_secs(60)).await;
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(30)).success());
}

// ---- A clock minutes off.

/// libfaketime's multi-threaded library (Debian's `faketime` package), or
/// why the test cannot run.
fn libfaketime() -> Result<&'static str, String> {
    const LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    if Path::new(LIB).exists() {
        Ok(LIB)
    } else {
        Err(format!(
            "{LIB} is missing: install libfaketime (apt-get install faketime)"
        ))
    }
}

/// `herald serve` under a clock `offset` off, on PostgreSQL and a private
/// NATS: an emit's delay counts from the database's clock and travels on
/// NATS as a duration, so an immediate event runs at once and a delayed
/// one neither early nor late; leases are judged by the database's clock
/// and the worker's monotonic one, so a run longer than half its lease is
/// not rescued early (each event runs once). docs/serve.md, "Hostile
/// environment".
async fn skewed(offset: &str) {
    let test = format!("a_clock_{offset}_off");
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(&test, &url, &e);
        return;
    }
    let lib = match libfaketime() {
        Ok(lib) => lib,
        Err(e) => {
            assert!(!herald_postgres::testing::in_ci(), "{test}: {e}");
            eprintln!("SKIPPED {test}: {e}");
            return;
        }
    };
    let nats = match herald_nats::testing::OwnServer::start().await {
        Ok(n) => n,
        Err(e) => {
            herald_nats::testing::unreachable(&test, "nats-server", &e);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &url);
    let runs = dir.path().join("runs");
    std::fs::write(
        dir.path().join("herald.toml"),
        format!(
            r#"
[worker]
lease = "4s"
sweep_every = "1s"
[handlers.slow]
kind = "command"
program = "sh"
args = ["-c", "echo run >> {}; sleep 3"]
"#,
            runs.display()
        ),
    )
    .unwrap();
    // Preloaded into herald itself (not through the `faketime` command,
    // which stays the parent), so that the test's signals reach it.
    let mut cmd = herald(dir.path());
    cmd.env("LD_PRELOAD", lib)
        .env("FAKETIME", offset)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &url])
        .args(["--queue", &nats.url(), "--noop-handler", "work"])
        .env("HERALD_PG_SCHEMA", schema.name())
        .env("HERALD_CONFIG", dir.path().join("herald.toml"));
    let mut s = Server::start(cmd);

    let t = Instant::now();
    assert_eq!(emit(&s, "work", None).await.0, 201);
    wait_done(&s, "work", 1, Duration::from_secs(10)).await;
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "an immediate event ran {:?} after its emit",
        t.elapsed()
    );

    // Delayed by 3 s: not run before (a clock behind used to run it at
    // once), and not minutes late (a clock ahead used to add its offset).
    let t = Instant::now();
    assert_eq!(emit(&s, "work", Some("3s")).await.0, 201);
    while t.elapsed() < Duration::from_millis(2800) {
        assert_eq!(
            done(&s, "work").await,
            1,
            "the delayed event ran {:?} after its emit",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_done(&s, "work", 2, Duration::from_secs(10)).await;
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "an event delayed by 3 s ran {:?} after its emit",
        t.elapsed()
    );

    for _ in 0..3 {
        assert_eq!(emit(&s, "slow", None).await.0, 201);
    }
    wait_done(&s, "slow", 3, Duration::from_secs(30)).await;
    // Past any rescue a lease judged by a wrong clock would bring.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(ran.lines().count(), 3, "runs: {ran}");

    // A schedule made under the skewed clock: its first occurrence is the
    // first after the database's now, not one the offset away.
    let t = Instant::now();
    let r = reqwest::Client::new()
        .put(s.url("/v1/tenants/acme/schedules/tick"))
        .json(&json!({"handler": "work", "every": "2s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_done(&s, "work", 3, Duration::from_secs(10)).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a schedule of every 2 s first ran {:?} after it was made",
        t.elapsed()
    );
    s.signal("-TERM");
    assert!(s.wait(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_minutes_behind_rescues_no_lease_early() {
    skewed("-5m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_minutes_ahead_runs_immediate_events_at_once_and_delayed_ones_on_time() {
    skewed("+5m").await;
}
