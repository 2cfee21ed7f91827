//! End-to-end scenarios: a store, a queue, real workers. Each asserts
//! exact counts of runs and of stored events.
//!
//! The queue is the in-process one, unless the scenario runs inside
//! [`with_queues`] (what `engine_suite!(store, queue = maker)` does): then
//! each rig takes a fresh queue of a backend from the maker. The few checks
//! that look inside the in-process queue (how many notifications wait) are
//! made only on it.

mod ahead;
mod failures;
mod intake;
mod leases;
mod limits;
mod messages;
mod reconcile;
mod rules;
mod runs;
mod schedules;
mod shutdown;
mod topics;

// The suite macro names every scenario as `engine::<name>`.
pub use ahead::*;
pub use failures::*;
pub use intake::*;
pub use leases::*;
pub use limits::*;
pub use messages::*;
pub use reconcile::*;
pub use rules::*;
pub use runs::*;
pub use schedules::*;
pub use shutdown::*;
pub use topics::*;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::queue::{QueueBackdoor, TestQueue};
use super::{eventually, stored, Ledger};
use crate::backend::{Finish, Settle, Store};
use crate::client::{Client, EmitOptions};
use crate::decision::Policy;
use crate::handler::Context;
use crate::memory_queue::MemoryQueue;
use crate::model::{EventId, EventState, LeaseToken, NewEvent};
use crate::queue::Queue;
use crate::retry::RetryPolicy;
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

/// An event of tenant `T` for `handler`, due now, to store without a
/// notification (`EventStore::emit`).
fn new_event(handler: &str) -> NewEvent {
    NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: T.into(),
        handler: handler.into(),
        payload: "{}".into(),
        run_at: crate::model::RunAt::NOW,
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
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
        self.builder_on(self.store.clone())
    }

    /// [`Rig::builder`] on another store (one around the rig's, say).
    fn builder_on(&self, store: Arc<dyn Store>) -> WorkerBuilder {
        let ledger = self.ledger.clone();
        Worker::builder(store, self.queue.clone())
            .config(config())
            .handler(H, move |_: serde_json::Value, cx: Context| {
                let ledger = ledger.clone();
                async move { ledger.record(cx.event_id, cx.attempt) }
            })
    }

    fn worker(&self) -> Worker {
        self.builder().start()
    }

    /// A worker (configured by `edit`) whose `slow` handler counts its
    /// starts in `started` and runs until it is cancelled.
    fn waits_for_cancel(
        &self,
        started: Arc<AtomicUsize>,
        edit: impl FnOnce(&mut WorkerConfig),
    ) -> Worker {
        self.builder()
            .configure(edit)
            .handler("slow", move |_: serde_json::Value, cx: Context| {
                let started = started.clone();
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    cx.cancelled().await;
                }
            })
            .start()
    }

    /// Checks that each of `ids` was released by a cancel (attempt given
    /// back, no lease, pending), then that a new worker runs each once, on
    /// its first attempt, and the store ends empty.
    async fn released_then_run_once(&self, ids: &[EventId]) {
        for id in ids {
            let e = self.store.get(*id).await.unwrap().expect("kept");
            assert_eq!(e.attempt, 0, "the cancelled attempt was given back");
            assert!(e.lease.is_none(), "the lease was released");
            assert_eq!(e.state, EventState::Pending);
        }
        let ledger = self.ledger.clone();
        let next = self
            .builder()
            .handler("slow", move |_: serde_json::Value, cx: Context| {
                let ledger = ledger.clone();
                async move { ledger.record(cx.event_id, cx.attempt) }
            })
            .start();
        for id in ids {
            self.runs_once(*id).await;
            assert_eq!(self.ledger.attempts_of(*id), vec![1]);
        }
        assert_eq!(self.stored().await, 0);
        next.shutdown(SOON).await;
    }

    /// Waits until `w` has led and finished its first sweep. The in-process
    /// queue forgets on restart, so that sweep notifies every due event last
    /// notified before the queue began, or in its first 100 ms, whatever its
    /// quiet period: an event emitted then may be notified twice. Later
    /// sweeps never offer an event under a live lease, nor one released or
    /// notified less than `sweep_quiet` ago.
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

    /// [`Rig::runs_once`] for many events, with one quiet period for all.
    async fn each_runs_once(&self, ids: &[EventId]) {
        let ledger = self.ledger.clone();
        eventually("every event runs", SOON, || {
            let all = ids.iter().all(|id| ledger.runs_of(*id) >= 1);
            async move { all }
        })
        .await;
        for id in ids {
            self.until_gone(*id).await;
        }
        tokio::time::sleep(QUIET).await;
        for id in ids {
            assert_eq!(self.ledger.runs_of(*id), 1, "event {id} ran more than once");
        }
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
        let tenant = event.tenant.clone();
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
        assert_eq!(released.held, vec![true]);
        let token = LeaseToken::new();
        let got = self
            .store
            .claim(
                &crate::testkit::leases(&[id], token),
                &[handler],
                &[tenant],
                lease,
            )
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "the stolen lease was claimed");
        token
    }
}
