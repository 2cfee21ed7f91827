//! End-to-end scenarios: a store, a queue, real workers. Each asserts
//! exact counts of runs and of stored events.
//!
//! The queue is the in-process one, unless the scenario runs inside
//! [`with_queues`] (what `engine_suite!(store, queue = maker)` does): then
//! each rig takes a fresh queue of a backend from the maker. The few checks
//! that look inside the in-process queue (how many notifications wait) are
//! made only on it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::queue::{QueueBackdoor, TestQueue};
use super::{eventually, stored, Ledger};
use crate::client::{Client, ClientError, EmitOptions, EmitRequest};
use crate::decision::Policy;
use crate::handler::{Context, HandlerError};
use crate::memory_queue::MemoryQueue;
use crate::model::{EventId, EventState, LeaseToken, NewEvent};
use crate::queue::Queue;
use crate::retry::RetryPolicy;
use crate::store::{Finish, Settle, Store};
use crate::worker::{Worker, WorkerBuilder, WorkerConfig};

const T: &str = "acme";
const H: &str = "record";
/// Long enough for anything that should happen; only reached on failure.
const SOON: Duration = Duration::from_secs(10);
/// How long to watch for something that must not happen.
const QUIET: Duration = Duration::from_millis(600);

fn config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 16,
        batch: 64,
        lease: Duration::from_secs(3),
        sweep_every: Duration::from_millis(200),
        sweep_quiet: Duration::from_secs(2),
        policy: Policy {
            retry: RetryPolicy {
                base: Duration::from_millis(50),
                max: Duration::from_millis(200),
                factor: 2.0,
                jitter: 0.0,
            },
            lost_claim_delay: Duration::from_millis(50),
            lease_jitter: Duration::from_millis(100),
            ..Policy::default()
        },
        ..WorkerConfig::default()
    }
}

/// Makes a fresh, empty queue whose deliveries come back `ack_wait` after
/// they were received unless extended; `None` when its service is
/// unreachable (the maker has said so).
pub type QueueMaker =
    Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = Option<TestQueue>> + Send>> + Send + Sync>;

tokio::task_local! {
    static QUEUES: QueueMaker;
}

/// Runs `scenario` with every rig on a queue from `maker` instead of the
/// in-process queue.
pub async fn with_queues<F: Future>(maker: QueueMaker, scenario: F) -> F::Output {
    QUEUES.scope(maker, scenario).await
}

struct Rig {
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    backdoor: Arc<dyn QueueBackdoor>,
    /// The in-process queue, when that is the queue: it can be looked into.
    memory: Option<Arc<MemoryQueue>>,
    client: Client,
    ledger: Ledger,
    _keep: Box<dyn Any + Send + Sync>,
}

impl Rig {
    async fn new(store: Arc<dyn Store>) -> Self {
        Rig::with_ack_wait(store, Duration::from_secs(3)).await
    }

    /// A rig whose queue redelivers a notification `ack_wait` after it was
    /// received, unless the worker's heartbeat extends it.
    async fn with_ack_wait(store: Arc<dyn Store>, ack_wait: Duration) -> Self {
        let (queue, backdoor, memory, keep): (Arc<dyn Queue>, Arc<dyn QueueBackdoor>, _, _) =
            match QUEUES.try_with(|m| m.clone()) {
                Ok(maker) => {
                    let t = maker(ack_wait)
                        .await
                        .expect("the suite's queue is reachable");
                    (t.queue, t.backdoor, None, t.keep)
                }
                Err(_) => {
                    let q = Arc::new(MemoryQueue::new(ack_wait));
                    (
                        q.clone(),
                        q.clone(),
                        Some(q),
                        Box::new(()) as Box<dyn Any + Send + Sync>,
                    )
                }
            };
        let client = Client::new(store.clone(), queue.clone());
        Rig {
            store,
            queue,
            backdoor,
            memory,
            client,
            ledger: Ledger::default(),
            _keep: keep,
        }
    }

    /// A worker whose `record` handler notes each run and succeeds.
    fn builder(&self) -> WorkerBuilder {
        let ledger = self.ledger.clone();
        Worker::builder(self.store.clone(), self.queue.clone())
            .config(config())
            .handler(H, move |_: serde_json::Value, cx: Context| {
                let ledger = ledger.clone();
                async move { ledger.record(cx.event_id, cx.attempt) }
            })
    }

    fn worker(&self) -> Worker {
        self.builder().start()
    }

    /// Waits until `w` has led and finished its first sweep. The in-process
    /// queue forgets on restart, so that sweep notifies every due event
    /// whatever its quiet period: an event emitted before it ends may be
    /// notified twice. Later sweeps never offer an event under a live lease,
    /// nor one released or notified less than `sweep_quiet` ago.
    async fn swept(&self, w: &Worker) {
        eventually("the first sweep ends", SOON, || {
            let n = w.stats().sweeps;
            async move { n >= 1 }
        })
        .await;
    }

    /// Waits until the worker's counters say `what`: a run's store write
    /// lands before the counters move, so a test that saw the store change
    /// waits for them.
    async fn counted(&self, w: &Worker, what: &str, f: impl Fn(&crate::StatsSnapshot) -> bool) {
        eventually(what, SOON, || {
            let ok = f(&w.stats());
            async move { ok }
        })
        .await;
    }

    async fn emit(&self) -> EventId {
        self.emit_to(H, EmitOptions::default()).await
    }

    async fn emit_to(&self, handler: &str, options: EmitOptions) -> EventId {
        self.client
            .emit_json(T, handler, "{}", options)
            .await
            .expect("emit")
            .id()
    }

    async fn stored(&self) -> u64 {
        stored(self.store.as_ref()).await
    }

    async fn runs_once(&self, id: EventId) {
        let ledger = self.ledger.clone();
        eventually("the event runs", SOON, || {
            let n = ledger.runs_of(id);
            async move { n >= 1 }
        })
        .await;
        self.until_gone(id).await;
        tokio::time::sleep(QUIET).await;
        assert_eq!(self.ledger.runs_of(id), 1, "the event ran more than once");
    }

    async fn until_gone(&self, id: EventId) {
        let store = self.store.clone();
        eventually("the event is done and deleted", SOON, || {
            let store = store.clone();
            async move { store.get(id).await.expect("get").is_none() }
        })
        .await;
    }

    async fn until_dead(&self, id: EventId) {
        let store = self.store.clone();
        eventually("the event is dead", SOON, || {
            let store = store.clone();
            async move {
                let e = store.get(id).await.expect("get");
                e.is_some_and(|e| e.state == EventState::Dead)
            }
        })
        .await;
    }

    async fn never_runs_for_a_while(&self, id: EventId) {
        tokio::time::sleep(QUIET).await;
        assert_eq!(self.ledger.runs_of(id), 0, "a held event ran");
        let e = self
            .store
            .get(id)
            .await
            .expect("get")
            .expect("still stored");
        assert_eq!(e.state, EventState::Pending);
        assert_eq!(e.attempt, 0, "a held event used an attempt");
    }

    /// Takes the event's lease away from whoever holds it, as if it expired
    /// and another worker claimed it. Returns the new token.
    ///
    /// Between the release and the claim the event is claimable by anyone,
    /// so nothing else may be about to claim it: the caller waits for the
    /// worker's first sweep before emitting ([`Rig::swept`]), and the queue's
    /// ack wait outlasts the worker's heartbeat, so the event's one
    /// notification is held by its running handler and not redelivered.
    async fn steal_lease(&self, id: EventId, lease: Duration) -> LeaseToken {
        let seen = self.store.inspect(&[id]).await.expect("inspect");
        let event = &seen.found[0].event;
        let held = event.lease.expect("a lease to steal").token;
        let handler = event.handler.clone();
        let released = self
            .store
            .settle(&[Settle {
                id,
                token: Some(held),
                finish: Finish::Release {
                    wait: Duration::ZERO,
                    error: None,
                    give_back: false,
                },
            }])
            .await
            .expect("release");
        assert_eq!(released, vec![true]);
        let token = LeaseToken::new();
        let got = self
            .store
            .claim(&[id], &[handler], token, lease)
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "the stolen lease was claimed");
        token
    }
}

/// One event succeeds: it runs once and is deleted.
pub async fn one_event_succeeds(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    let id = rig.emit().await;
    rig.runs_once(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1]);
    assert_eq!(rig.stored().await, 0);
    let s = w.stats();
    assert_eq!((s.claimed, s.done), (1, 1));
    w.shutdown(SOON).await;
}

/// Three events, each emitted after the previous one ran.
pub async fn three_in_sequence(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    for i in 1..=3 {
        let id = rig.emit().await;
        rig.runs_once(id).await;
        assert_eq!(rig.ledger.total(), i);
        assert_eq!(rig.stored().await, 0);
    }
    w.shutdown(SOON).await;
}

/// Three events emitted at once.
pub async fn three_at_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let batch = (0..3)
        .map(|_| EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "{}".into(),
            options: EmitOptions::default(),
        })
        .collect();
    let ids = rig.client.emit_batch(batch).await.expect("emit");
    assert_eq!(rig.stored().await, 3);
    let w = rig.worker();
    for e in &ids {
        rig.runs_once(e.id()).await;
    }
    assert_eq!(rig.ledger.total(), 3);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// An event whose lease expired (its worker died) is claimed and run.
pub async fn expired_lease_is_claimed_and_run(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let id = rig.emit().await;
    let dead_worker = LeaseToken::new();
    let got = rig
        .store
        .claim(&[id], &[H.to_string()], dead_worker, Duration::ZERO)
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    let w = rig.worker();
    rig.runs_once(id).await;
    // The dead worker's claim counted: this is the second attempt.
    assert_eq!(rig.ledger.attempts_of(id), vec![2]);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// An event under a live lease is not run, and stays stored.
pub async fn live_lease_is_not_run_and_kept(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let id = rig.emit().await;
    let holder = LeaseToken::new();
    rig.store
        .claim(&[id], &[H.to_string()], holder, Duration::from_secs(3600))
        .await
        .expect("claim");
    let w = rig.worker();
    eventually("the notification is requeued", SOON, || {
        let n = w.stats().requeued;
        async move { n >= 1 }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(rig.ledger.total(), 0);
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!(e.lease.map(|l| l.token), Some(holder));
    assert_eq!(e.attempt, 1);
    assert_eq!(rig.stored().await, 1);
    w.shutdown(SOON).await;
}

async fn held_then_lifted(store: Arc<dyn Store>, pause: bool) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    if pause {
        assert!(rig.client.pause(T, H).await.unwrap());
    } else {
        assert!(rig.client.block(T, H).await.unwrap());
    }
    let id = rig.emit().await;
    // A rule also holds an event that was emitted before it.
    rig.never_runs_for_a_while(id).await;
    assert!(w.stats().dropped >= 1, "the notification was dropped");
    assert_eq!(rig.stored().await, 1);
    let release = if pause {
        rig.client.unpause(T, H).await.unwrap()
    } else {
        rig.client.unblock(T, H).await.unwrap()
    };
    assert!(release.removed);
    assert_eq!(release.notified, 1);
    rig.runs_once(id).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Block, then unblock: held while blocked, runs once after.
pub async fn block_then_unblock(store: Arc<dyn Store>) {
    held_then_lifted(store, false).await;
}

/// Pause, then unpause: held while paused, runs once after.
pub async fn pause_then_unpause(store: Arc<dyn Store>) {
    held_then_lifted(store, true).await;
}

/// Both rules hold the event; lifting `first_lift` leaves it held by the
/// other; lifting that one too runs it once.
async fn held_by_both(store: Arc<dyn Store>, pause_first: bool, lift_pause_first: bool) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    if pause_first {
        rig.client.pause(T, H).await.unwrap();
        rig.client.block(T, H).await.unwrap();
    } else {
        rig.client.block(T, H).await.unwrap();
        rig.client.pause(T, H).await.unwrap();
    }
    let id = rig.emit().await;
    rig.never_runs_for_a_while(id).await;
    let first = if lift_pause_first {
        rig.client.unpause(T, H).await.unwrap()
    } else {
        rig.client.unblock(T, H).await.unwrap()
    };
    assert!(first.removed);
    assert_eq!(first.notified, 0, "nothing is notified while still held");
    assert_eq!(first.still_held.blocked, lift_pause_first);
    assert_eq!(first.still_held.paused, !lift_pause_first);
    rig.never_runs_for_a_while(id).await;
    assert_eq!(rig.stored().await, 1);
    let second = if lift_pause_first {
        rig.client.unblock(T, H).await.unwrap()
    } else {
        rig.client.unpause(T, H).await.unwrap()
    };
    assert!(second.removed);
    assert!(!second.still_held.holds());
    assert_eq!(second.notified, 1);
    rig.runs_once(id).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Pause + block, then unpause: still held (by the block).
pub async fn pause_and_block_then_unpause_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, true, true).await;
}

/// Pause + block, then unblock: still held (by the pause).
pub async fn pause_and_block_then_unblock_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, true, false).await;
}

/// Block + pause, then unpause: still held (by the block).
pub async fn block_and_pause_then_unpause_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, false, true).await;
}

/// Block + pause, then unblock: still held (by the pause).
pub async fn block_and_pause_then_unblock_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, false, false).await;
}

/// Ten unpauses in a row put ten notifications on the queue; the event runs once.
pub async fn unpause_ten_times_in_a_row_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    rig.client.pause(T, H).await.unwrap();
    let id = rig.emit().await;
    let mut notified = 0;
    for _ in 0..10 {
        notified += rig.client.unpause(T, H).await.unwrap().notified;
    }
    assert_eq!(notified, 10, "every unpause re-notifies");
    // Eleven notifications wait (the emit's and ten unpauses'); then a worker starts.
    if let Some(q) = &rig.memory {
        assert_eq!(q.len(), 11);
    }
    let w = rig.worker();
    rig.runs_once(id).await;
    assert_eq!(rig.ledger.total(), 1);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Ten concurrent unpauses, four workers sharing one queue, fifty events:
/// each runs exactly once.
pub async fn unpause_ten_times_concurrently_with_several_workers_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let workers: Vec<Worker> = (0..4).map(|_| rig.worker()).collect();
    rig.client.pause(T, H).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..50 {
        ids.push(rig.emit().await);
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(rig.ledger.total(), 0);
    let unpauses: Vec<_> = (0..10)
        .map(|_| {
            let c = rig.client.clone();
            tokio::spawn(async move { c.unpause(T, H).await.unwrap() })
        })
        .collect();
    for u in unpauses {
        u.await.unwrap();
    }
    let ledger = rig.ledger.clone();
    eventually("all fifty run", SOON, || {
        let n = ledger.distinct();
        async move { n == 50 }
    })
    .await;
    let store = rig.store.clone();
    eventually("all fifty are deleted", SOON, || {
        let store = store.clone();
        async move { stored(store.as_ref()).await == 0 }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    for id in ids {
        assert_eq!(rig.ledger.runs_of(id), 1, "event {id} ran more than once");
    }
    assert_eq!(rig.ledger.total(), 50);
    for w in workers {
        w.shutdown(SOON).await;
    }
}

/// Handlers that finish within the grace period finish; nothing is cancelled.
pub async fn shutdown_within_grace_lets_handlers_finish(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (s, f) = (started.clone(), finished.clone());
    let w = rig
        .builder()
        .handler("slow", move |_: serde_json::Value, _cx: Context| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                f.fetch_add(1, Ordering::SeqCst);
            }
        })
        .start();
    for _ in 0..5 {
        rig.emit_to("slow", EmitOptions::default()).await;
    }
    eventually("all five start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 5 }
    })
    .await;
    let report = w.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.in_flight, 5);
    assert_eq!(report.cancelled, 0);
    assert_eq!(finished.load(Ordering::SeqCst), 5);
    assert_eq!(
        rig.stored().await,
        0,
        "finished runs were settled before shutdown returned"
    );
}

/// Past the grace period, running handlers are cancelled, their events
/// released with the attempt given back, and the next worker runs them at once.
pub async fn shutdown_past_grace_snoozes_and_the_next_worker_runs_them(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let first = rig
        .builder()
        .handler("slow", move |_: serde_json::Value, cx: Context| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                cx.cancelled().await;
            }
        })
        .start();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(rig.emit_to("slow", EmitOptions::default()).await);
    }
    eventually("all three start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 3 }
    })
    .await;
    let report = first.shutdown(Duration::from_millis(200)).await;
    assert_eq!(report.cancelled, 3);
    for id in &ids {
        let e = rig.store.get(*id).await.unwrap().expect("kept");
        assert_eq!(e.attempt, 0, "the cancelled attempt was given back");
        assert!(e.lease.is_none(), "the lease was released");
        assert_eq!(e.state, EventState::Pending);
    }
    let ledger = rig.ledger.clone();
    let second = rig
        .builder()
        .handler("slow", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move { ledger.record(cx.event_id, cx.attempt) }
        })
        .start();
    for id in &ids {
        rig.runs_once(*id).await;
        assert_eq!(rig.ledger.attempts_of(*id), vec![1]);
    }
    assert_eq!(rig.stored().await, 0);
    second.shutdown(SOON).await;
}

/// A second signal during a long grace period cancels the running handlers
/// at once; they are released as in any shutdown cancel.
pub async fn second_signal_cancels_at_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let w = rig
        .builder()
        .handler("slow", move |_: serde_json::Value, cx: Context| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                cx.cancelled().await;
            }
        })
        .start();
    let a = rig.emit_to("slow", EmitOptions::default()).await;
    let b = rig.emit_to("slow", EmitOptions::default()).await;
    eventually("both start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let second_signal = w.shutdown_handle();
    let shutdown = tokio::spawn(w.shutdown(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!shutdown.is_finished(), "the grace period is running");
    second_signal.cancel_now();
    let report = tokio::time::timeout(SOON, shutdown)
        .await
        .expect("shutdown returns at once after the second signal")
        .expect("shutdown task");
    assert_eq!((report.in_flight, report.cancelled), (2, 2));
    for id in [a, b] {
        let e = rig.store.get(id).await.unwrap().expect("kept");
        assert_eq!(
            (e.attempt, e.lease),
            (0, None),
            "released, attempt given back"
        );
    }
}

/// When a renewal finds the lease gone, the handler is cancelled and nothing
/// is written about the event.
pub async fn lost_lease_cancels_the_handler(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(Notify::new());
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (s, c) = (started.clone(), cancelled.clone());
    let w = rig
        .builder()
        .handler("stuck", move |_: serde_json::Value, cx: Context| {
            let (s, c) = (s.clone(), c.clone());
            async move {
                // Counts when the runtime drops the handler's future.
                let _guard = CountOnDrop(c);
                s.notify_one();
                cx.cancelled().await;
                Err::<(), _>(HandlerError::retry("cancelled"))
            }
        })
        .start();
    rig.swept(&w).await;
    let id = rig.emit_to("stuck", EmitOptions::default()).await;
    started.notified().await;
    let thief = rig.steal_lease(id, Duration::from_secs(3600)).await;
    eventually("the handler is cancelled", SOON, || {
        let n = cancelled.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    eventually("the loss is counted", SOON, || {
        let n = w.stats().lease_lost;
        async move { n == 1 }
    })
    .await;
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!(
        e.lease.map(|l| l.token),
        Some(thief),
        "the worker wrote nothing"
    );
    assert_eq!(e.last_error, None);
    assert_eq!(w.stats().retried, 0);
    w.shutdown(SOON).await;
}

/// A handler that finishes after its lease was taken over: its "done" is
/// refused by the fence, and the event stays with the new holder.
pub async fn late_completion_is_refused_by_the_fence(store: Arc<dyn Store>) {
    let lease = Duration::from_secs(60);
    // The queue must not redeliver the running event's notification: its
    // heartbeat extends it only every `lease / 3`.
    let rig = Rig::with_ack_wait(store, lease).await;
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let w = rig
        .builder()
        // A long lease: the heartbeat won't notice before the handler returns.
        .lease(lease)
        .handler("late", move |_: serde_json::Value, _cx: Context| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                s.notify_one();
                r.notified().await;
            }
        })
        .start();
    rig.swept(&w).await;
    let id = rig.emit_to("late", EmitOptions::default()).await;
    started.notified().await;
    let thief = rig.steal_lease(id, Duration::from_secs(3600)).await;
    release.notify_one();
    eventually("the late result is refused", SOON, || {
        let n = w.stats().fenced_out;
        async move { n == 1 }
    })
    .await;
    let e = rig.store.get(id).await.unwrap().expect("not deleted");
    assert_eq!(e.lease.map(|l| l.token), Some(thief));
    assert_eq!(w.stats().done, 0, "a refused result is not counted as done");
    assert_eq!(rig.stored().await, 1);
    w.shutdown(SOON).await;
}

struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn new_event(handler: &str) -> NewEvent {
    NewEvent {
        id: EventId::new(),
        tenant: T.into(),
        handler: handler.into(),
        payload: "{}".into(),
        run_at: crate::model::Millis::now(),
        max_attempts: 3,
        idempotency_key: None,
    }
}

/// An event stored without a notification (a crash between insert and
/// publish) is found by the reconciler and run.
pub async fn lost_notification_is_run_by_the_reconciler(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    // After the start-up sweep, so this is the steady-state path.
    rig.swept(&w).await;
    let e = new_event(H);
    rig.store
        .emit(std::slice::from_ref(&e))
        .await
        .expect("insert");
    if let Some(q) = &rig.memory {
        assert!(q.is_empty(), "no notification was published");
    }
    rig.runs_once(e.id).await;
    assert!(w.stats().reconciled >= 1);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// The in-process queue starts empty: the first sweep notifies every due
/// stored event, and each runs once.
pub async fn every_stored_event_runs_after_a_restart(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let events: Vec<NewEvent> = (0..2500).map(|_| new_event(H)).collect();
    rig.store.emit(&events).await.expect("insert");
    let w = rig.worker();
    let ledger = rig.ledger.clone();
    eventually("all 2500 run", SOON, || {
        let n = ledger.distinct();
        async move { n == 2500 }
    })
    .await;
    assert_eq!(rig.ledger.total(), 2500);
    assert!(w.stats().reconciled >= 2500);
    w.shutdown(SOON).await;
    assert_eq!(rig.stored().await, 0);
}

/// A handler that panics every time uses up its attempts and goes dead.
pub async fn crash_looping_handler_ends_dead(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let w = rig
        .builder()
        .handler("crash", move |_: serde_json::Value, _cx: Context| {
            r.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            async move {
                if r.load(Ordering::SeqCst) > 0 {
                    panic!("segfault simulator");
                }
            }
        })
        .start();
    let id = rig
        .emit_to("crash", EmitOptions::default().max_attempts(3))
        .await;
    rig.until_dead(id).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let e = rig.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.attempt, 3);
    assert!(e.lease.is_none());
    let error = e.last_error.unwrap_or_default();
    assert!(
        error.contains("3/3") && error.contains("segfault simulator"),
        "{error}"
    );
    let s = w.stats();
    assert_eq!((s.retried, s.dead), (2, 1));
    assert_eq!(rig.stored().await, 1, "dead events are kept");
    w.shutdown(SOON).await;
}

/// Two failures, then success: three attempts, two retries, deleted.
pub async fn failures_retry_with_backoff_then_succeed(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("flaky", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if cx.attempt < 3 {
                    return Err(HandlerError::retry("upstream 502"));
                }
                Ok(())
            }
        })
        .start();
    let id = rig.emit_to("flaky", EmitOptions::default()).await;
    rig.until_gone(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 2, 3]);
    rig.counted(&w, "the run is counted done", |s| s.done == 1)
        .await;
    let s = w.stats();
    assert_eq!((s.retried, s.done, s.dead), (2, 1, 0));
    w.shutdown(SOON).await;
}

/// A snooze runs the event again later without using up an attempt.
pub async fn snooze_gives_the_attempt_back(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("sleepy", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if ledger.runs_of(cx.event_id) < 3 {
                    return Err(HandlerError::snooze(Duration::from_millis(100)));
                }
                Ok(())
            }
        })
        .start();
    let id = rig
        .emit_to("sleepy", EmitOptions::default().max_attempts(1))
        .await;
    rig.until_gone(id).await;
    // max_attempts is 1, yet it ran three times: snoozes gave their attempts back.
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 1, 1]);
    assert_eq!(w.stats().snoozed, 2);
    w.shutdown(SOON).await;
}

/// A delayed event does not run before its time.
pub async fn delayed_event_waits(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    let start = std::time::Instant::now();
    let id = rig
        .emit_to(H, EmitOptions::default().delay(Duration::from_millis(800)))
        .await;
    rig.runs_once(id).await;
    assert!(start.elapsed() >= Duration::from_millis(800));
    w.shutdown(SOON).await;
}

/// Garbage on the queue is dropped with a log line; real events still run.
pub async fn garbage_on_the_queue_is_dropped(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    for garbage in [
        b"\x00\xffnot json".to_vec(),
        br#"{"tenant":"acme","event_id":"not-a-uuid"}"#.to_vec(),
    ] {
        rig.backdoor
            .publish_raw(garbage)
            .await
            .expect("publish garbage");
    }
    let id = rig.emit().await;
    rig.runs_once(id).await;
    assert_eq!(w.stats().garbage, 2);
    // Terminated, not nacked: it never comes back.
    tokio::time::sleep(QUIET).await;
    assert_eq!(w.stats().garbage, 2, "garbage is not redelivered");
    w.shutdown(SOON).await;
}

/// An event for a handler nobody registered is stored, kept and visible,
/// with its attempts untouched.
pub async fn unknown_handler_is_stored_and_kept(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    // After the start-up sweep, or it may notify the event a second time.
    rig.swept(&w).await;
    let id = rig
        .emit_to("not_deployed_yet", EmitOptions::default())
        .await;
    eventually("the notification is dropped", SOON, || {
        let n = w.stats().dropped;
        async move { n >= 1 }
    })
    .await;
    if let Some(q) = &rig.memory {
        assert!(q.is_empty(), "no notification circulates for it");
    }
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!((e.state, e.attempt), (EventState::Pending, 0));
    let counts = rig.client.counts().await.unwrap();
    assert!(counts
        .iter()
        .any(|c| c.handler == "not_deployed_yet" && c.count == 1));
    w.shutdown(SOON).await;
}

/// Payloads that are not JSON or too large are refused, saying which and why.
pub async fn bad_payloads_are_refused_and_nothing_is_stored(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let client = rig.client.clone().max_payload(1024);
    let err = client
        .emit_json(T, H, "{not json", EmitOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotJson(_)), "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(2000));
    let err = client
        .emit_json(T, H, &big, EmitOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::TooLarge {
                size: 2011,
                limit: 1024
            }
        ),
        "{err}"
    );
    let err = client
        .emit_json("", H, "{}", EmitOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tenant"), "{err}");
    let batch = vec![
        EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "{}".into(),
            options: EmitOptions::default(),
        },
        EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "[1,".into(),
            options: EmitOptions::default(),
        },
    ];
    let err = client.emit_batch(batch).await.unwrap_err();
    assert!(err.to_string().starts_with("event 1 of the batch"), "{err}");
    assert_eq!(rig.stored().await, 0, "a refused batch stores nothing");
}

/// A second emit with the same idempotency key returns the first event.
pub async fn idempotency_key_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    rig.client.pause(T, H).await.unwrap();
    let opts = EmitOptions::default().idempotency_key("order-42");
    let a = rig
        .client
        .emit_json(T, H, "{}", opts.clone())
        .await
        .unwrap();
    let b = rig
        .client
        .emit_json(T, H, "{}", opts.clone())
        .await
        .unwrap();
    assert!(matches!(a, crate::Emitted::Created(_)));
    assert_eq!(b, crate::Emitted::Existing(a.id()));
    // Another handler or tenant is another key space.
    let c = rig
        .client
        .emit_json("other", H, "{}", opts.clone())
        .await
        .unwrap();
    assert!(matches!(c, crate::Emitted::Created(_)));
    assert_eq!(rig.stored().await, 2);
    let w = rig.worker();
    rig.client.unpause(T, H).await.unwrap();
    rig.runs_once(a.id()).await;
    // Once done, the key is free again.
    let d = rig.client.emit_json(T, H, "{}", opts).await.unwrap();
    assert!(matches!(d, crate::Emitted::Created(_)));
    rig.runs_once(d.id()).await;
    w.shutdown(SOON).await;
}

/// A dead event can be retried by an operator: it runs again with fresh attempts.
pub async fn dead_event_can_be_retried(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("picky", move |_: serde_json::Value, cx: Context| {
            let (f, ledger) = (f.clone(), ledger.clone());
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if f.load(Ordering::SeqCst) {
                    return Err(HandlerError::fail("bad address"));
                }
                Ok(())
            }
        })
        .start();
    let id = rig.emit_to("picky", EmitOptions::default()).await;
    rig.until_dead(id).await;
    assert_eq!(
        rig.ledger.attempts_of(id),
        vec![1],
        "failed for good: no retry"
    );
    assert!(!rig.client.retry_dead(EventId::new()).await.unwrap());
    fail.store(false, Ordering::SeqCst);
    assert!(rig.client.retry_dead(id).await.unwrap());
    rig.until_gone(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 1]);
    w.shutdown(SOON).await;
}
