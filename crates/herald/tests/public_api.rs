//! The public API as a program outside the crate meets it: every type a
//! public signature makes a user name is named here from `herald::` (this
//! file compiles only if they are exported), and the typed emit paths agree
//! about max attempts, on a real store (SQLite).

use std::sync::Arc;
use std::time::Duration;

use herald::{
    Client, ClientError, Context, EmitOptions, EmitRequest, Emitted, EventId, EventState,
    HandlerError, Job, MemoryQueue, Queue, RunObserver, RunSettled, StatsSnapshot, Store, Worker,
    WorkerConfig, WorkerConfigError, WorkerStats,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Fragile {
    n: u32,
}

impl Job for Fragile {
    const NAME: &'static str = "fragile";
    const MAX_ATTEMPTS: u32 = 3;
    async fn run(self, _cx: Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

struct Rig {
    store: Arc<dyn Store>,
    client: Client,
    queue: Arc<MemoryQueue>,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(herald_sqlite::SqliteStore::open(dir.path().join("h.db")).unwrap());
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(3)));
    let client = Client::new(store.clone(), queue.clone());
    Rig {
        store,
        client,
        queue,
        _dir: dir,
    }
}

async fn max_attempts(store: &Arc<dyn Store>, id: EventId) -> u32 {
    store.get(id).await.unwrap().expect("stored").max_attempts
}

#[tokio::test]
async fn every_typed_emit_path_stores_the_jobs_max_attempts() {
    let r = rig();
    let one = r.client.emit("acme", &Fragile { n: 0 }).await.unwrap();
    let many = r
        .client
        .emit_many("acme", &[Fragile { n: 1 }, Fragile { n: 2 }])
        .await
        .unwrap();
    let batch = r
        .client
        .emit_batch(vec![
            EmitRequest::job("acme", &Fragile { n: 3 }).unwrap(),
            EmitRequest::job_with("acme", &Fragile { n: 4 }, EmitOptions::default()).unwrap(),
        ])
        .await
        .unwrap();
    assert_eq!(many.len(), 2);
    let mut ids = vec![one];
    ids.extend(many);
    ids.extend(batch.into_iter().map(Emitted::id));
    for id in ids {
        assert_eq!(max_attempts(&r.store, id).await, Fragile::MAX_ATTEMPTS);
        let ev = r.store.get(id).await.unwrap().unwrap();
        assert_eq!(ev.handler, Fragile::NAME);
        assert_eq!(ev.tenant, "acme");
        assert_eq!(ev.state, EventState::Pending);
    }
}

#[tokio::test]
async fn options_override_the_jobs_max_attempts_on_every_path() {
    let r = rig();
    let five = EmitOptions::default().max_attempts(5);
    let one = r
        .client
        .emit_with("acme", &Fragile { n: 0 }, five.clone())
        .await
        .unwrap()
        .id();
    let many = r
        .client
        .emit_many_with("acme", &[Fragile { n: 1 }], five.clone())
        .await
        .unwrap();
    let batch = r
        .client
        .emit_batch(vec![
            EmitRequest::job_with("acme", &Fragile { n: 2 }, five).unwrap()
        ])
        .await
        .unwrap();
    for id in [one, many[0].id(), batch[0].id()] {
        assert_eq!(max_attempts(&r.store, id).await, 5);
    }
    // Raw JSON has no job: the default.
    let raw = r
        .client
        .emit_json("acme", "fragile", "{}", EmitOptions::default())
        .await
        .unwrap();
    assert_eq!(
        max_attempts(&r.store, raw.id()).await,
        herald::DEFAULT_MAX_ATTEMPTS
    );
}

#[tokio::test]
async fn a_bad_job_in_emit_many_names_its_index_and_stores_nothing() {
    let r = rig();
    let err = r
        .client
        .emit_many("", &[Fragile { n: 1 }, Fragile { n: 2 }])
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::InBatch { index: 0, .. }),
        "{err:?}"
    );
    assert!(r
        .client
        .list(&Default::default(), 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn worker_stats_are_named_from_outside() {
    let r = rig();
    let worker = Worker::builder(r.store.clone(), r.queue.clone() as Arc<dyn Queue>)
        .job::<Fragile>()
        .start();
    r.client.emit("acme", &Fragile { n: 0 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen: StatsSnapshot = worker.stats();
    while seen.done < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = worker.stats();
    }
    assert_eq!(seen.done, 1);
    assert_eq!(seen.claimed, 1);
    let live = WorkerStats::default();
    assert_eq!(live.snapshot(), StatsSnapshot::default());
    worker.shutdown(Duration::from_secs(5)).await;
}

/// Counts settled runs, as an application's observer would.
#[derive(Default)]
struct Settled(std::sync::Mutex<Vec<RunSettled>>);

impl RunObserver for Settled {
    fn settled(&self, _handler: &str, how: RunSettled) {
        self.0.lock().unwrap().push(how);
    }
}

#[tokio::test]
async fn an_observer_is_named_from_outside() {
    let r = rig();
    let observer = Arc::new(Settled::default());
    let worker = Worker::builder(r.store.clone(), r.queue.clone() as Arc<dyn Queue>)
        .job::<Fragile>()
        .observer(observer.clone())
        .start();
    r.client.emit("acme", &Fragile { n: 0 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while worker.stats().done < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;
    assert_eq!(*observer.0.lock().unwrap(), [RunSettled::Done]);
}

#[tokio::test]
async fn a_worker_whose_heartbeat_would_spin_does_not_start() {
    let r = rig();
    let refused = Worker::builder(r.store.clone(), r.queue.clone() as Arc<dyn Queue>)
        .job::<Fragile>()
        .lease(Duration::ZERO)
        .try_start();
    let Err(err) = refused else {
        panic!("a worker with a zero lease started");
    };
    let err: WorkerConfigError = err;
    assert_eq!(err.field(), "lease");
    assert!(err.to_string().contains("(9s is the default)"), "{err}");
    // The same check, for a program that validates before it builds.
    let config = WorkerConfig {
        batch: 0,
        ..WorkerConfig::default()
    };
    assert_eq!(config.validate().unwrap_err().field(), "batch");
}
