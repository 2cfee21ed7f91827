//! Worker processes killed with SIGKILL mid-handler, sharing one SQLite file.
//!
//! The test re-executes its own binary as the child worker (the
//! `child_worker` test does nothing unless `HERALD_TEST_CHILD_DB` is set).

use herald::backend::{EventStore, Operator};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald::{Context, EventId, EventState, MemoryQueue, NewEvent, Worker, WorkerConfig};
use herald_sqlite::SqliteStore;

const CHILD_ENV: &str = "HERALD_TEST_CHILD_DB";
const LEASE: Duration = Duration::from_secs(3);

fn config() -> WorkerConfig {
    WorkerConfig {
        lease: LEASE,
        // At most a heartbeat apart, so a rescue comes within a lease and a heartbeat.
        sweep_every: LEASE / 3,
        ..WorkerConfig::default()
    }
}

fn marker(db: &Path) -> PathBuf {
    db.with_extension("started")
}

/// The child: a worker whose handler notes its start and then hangs.
#[test]
fn child_worker() {
    let Ok(db) = std::env::var(CHILD_ENV) else {
        return;
    };
    let db = PathBuf::from(db);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let store = Arc::new(SqliteStore::open(&db).expect("open"));
        let queue = Arc::new(MemoryQueue::new(LEASE));
        let marker = marker(&db);
        let _worker = Worker::builder(store, queue)
            .config(config())
            .handler("slow", move |_: serde_json::Value, cx: Context| {
                let marker = marker.clone();
                async move {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&marker)
                        .expect("marker");
                    writeln!(f, "{} {}", cx.event_id, cx.attempt).expect("write marker");
                    f.sync_all().expect("sync marker");
                    std::future::pending::<()>().await;
                }
            })
            .start();
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

fn spawn_child(db: &Path) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args(["--exact", "child_worker", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, db)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the child worker")
}

/// Waits until the marker file has `n` lines (handler starts) and returns the last.
async fn wait_for_start(db: &Path, n: usize) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(marker(db)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() >= n {
            return lines[n - 1].to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child worker did not start the handler"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn emit(store: &SqliteStore, max_attempts: u32) -> EventId {
    let e = NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: "acme".into(),
        handler: "slow".into(),
        payload: "{}".into(),
        run_at: herald::RunAt::NOW,
        max_attempts,
        idempotency_key: None,
        topic: None,
    };
    store.emit(std::slice::from_ref(&e)).await.expect("emit");
    e.id
}

fn kill(mut child: Child) -> Instant {
    child.kill().expect("SIGKILL the child");
    let at = Instant::now();
    child.wait().expect("reap the child");
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_event_runs_again_within_a_lease_and_a_heartbeat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("kill.db");
    let store = Arc::new(SqliteStore::open(&db).expect("open"));
    let id = emit(&store, 5).await;

    let child = spawn_child(&db);
    let line = wait_for_start(&db, 1).await;
    assert_eq!(line, format!("{id} 1"));
    let killed_at = kill(child);

    let reran: Arc<Mutex<Vec<(Instant, u32)>>> = Arc::default();
    let r = reran.clone();
    let worker = Worker::builder(store.clone(), Arc::new(MemoryQueue::new(LEASE)))
        .config(config())
        .handler("slow", move |_: serde_json::Value, cx: Context| {
            r.lock().unwrap().push((Instant::now(), cx.attempt));
            async {}
        })
        .start();
    let deadline = Instant::now() + Duration::from_secs(30);
    while reran.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the event never ran again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (at, attempt) = reran.lock().unwrap()[0];
    let rescue = at - killed_at;
    println!(
        "rescued {rescue:?} after SIGKILL (bound: lease {LEASE:?} + heartbeat {:?})",
        LEASE / 3
    );
    assert_eq!(attempt, 2, "the killed run used attempt 1");
    // The bound, plus a little for scheduling on a busy machine.
    assert!(
        rescue <= LEASE + LEASE / 3 + Duration::from_millis(500),
        "rescued only {rescue:?} after the kill"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        reran.lock().unwrap().len(),
        1,
        "ran exactly once after the kill"
    );
    assert!(store.get(id).await.unwrap().is_none(), "done and deleted");
    worker.shutdown(Duration::from_secs(5)).await;
}

/// `attempt` counts claims: a handler that kills its worker every time
/// ends dead after its attempts, not in a crash loop forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_kills_its_worker_every_time_ends_dead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("crashloop.db");
    let store = Arc::new(SqliteStore::open(&db).expect("open"));
    let id = emit(&store, 2).await;
    for attempt in 1..=2 {
        let child = spawn_child(&db);
        let line = wait_for_start(&db, attempt).await;
        assert_eq!(line, format!("{id} {attempt}"));
        kill(child);
    }
    let ran = Arc::new(Mutex::new(0));
    let r = ran.clone();
    let worker = Worker::builder(store.clone(), Arc::new(MemoryQueue::new(LEASE)))
        .config(config())
        .handler("slow", move |_: serde_json::Value, _cx: Context| {
            *r.lock().unwrap() += 1;
            async {}
        })
        .start();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let e = store.get(id).await.unwrap().expect("dead events are kept");
        if e.state == EventState::Dead {
            assert_eq!(e.attempt, 2);
            let error = e.last_error.unwrap_or_default();
            assert!(error.contains("2/2"), "{error}");
            break;
        }
        assert!(Instant::now() < deadline, "the event never went dead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*ran.lock().unwrap(), 0, "no third run");
    assert_eq!(worker.stats().buried, 1);
    worker.shutdown(Duration::from_secs(5)).await;
}
