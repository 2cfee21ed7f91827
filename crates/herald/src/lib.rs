//! herald: a durable event queue. The database stores, the queue schedules.
//!
//! An embedder uses the crate root: a [`Client`] to emit events and run the
//! operator's verbs, a [`Worker`] (built with [`WorkerBuilder`] and
//! [`WorkerConfig`]) to run [`Handler`]s, [`Job`]s and functions on them,
//! the model types ([`Event`], [`Rule`], [`Subscription`], …), a [`Queue`]
//! ([`MemoryQueue`] in one process) and a store from a backend crate.
//! [`client`] and [`schedule`] hold the client's limits and the schedule
//! definitions. A store implements [`backend`]; a queue implements
//! [`queue`]. The conformance tests are in `testkit` (feature `testkit`).
//!
//! See `docs/architecture.md` for how the pieces fit.

pub mod backend;
pub mod client;
// The worker's decisions: the crate's own, public with the test kit only
// for their property tests (`tests/decision_props.rs`).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod decision;
#[cfg(not(feature = "testkit"))]
mod decision;
#[doc(hidden)]
pub mod escape;
mod group_commit;
mod handler;
pub mod limit;
mod memory_queue;
mod model;
mod publisher;
pub mod queue;
#[doc(hidden)]
pub mod redact;
mod retry;
pub mod schedule;
#[cfg(feature = "testkit")]
pub mod testkit;
mod worker;

pub use backend::{
    CappedCount, CountsQuery, EventFilter, HandlerCounts, Leadership, PendingSample, Store,
    StoreError, StoreResult, SubscriptionSync, DEFAULT_IDEMPOTENCY_WINDOW,
};
pub use client::{
    Client, ClientError, EmitOptions, EmitRequest, Release, StoredTopicEmit, SubscriberEmitted,
    TopicEmitted,
};
pub use decision::Policy;
pub use handler::{Context, Handler, HandlerError, IntoOutcome, Job, Outcome};
pub use limit::{Limit, LimitKind, LimitScope, LimitSource, LimitWait, StoredLimit, TenantKey};
pub use memory_queue::MemoryQueue;
pub use model::{
    AttemptError, BadNotification, Emitted, Event, EventId, EventState, Keep, Lease, LeaseToken,
    Millis, NewEvent, Notification, Rule, RuleKind, RuleMatch, RunAt, Singleton, Subscription,
};
pub use queue::{Delivery, DeliveryTag, MessageLimits, Publish, Queue, QueueError, Retention};
pub use retry::{RetryPolicy, DEFAULT_MAX_ATTEMPTS};
pub use worker::{
    RunObserver, RunSettled, ShutdownHandle, ShutdownReport, StatsSnapshot, Worker, WorkerBuilder,
    WorkerConfig, WorkerConfigError, WorkerStats, DEFAULT_LEASE, MIN_LEASE,
};
