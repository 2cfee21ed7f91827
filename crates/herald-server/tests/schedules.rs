//! A schedule's occurrences, emitted by two `herald serve` processes on one
//! PostgreSQL schema, across a SIGKILL of the scheduler's leader, its
//! restart, and a SIGKILL of both followed by a restart: every occurrence
//! from the first to the last is emitted exactly once (the events table,
//! with done events kept, is the ledger). The outages are shorter than the
//! scheduler's grace (60 s), so no occurrence counts as missed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::Server;
use herald::backend::EventFilter;
use herald::backend::Operator;
use herald_postgres::testing::{connect_options, database_url, reachable, unreachable};
use herald_postgres::PgStore;

const TENANT: &str = "ledger";

fn serve(dir: &Path, config: &Path) -> Server {
    let mut cmd = common::herald(dir);
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--noop-handler", "tick"])
        .env("HERALD_LOG", "info,herald::worker::schedule=debug");
    Server::start(cmd)
}

fn leads(s: &Server) -> bool {
    s.stderr()
        .lines()
        .rev()
        .find(|l| l.contains("scheduler leadership changed"))
        .is_some_and(|l| l.contains("leading=true"))
}

/// Waits until exactly one of `servers` says it leads the scheduler.
fn leader(servers: &[&Server]) -> usize {
    let start = Instant::now();
    loop {
        let leading: Vec<usize> = (0..servers.len()).filter(|&i| leads(servers[i])).collect();
        if let [one] = leading[..] {
            return one;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no single scheduler leader: {leading:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kill9(s: &mut Server) {
    s.signal("-KILL");
    s.wait(Duration::from_secs(5));
}

/// The occurrence times of the tenant's events, each with how many events
/// it has.
async fn ledger(store: &PgStore) -> BTreeMap<i64, usize> {
    let events = store
        .list(
            &EventFilter {
                tenant: Some(TENANT.into()),
                ..EventFilter::default()
            },
            10_000,
        )
        .await
        .expect("list");
    let mut out = BTreeMap::new();
    for e in events {
        *out.entry(e.run_at.0).or_insert(0) += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_occurrence_is_emitted_once_across_sigkill_and_restarts() {
    let db = database_url();
    if let Err(e) = reachable().await {
        unreachable("schedules", &db, &e);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = common::migrated_schema(dir.path(), &db);
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "{db}"
pg_schema = "{schema}"
listen = "127.0.0.1:0"
[worker]
lease = "2s"
schedule_every = "200ms"
done_retention = "1h"
[[schedules]]
tenant = "{TENANT}"
name = "every-second"
handler = "tick"
every = "1s"
"#,
            schema = schema.name()
        ),
    )
    .unwrap();
    let store = PgStore::connect_with(
        sqlx::postgres::PgPoolOptions::new().max_connections(2),
        connect_options(),
        schema.name(),
    )
    .await
    .expect("connect");
    let started = Instant::now();
    let mut a = serve(dir.path(), &config);
    let mut b = serve(dir.path(), &config);
    std::thread::sleep(Duration::from_secs(3));
    // SIGKILL the leader; the other takes over once its lease lapses.
    let first = leader(&[&a, &b]);
    let (dead, alive) = if first == 0 {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    kill9(dead);
    let killed_at = Instant::now();
    let start = Instant::now();
    while !leads(alive) {
        assert!(start.elapsed() < Duration::from_secs(15), "no takeover");
        std::thread::sleep(Duration::from_millis(100));
    }
    let takeover = killed_at.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    // Restart the killed one: two processes again.
    *dead = serve(dir.path(), &config);
    std::thread::sleep(Duration::from_secs(3));
    // Both killed at once, a pause, then one restarted: it catches up
    // from the cursor in the store.
    kill9(&mut a);
    kill9(&mut b);
    std::thread::sleep(Duration::from_secs(3));
    let mut c = serve(dir.path(), &config);
    std::thread::sleep(Duration::from_secs(4));
    c.signal("-TERM");
    c.wait(Duration::from_secs(15));

    let ledger = ledger(&store).await;
    let times: Vec<i64> = ledger.keys().copied().collect();
    assert!(times.len() >= 12, "{} occurrences: {times:?}", times.len());
    let twice: Vec<(&i64, &usize)> = ledger.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "occurrences emitted more than once: {twice:?}"
    );
    let gaps: Vec<i64> = times
        .windows(2)
        .filter(|w| w[1] - w[0] != 1000)
        .map(|w| w[0])
        .collect();
    assert!(gaps.is_empty(), "gaps after {gaps:?} in {times:?}");
    eprintln!(
        "schedules ledger: {} consecutive occurrences, each once, over {:?}; takeover after SIGKILL {:?}",
        times.len(),
        started.elapsed(),
        takeover
    );
}

/// The names and cadences of the schedules `GET /v1/schedules` lists.
async fn listed(s: &Server) -> Vec<(String, String, String)> {
    let v: serde_json::Value = reqwest::get(s.url("/v1/schedules"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let cadence = s["cron"].as_str().or(s["every"].as_str()).unwrap_or("-");
            (
                s["name"].as_str().unwrap().to_string(),
                cadence.to_string(),
                s["source"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// herald.toml's schedules and subscriptions are applied on start and on
/// SIGHUP: a changed schedule is rewritten, one gone from the file is
/// deleted (a subscription too), the API's are left alone, and a refused
/// file changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_the_files_schedules_and_subscriptions_and_leaves_the_apis() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    let write = |schedules: &str| {
        std::fs::write(
            &config,
            format!(
                "store = \"sqlite://{}\"\nlisten = \"127.0.0.1:0\"\n{schedules}",
                dir.path().join("herald.db").display()
            ),
        )
        .unwrap()
    };
    let one = |name: &str, cadence: &str| {
        format!("[[schedules]]\ntenant = \"acme\"\nname = \"{name}\"\nhandler = \"h\"\n{cadence}\n")
    };
    let subscription =
        |topic: &str| format!("[[subscriptions]]\ntopic = \"{topic}\"\nhandler = \"h\"\n");
    write(&format!(
        "{}{}{}{}",
        one("a", "every = \"1h\""),
        one("b", "cron = \"0 0 * * *\""),
        subscription("user.signup"),
        subscription("order.paid"),
    ));
    let s = serve(dir.path(), &config);
    assert_eq!(subscribed(&s).await, ["order.paid", "user.signup"]);
    let r = reqwest::Client::new()
        .put(s.url("/v1/tenants/acme/schedules/mine"))
        .json(&serde_json::json!({"handler": "h", "every": "1m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let t = |n: &str, c: &str, src: &str| (n.to_string(), c.to_string(), src.to_string());
    assert_eq!(
        listed(&s).await,
        [
            t("a", "1h", "config"),
            t("b", "0 0 * * *", "config"),
            t("mine", "1m", "api")
        ]
    );
    write(&format!(
        "{}{}",
        one("a", "every = \"2h\""),
        subscription("order.paid")
    ));
    s.signal("-HUP");
    let start = Instant::now();
    let want = [t("a", "2h", "config"), t("mine", "1m", "api")];
    while listed(&s).await != want || subscribed(&s).await != ["order.paid"] {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?} {:?}",
            listed(&s).await,
            subscribed(&s).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A refused file: nothing changes, the server lives on.
    write(&one("a", "every = \"0s\""));
    s.signal("-HUP");
    let start = Instant::now();
    while !s.stderr().contains("the configuration is refused") {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", s.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.stderr().contains("schedules[0].every"), "{}", s.stderr());
    assert_eq!(listed(&s).await, want);
    assert_eq!(subscribed(&s).await, ["order.paid"]);
}

/// The topics of the subscriptions `GET /v1/topics` lists, sorted.
async fn subscribed(s: &Server) -> Vec<String> {
    let v: serde_json::Value = reqwest::get(s.url("/v1/topics"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut topics: Vec<String> = v["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["topic"].as_str().unwrap().to_string())
        .collect();
    topics.sort();
    topics
}
