//! A single `herald serve` killed with SIGKILL mid-handler and restarted at
//! once on the same address: its event runs again within a lease and a
//! heartbeat of the kill, on SQLite and on PostgreSQL, whatever
//! `sweep_every` says and although the dead process held the reconciler's
//! leader row.
//!
//! Before, the restarted process waited out the dead one's leader lease,
//! `max(lease, 2 × sweep_every)` (20 s with this test's lease of 3 s and
//! `sweep_every` of 10 s), then swept every `sweep_every`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{herald, Server};
use herald::Millis;
use herald_postgres::testing::{database_url, reachable, unreachable};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(3);

/// A free port on loopback, for a server that must come back on the same
/// address (and so under the same default worker name).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `herald.toml` with a command that notes `attempt ms` and then hangs.
fn write_config(dir: &Path, runs: &Path) {
    std::fs::write(
        dir.join("herald.toml"),
        format!(
            "[worker]\nlease = \"{}s\"\nsweep_every = \"10s\"\nshutdown_grace = \"0s\"\n\n\
             [handlers.slow]\nkind = \"command\"\nprogram = \"/bin/sh\"\n\
             args = [\"-c\", \"echo \\\"$HERALD_ATTEMPT $(date +%s%3N)\\\" >> {}; exec sleep 1000\"]\n\
             timeout = \"1h\"\n",
            LEASE.as_secs(),
            runs.display()
        ),
    )
    .unwrap();
}

/// The runs noted so far: (attempt, start in ms).
fn runs(file: &Path) -> Vec<(u32, i64)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (a, t) = l.split_once(' ')?;
            Some((a.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}

fn wait_for_run(file: &Path, attempt: u32, within: Duration) -> i64 {
    let start = Instant::now();
    loop {
        if let Some((_, at)) = runs(file).into_iter().find(|(a, _)| *a == attempt) {
            return at;
        }
        assert!(
            start.elapsed() < within,
            "attempt {attempt} did not start within {within:?}; runs: {:?}",
            runs(file)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn kill_and_restart(dir: &Path, serve: impl Fn() -> Command) {
    let runs_file = dir.join("runs.txt");
    write_config(dir, &runs_file);
    let mut first = Server::start(serve());
    let client = reqwest::Client::new();
    let res = client
        .post(first.url("/v1/events"))
        .json(&json!({"tenant": "acme", "handler": "slow", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "{}", res.text().await.unwrap());
    wait_for_run(&runs_file, 1, Duration::from_secs(20));
    // Past a heartbeat, so that the lease has been renewed at least once.
    std::thread::sleep(LEASE / 2);
    first.child.kill().unwrap();
    let killed_at = Millis::now().0;
    first.child.wait().unwrap();
    let second = Server::start(serve());
    let rerun_at = wait_for_run(&runs_file, 2, Duration::from_secs(30));
    let rescue = Duration::from_millis((rerun_at - killed_at).max(0) as u64);
    println!("rescued {rescue:?} after SIGKILL and restart (lease {LEASE:?})");
    // The lease lapses within a lease of the kill; the restarted process
    // sweeps at least every heartbeat (lease / 3). The margin is for a
    // busy machine starting a process.
    let bound = LEASE + LEASE / 3 + Duration::from_millis(1500);
    assert!(
        rescue <= bound,
        "rescued {rescue:?} after the kill, more than {bound:?}; stderr:\n{}",
        second.stderr()
    );
}

#[tokio::test]
async fn a_restarted_server_on_sqlite_rescues_its_event_within_a_lease_and_a_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let path = dir.path().to_path_buf();
    kill_and_restart(dir.path(), || {
        let mut c = herald(&path);
        c.args(["serve", "--listen", &listen]);
        c
    })
    .await;
}

#[tokio::test]
async fn a_restarted_server_on_postgres_rescues_its_event_within_a_lease_and_a_heartbeat() {
    let test = "a_restarted_server_on_postgres_rescues_its_event_within_a_lease_and_a_heartbeat";
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &url, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &url);
    let listen = format!("127.0.0.1:{}", free_port());
    let path = dir.path().to_path_buf();
    kill_and_restart(dir.path(), || {
        let mut c = herald(&path);
        c.args(["serve", "--store", &url, "--listen", &listen])
            .env("HERALD_PG_SCHEMA", schema.name());
        c
    })
    .await;
}
