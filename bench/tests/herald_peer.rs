//! `herald-peer` through the real binary, small: each scenario runs to its
//! end, its result line says what it measured, and its hook sees the phases
//! in the contract's order (bench/peers/README.md). A drain also checks by
//! itself that the store holds exactly the backlog afterwards, and exits
//! non-zero if not, which these tests would see.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The `herald-peer` binary, run in `dir`, inheriting no `HERALD_…`
/// variable from the test's environment.
fn herald_peer(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_herald-peer"));
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            c.env_remove(k);
        }
    }
    c
}

/// Runs `herald-peer --scenario SCENARIO ARGS… --hook 'echo >>DIR/phases'`
/// in `dir`; returns its result line and the phases its hook saw.
fn bench(dir: &Path, scenario: &str, args: &[&str]) -> (Value, Vec<String>) {
    let phases = dir.join("phases");
    let _ = std::fs::remove_file(&phases);
    let hook = format!("echo >>{}", phases.display());
    let out = herald_peer(dir)
        .args(["--scenario", scenario])
        .args(args)
        .args(["--dir", &dir.display().to_string(), "--hook", &hook])
        .output()
        .expect("run herald-peer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "herald-peer {scenario} {args:?} failed: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {last:?}\n{stderr}"));
    let seen = std::fs::read_to_string(&phases)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    (result, seen)
}

fn phases(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn drain_on_sqlite_runs_every_runnable_event_and_leaves_the_paused_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (result, seen) = bench(
        dir.path(),
        "drain",
        &[
            "--events",
            "3000",
            "--backlog",
            "2000",
            "--backlog-kind",
            "paused",
            "--backlog-tenants",
            "50",
        ],
    );
    assert_eq!(result["scenario"], "drain");
    assert_eq!(result["store"], "sqlite");
    assert_eq!(result["events"], 3000);
    assert_eq!(result["backlog"], 2000);
    assert_eq!(result["backlog_kind"], "paused");
    assert!(result["events_per_s"].as_f64().unwrap() > 0.0, "{result}");
    assert!(result["knobs"].is_object(), "{result}");
    assert_eq!(
        seen,
        phases(&[
            "after-backlog",
            "backlog-parked",
            "drain-start",
            "mid-drain",
            "drain-end"
        ])
    );
}

#[test]
fn latency_on_sqlite_measures_every_offered_event_at_each_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (result, seen) = bench(
        dir.path(),
        "latency",
        &["--rate", "100,300", "--seconds", "1"],
    );
    assert_eq!(result["scenario"], "latency");
    let points = result["points"].as_array().expect("one point per rate");
    assert_eq!(points.len(), 2, "{result}");
    for p in points {
        assert!(p["offered"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["completed"], p["offered"], "every offered event ran: {p}");
        assert!(p["latency_ms"]["p50"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["latency_ms"]["p99"].as_f64() >= p["latency_ms"]["p50"].as_f64());
    }
    assert_eq!(seen.first().map(String::as_str), Some("run-start"));
    assert_eq!(seen.last().map(String::as_str), Some("run-end"));
}

#[test]
fn long_horizon_on_sqlite_reports_every_window_and_runs_every_offered_event() {
    let dir = tempfile::tempdir().unwrap();
    let (result, seen) = bench(
        dir.path(),
        "long-horizon",
        &[
            "--rate",
            "200",
            "--seconds",
            "3",
            "--work-ms",
            "2",
            "--window",
            "1",
        ],
    );
    assert_eq!(result["scenario"], "long-horizon");
    assert_eq!(result["work_ms"], 2.0);
    let offered = result["offered"].as_u64().unwrap();
    assert!(offered > 0, "{result}");
    assert_eq!(result["completed"], offered, "every offered event ran");
    let windows = result["windows"].as_array().expect("windows");
    assert!(windows.len() >= 3, "three seconds in 1 s windows: {result}");
    let in_windows: u64 = windows
        .iter()
        .map(|w| w["completed"].as_u64().unwrap())
        .sum();
    assert_eq!(in_windows, offered, "every start falls in one window");
    assert_eq!(seen, phases(&["run-start", "run-end"]));
}

#[test]
fn emit_on_sqlite_counts_single_and_batched_emits() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = bench(
        dir.path(),
        "emit",
        &[
            "--single",
            "300",
            "--batched",
            "3000",
            "--batch-size",
            "500",
        ],
    );
    assert_eq!(result["scenario"], "emit");
    assert!(result["single_per_s"].as_f64().unwrap() > 0.0, "{result}");
    assert!(result["batched_per_s"].as_f64().unwrap() > 0.0, "{result}");
}

#[test]
fn topic_on_sqlite_stores_the_events_of_each_subscriber_count() {
    let dir = tempfile::tempdir().unwrap();
    let (result, seen) = bench(
        dir.path(),
        "topic",
        &["--subscribers", "1,10,100", "--events", "1000"],
    );
    assert_eq!(result["scenario"], "topic");
    let points = result["topics"].as_array().expect("topics");
    let counts: Vec<u64> = points
        .iter()
        .map(|p| p["subscribers"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 10, 100], "{result}");
    for p in points {
        assert_eq!(p["events"], 1000, "{result}");
        assert!(p["events_per_s"].as_f64().unwrap() > 0.0, "{result}");
    }
    assert_eq!(result["events"], 3000);
    assert_eq!(
        seen,
        phases(&[
            "topic-1-start",
            "topic-1-end",
            "topic-10-start",
            "topic-10-end",
            "topic-100-start",
            "topic-100-end"
        ])
    );
}

#[test]
fn refuses_serves_own_postgres_schema() {
    let dir = tempfile::tempdir().unwrap();
    let out = herald_peer(dir.path())
        .args(["--scenario", "drain", "--events", "10"])
        .args([
            "--url",
            "postgres://postgres@127.0.0.1:1/none",
            "--schema",
            "herald",
        ])
        .output()
        .expect("run herald-peer");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("herald"), "{stderr}");
}

#[tokio::test]
async fn drain_on_postgres_drops_its_schema_afterwards() {
    use herald_postgres::testing::{self, TestSchema};
    let test = "herald_peer::drain_on_postgres_drops_its_schema_afterwards";
    let url = testing::database_url();
    if let Err(e) = testing::reachable().await {
        testing::unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Dropped by the run itself; the guard only cleans up after a failure.
    let schema = TestSchema::adopt(TestSchema::random_name());
    let (result, seen) = bench(
        dir.path(),
        "drain",
        &[
            "--events",
            "3000",
            "--backlog",
            "2000",
            "--url",
            &url,
            "--schema",
            schema.name(),
        ],
    );
    assert_eq!(result["store"], "postgres");
    assert_eq!(result["events"], 3000);
    assert_eq!(
        seen,
        phases(&["after-backlog", "drain-start", "mid-drain", "drain-end"])
    );
    let mut conn = sqlx::PgConnection::connect_with(&testing::connect_options())
        .await
        .unwrap();
    use sqlx::Connection as _;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
    )
    .bind(schema.name())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, 0, "the bench schema was dropped after the run");
}

/// The victim holds every event in handlers that never return and is
/// SIGKILLed; the rescuer, another process on the same schema, runs every
/// one of them once its leases lapse.
#[tokio::test]
async fn rescue_on_postgres_runs_every_event_the_killed_victim_held() {
    use herald_postgres::testing::{self, TestSchema};
    use std::io::BufRead as _;
    let test = "herald_peer::rescue_on_postgres_runs_every_event_the_killed_victim_held";
    let url = testing::database_url();
    if let Err(e) = testing::reachable().await {
        testing::unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = TestSchema::adopt(TestSchema::random_name());
    let phases_file = dir.path().join("phases");
    let hook = format!("echo >>{}", phases_file.display());
    let common = |role: &str| {
        let mut c = herald_peer(dir.path());
        c.args(["--scenario", "rescue", "--role", role, "--events", "300"])
            .args(["--url", &url, "--schema", schema.name(), "--hook", &hook])
            .env("HERALD_WORKER_LEASE", "2s")
            .env("HERALD_WORKER_SWEEP_EVERY", "500ms")
            .env("HERALD_WORKER_CONCURRENCY", "100")
            // Every event leased by the victim: none waits on a
            // notification that died with its in-process queue.
            .env("HERALD_WORKER_CLAIM_AHEAD", "300");
        c
    };
    let mut victim = common("victim")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the victim");
    let line = std::io::BufReader::new(victim.stdout.take().unwrap())
        .lines()
        .next()
        .expect("the victim says it holds the events")
        .unwrap();
    let held: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(held["role"], "victim", "{held}");
    assert_eq!(held["running"], 100, "every slot busy: {held}");
    victim.kill().expect("SIGKILL the victim");
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    victim.wait().unwrap();
    let out = common("rescuer")
        .args(["--killed-at", &killed_at, "--timeout", "60"])
        .output()
        .expect("run the rescuer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the rescuer failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(result["role"], "rescuer");
    assert_eq!(result["timed_out"], false, "{result}\n{stderr}");
    assert_eq!(result["completed"], 300, "every held event ran: {result}");
    let rescue_s = result["rescue_s"].as_f64().unwrap();
    // Not before the victim's leases could have lapsed (renewed at most a
    // third of a lease before the kill), and well inside the timeout.
    assert!(rescue_s > 1.0 && rescue_s < 60.0, "{result}");
    assert_eq!(result["knobs"]["rescue_after_s"], 2.5, "{result}");
    let seen = std::fs::read_to_string(&phases_file).unwrap();
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        ["victim-running", "rescue-start", "rescue-end"]
    );
}
