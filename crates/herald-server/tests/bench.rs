//! `herald bench` through the real binary, small: each scenario runs to its
//! end, its result line says what it measured, and its hook sees the phases
//! in the contract's order (bench/peers/README.md). A drain also checks by
//! itself that the store holds exactly the backlog afterwards, and exits
//! non-zero if not, which these tests would see.

use std::path::Path;

use serde_json::Value;

mod common;

use common::herald;

/// Runs `herald bench ARGS… --hook 'echo >>DIR/phases'` in `dir`; returns
/// its result line and the phases its hook saw.
fn bench(dir: &Path, args: &[&str]) -> (Value, Vec<String>) {
    let phases = dir.join("phases");
    let _ = std::fs::remove_file(&phases);
    let hook = format!("echo >>{}", phases.display());
    let out = herald(dir)
        .arg("bench")
        .args(args)
        .args(["--dir", &dir.display().to_string(), "--hook", &hook])
        .output()
        .expect("run herald bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "herald bench {args:?} failed: {stderr}"
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
        &[
            "drain",
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
        phases(&["after-backlog", "drain-start", "mid-drain", "drain-end"])
    );
}

#[test]
fn latency_on_sqlite_measures_every_offered_event_at_each_rate() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("latency.svg");
    let (result, seen) = bench(
        dir.path(),
        &[
            "latency",
            "--rate",
            "100,300",
            "--seconds",
            "1",
            "--chart",
            &chart.display().to_string(),
        ],
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
    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    assert!(svg.contains("<svg"), "not an SVG");
    assert_eq!(seen.first().map(String::as_str), Some("run-start"));
    assert_eq!(seen.last().map(String::as_str), Some("run-end"));
}

#[test]
fn emit_on_sqlite_counts_single_and_batched_emits() {
    let dir = tempfile::tempdir().unwrap();
    let (result, _) = bench(
        dir.path(),
        &[
            "emit",
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
fn bench_refuses_serves_own_postgres_schema() {
    let dir = tempfile::tempdir().unwrap();
    let out = herald(dir.path())
        .args(["bench", "drain", "--events", "10"])
        .args([
            "--store",
            "postgres://postgres@127.0.0.1:1/none",
            "--schema",
            "herald",
        ])
        .output()
        .expect("run herald bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("herald"), "{stderr}");
}

#[tokio::test]
async fn drain_on_postgres_drops_its_schema_afterwards() {
    use herald_postgres::testing::{self, TestSchema};
    let test = "bench::drain_on_postgres_drops_its_schema_afterwards";
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
        &[
            "drain",
            "--events",
            "3000",
            "--backlog",
            "2000",
            "--store",
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
