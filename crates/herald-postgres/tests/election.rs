//! Worker processes on one schema, killed with SIGKILL (this test binary,
//! re-executed as a child; the `child_pg_worker` test does nothing unless
//! `HERALD_PG_CHILD_SCHEMA` is set).
//!
//! - The reconciler's election: only the holder of the `leaders` row
//!   sweeps; when it is killed, another process takes over once the leader
//!   lease lapses.
//! - A killed worker's event runs again within a lease and a sweep.

use herald::schedule::{DueSchedules, Schedule, ScheduleFiring};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use herald::backend::{
    EventFilter, EventStore, Inspection, LeaderElection, LeaseRef, Operator, Reconciliation, Rules,
    Scheduled, Schedules, Settle, StoreResult, SubscriptionSync, SweepPage, SweepPass, Topics,
};
use herald::{
    Emitted, Event, EventId, MemoryQueue, Millis, NewEvent, Rule, RuleMatch, Store, Subscription,
    Worker, WorkerConfig,
};
use herald_postgres::{testing, PgStore};
use sqlx::postgres::PgPoolOptions;

const CHILD_SCHEMA: &str = "HERALD_PG_CHILD_SCHEMA";
const CHILD_NAME: &str = "HERALD_PG_CHILD_NAME";
const CHILD_LOG: &str = "HERALD_PG_CHILD_LOG";
/// The child's `sweep_every` in ms (default [`SWEEP_EVERY`]).
const CHILD_SWEEP_MS: &str = "HERALD_PG_CHILD_SWEEP_MS";
const LEASE: Duration = Duration::from_secs(3);
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// A store that notes each sweep call in a file, as `<worker> <ms>`.
struct SweepSpy {
    inner: PgStore,
    name: String,
    log: PathBuf,
}

impl SweepSpy {
    fn note(&self) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the sweep log");
        writeln!(f, "{} {}", self.name, Millis::now().0).expect("write the sweep log");
    }
}

#[async_trait]
impl EventStore for SweepSpy {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        self.inner.emit(events).await
    }

    async fn claim(
        &self,
        leases: &[LeaseRef],
        handlers: &[String],
        tenants: &[String],
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        self.inner.claim(leases, handlers, tenants, lease).await
    }

    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection> {
        self.inner.inspect(ids).await
    }

    async fn settle(&self, batch: &[Settle]) -> StoreResult<herald::backend::Settled> {
        self.inner.settle(batch).await
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        self.inner.renew(leases, lease).await
    }
}

#[async_trait]
impl Rules for SweepSpy {
    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool> {
        self.inner.add_rule(rule).await
    }

    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool> {
        self.inner.remove_rule(rule).await
    }

    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
        self.inner.rules_for(tenant, handler).await
    }

    async fn rules(&self) -> StoreResult<Vec<Rule>> {
        self.inner.rules().await
    }

    async fn renotify_page(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<Scheduled>> {
        self.inner
            .renotify_page(tenant, handler, after, limit)
            .await
    }
}

#[async_trait]
impl Topics for SweepSpy {
    async fn subscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        self.inner.subscribe(subscription).await
    }

    async fn unsubscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        self.inner.unsubscribe(subscription).await
    }

    async fn subscribers(&self, tenant: &str, topic: &str) -> StoreResult<Vec<String>> {
        self.inner.subscribers(tenant, topic).await
    }

    async fn subscriptions(&self, topic: Option<&str>) -> StoreResult<Vec<Subscription>> {
        self.inner.subscriptions(topic).await
    }

    async fn sync_subscriptions(&self, declared: &[Subscription]) -> StoreResult<SubscriptionSync> {
        self.inner.sync_subscriptions(declared).await
    }
}

#[async_trait]
impl herald::backend::Limits for SweepSpy {
    async fn set_limit(&self, limit: &herald::Limit) -> StoreResult<bool> {
        self.inner.set_limit(limit).await
    }

    async fn remove_limit(&self, handler: &str, scope: &herald::LimitScope) -> StoreResult<bool> {
        self.inner.remove_limit(handler, scope).await
    }

    async fn limits(&self, handler: Option<&str>) -> StoreResult<Vec<herald::StoredLimit>> {
        self.inner.limits(handler).await
    }

    async fn sync_limits(
        &self,
        declared: &[herald::Limit],
    ) -> StoreResult<Vec<(String, herald::LimitKind)>> {
        self.inner.sync_limits(declared).await
    }

    async fn wake_limit(
        &self,
        handler: &str,
        kind: herald::LimitKind,
        after: Option<(String, String)>,
        scopes: usize,
    ) -> StoreResult<herald::backend::WakePage> {
        self.inner.wake_limit(handler, kind, after, scopes).await
    }
}

#[async_trait]
impl Reconciliation for SweepSpy {
    async fn lapse_slots(&self, limit: usize) -> StoreResult<Vec<Scheduled>> {
        self.inner.lapse_slots(limit).await
    }

    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
        self.note();
        self.inner.sweep(quiet, pass, limit).await
    }

    async fn purge(
        &self,
        dead_retention: Duration,
        done_retention: Duration,
        limit: usize,
    ) -> StoreResult<u64> {
        self.inner
            .purge(dead_retention, done_retention, limit)
            .await
    }

    async fn purge_keys(&self, window: Duration, limit: usize) -> StoreResult<u64> {
        self.inner.purge_keys(window, limit).await
    }

    async fn upkeep(&self) -> StoreResult<()> {
        self.inner.upkeep().await
    }
}

#[async_trait]
impl LeaderElection for SweepSpy {
    async fn lead(
        &self,
        role: &str,
        holder: &str,
        lease: Duration,
    ) -> StoreResult<herald::Leadership> {
        self.inner.lead(role, holder, lease).await
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        self.inner.resign(role, holder).await
    }
}

#[async_trait]
impl Operator for SweepSpy {
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.inner.get(id).await
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<herald::AttemptError>> {
        self.inner.history(id).await
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        self.inner.list(filter, limit).await
    }

    async fn counts(&self, query: &herald::CountsQuery) -> StoreResult<Vec<herald::HandlerCounts>> {
        self.inner.counts(query).await
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        self.inner.revive(id).await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        self.inner.delete(id).await
    }
}

#[async_trait]
impl Schedules for SweepSpy {
    async fn clock(&self) -> StoreResult<herald::Millis> {
        self.inner.clock().await
    }

    async fn put_schedule(&self, schedule: &Schedule) -> StoreResult<bool> {
        self.inner.put_schedule(schedule).await
    }

    async fn schedule(&self, tenant: &str, name: &str) -> StoreResult<Option<Schedule>> {
        self.inner.schedule(tenant, name).await
    }

    async fn schedules(&self, tenant: Option<&str>) -> StoreResult<Vec<Schedule>> {
        self.inner.schedules(tenant).await
    }

    async fn pause_schedule(&self, tenant: &str, name: &str, paused: bool) -> StoreResult<bool> {
        self.inner.pause_schedule(tenant, name, paused).await
    }

    async fn delete_schedule(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        self.inner.delete_schedule(tenant, name).await
    }

    async fn due_schedules(&self, limit: usize) -> StoreResult<DueSchedules> {
        self.inner.due_schedules(limit).await
    }

    async fn fire_schedule(&self, firing: &ScheduleFiring) -> StoreResult<Option<Vec<Emitted>>> {
        self.inner.fire_schedule(firing).await
    }
}

/// The child: a worker that may lead, on the parent's schema.
#[test]
fn child_pg_worker() {
    let Ok(schema) = std::env::var(CHILD_SCHEMA) else {
        return;
    };
    let name = std::env::var(CHILD_NAME).expect("a worker name");
    let log = PathBuf::from(std::env::var(CHILD_LOG).expect("a sweep log"));
    let marker = log.with_extension("started");
    let sweep_every = std::env::var(CHILD_SWEEP_MS)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(SWEEP_EVERY, Duration::from_millis);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let store = PgStore::connect_with(
            PgPoolOptions::new().max_connections(4),
            testing::connect_options(),
            &schema,
        )
        .await
        .expect("connect");
        let spy = Arc::new(SweepSpy {
            inner: store,
            name: name.clone(),
            log,
        });
        let _worker = Worker::builder(spy, Arc::new(MemoryQueue::new(LEASE)))
            .config(WorkerConfig {
                lease: LEASE,
                sweep_every,
                name,
                ..WorkerConfig::default()
            })
            .handler("noop", |_: serde_json::Value, _cx: herald::Context| async {
            })
            .handler("slow", move |_: serde_json::Value, cx: herald::Context| {
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

fn spawn_child(schema: &str, name: &str, log: &Path) -> Child {
    spawn_child_sweeping(schema, name, log, SWEEP_EVERY)
}

fn spawn_child_sweeping(schema: &str, name: &str, log: &Path, sweep_every: Duration) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args([
            "--exact",
            "child_pg_worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SCHEMA, schema)
        .env(CHILD_NAME, name)
        .env(CHILD_LOG, log)
        .env(CHILD_SWEEP_MS, sweep_every.as_millis().to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn a child worker")
}

/// Kills the child if the test fails before it does.
struct Reaper(Option<Child>);

impl Reaper {
    /// SIGKILL; returns when.
    fn kill(&mut self) -> Instant {
        let mut child = self.0.take().expect("a live child");
        child.kill().expect("SIGKILL the child");
        let at = Instant::now();
        child.wait().expect("reap the child");
        at
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Stores one due event of the `slow` handler, without notifying it.
async fn emit_slow(store: &PgStore) -> NewEvent {
    let e = NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: "acme".into(),
        handler: "slow".into(),
        payload: "{}".into(),
        run_at: herald::RunAt::NOW,
        max_attempts: 5,
        idempotency_key: None,
        topic: None,
    };
    store.emit(std::slice::from_ref(&e)).await.unwrap();
    e
}

/// The sweep calls logged so far: (worker, ms).
fn sweeps(log: &Path) -> Vec<(String, i64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, at) = l.split_once(' ')?;
            Some((name.to_string(), at.parse().ok()?))
        })
        .collect()
}

async fn holder(store: &PgStore) -> Option<String> {
    sqlx::query_scalar(&format!(
        "SELECT holder FROM \"{}\".leaders WHERE role = 'reconciler'",
        store.schema()
    ))
    .fetch_optional(store.pool())
    .await
    .expect("read the leaders row")
}

async fn wait_for_holder(store: &PgStore, name: &str, within: Duration) -> Instant {
    let start = Instant::now();
    loop {
        if holder(store).await.as_deref() == Some(name) {
            return Instant::now();
        }
        assert!(
            start.elapsed() < within,
            "{name} did not take the leader row within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_sweeps_and_the_other_takes_over_when_it_is_killed() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("herald-election-{}", schema.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("sweeps.log");

    let mut a = Reaper(Some(spawn_child(schema.name(), "A", &log)));
    wait_for_holder(&store, "A", Duration::from_secs(30)).await;
    let mut b = Reaper(Some(spawn_child(schema.name(), "B", &log)));
    // Both run for two leader leases: A keeps the row, and only A sweeps.
    let watch = Instant::now();
    while watch.elapsed() < LEASE * 2 {
        assert_eq!(holder(&store).await.as_deref(), Some("A"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = sweeps(&log);
    let by_a = seen.iter().filter(|(n, _)| n == "A").count();
    assert!(by_a >= 5, "A swept {by_a} times in {:?}", LEASE * 2);
    assert!(
        seen.iter().all(|(n, _)| n == "A"),
        "only the leader sweeps: {seen:?}"
    );

    let killed_at = a.kill();
    let killed_ms = Millis::now().0;
    let took_over = wait_for_holder(&store, "B", LEASE * 3).await - killed_at;
    println!(
        "B took the leader row {took_over:?} after A's SIGKILL (leader lease {LEASE:?}, \
         B tries every {SWEEP_EVERY:?})"
    );
    // A's row lapses at most a lease after its last renewal (before the
    // kill); B tries every sweep interval.
    assert!(
        took_over <= LEASE + SWEEP_EVERY + Duration::from_millis(500),
        "took over only {took_over:?} after the kill"
    );
    let start = Instant::now();
    while !sweeps(&log).iter().any(|(n, _)| n == "B") {
        assert!(start.elapsed() < Duration::from_secs(5), "B never swept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after: Vec<_> = sweeps(&log)
        .into_iter()
        .filter(|(_, at)| *at > killed_ms + 50)
        .collect();
    assert!(after.iter().all(|(n, _)| n == "B"), "{after:?}");
    b.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_event_runs_again_in_another_process_within_a_lease() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("herald-kill-{}", schema.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("sweeps.log");
    let marker = log.with_extension("started");
    let e = emit_slow(&store).await;
    // Nothing was published: the child's start-up sweep notifies it.
    let mut a = Reaper(Some(spawn_child(schema.name(), "A", &log)));
    let start = Instant::now();
    while std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "A never started it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        format!("{} 1", e.id)
    );
    let killed_at = a.kill();

    let reran = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = reran.clone();
    let worker = Worker::builder(
        Arc::new(store.clone()) as Arc<dyn Store>,
        Arc::new(MemoryQueue::new(LEASE)),
    )
    .config(WorkerConfig {
        lease: LEASE,
        sweep_every: SWEEP_EVERY,
        ..WorkerConfig::default()
    })
    .handler("slow", move |_: serde_json::Value, cx: herald::Context| {
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
    println!("rescued {rescue:?} after SIGKILL (lease {LEASE:?}, sweep every {SWEEP_EVERY:?})");
    assert_eq!(attempt, 2, "the killed run used attempt 1");
    // The event's lease (renewed every lease/3) and the dead leader's row
    // lapse within a lease of the kill; the next sweep finds the event.
    assert!(
        rescue <= LEASE + SWEEP_EVERY + Duration::from_millis(500),
        "rescued only {rescue:?} after the kill"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        reran.lock().unwrap().len(),
        1,
        "ran exactly once after the kill"
    );
    assert!(store.get(e.id).await.unwrap().is_none(), "done and deleted");
    worker.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The runs the children noted so far: `event attempt` lines.
fn started(marker: &Path) -> Vec<String> {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Rescue does not depend on who leads: the leader is killed while it runs
/// an event, and the follower, though its `sweep_every` is far longer than
/// the lease, takes the leader row as it lapses and rescues the event
/// within a lease and a heartbeat. Before, the follower waited out
/// `max(lease, 2 × sweep_every)` (20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_event_is_rescued_by_a_follower_within_a_lease_and_a_heartbeat() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("herald-follower-{}", schema.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("sweeps.log");
    let marker = log.with_extension("started");
    let slow_sweeps = Duration::from_secs(10);
    let e = emit_slow(&store).await;
    // Nothing was published: A's start-up sweep notifies it.
    let mut a = Reaper(Some(spawn_child_sweeping(
        schema.name(),
        "A",
        &log,
        slow_sweeps,
    )));
    let start = Instant::now();
    while started(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "A never started it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(started(&marker), vec![format!("{} 1", e.id)]);
    assert_eq!(holder(&store).await.as_deref(), Some("A"));
    let mut b = Reaper(Some(spawn_child_sweeping(
        schema.name(),
        "B",
        &log,
        slow_sweeps,
    )));
    // Past a heartbeat, so that A has renewed the lease at least once.
    tokio::time::sleep(LEASE / 2).await;
    let killed_at = a.kill();
    while started(&marker).len() < 2 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "B never rescued it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rescue = killed_at.elapsed();
    println!("B rescued A's event {rescue:?} after A's SIGKILL (lease {LEASE:?}, sweep_every {slow_sweeps:?})");
    assert_eq!(started(&marker)[1], format!("{} 2", e.id));
    assert_eq!(holder(&store).await.as_deref(), Some("B"));
    let bound = LEASE + LEASE / 3 + Duration::from_millis(1000);
    assert!(
        rescue <= bound,
        "rescued {rescue:?} after the kill, more than {bound:?}"
    );
    b.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
