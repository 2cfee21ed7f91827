//! herald: a durable event queue. The database stores, the queue schedules.
//!
//! See `docs/architecture.md` for how the pieces fit.

pub mod backend;
pub mod client;
pub mod decision;
pub mod escape;
mod group_commit;
pub mod handler;
pub mod memory_queue;
pub mod model;
mod publisher;
pub mod queue;
pub mod redact;
pub mod retry;
pub mod schedule;
pub mod sweep;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod worker;

pub use backend::{
    CappedCount, CountsQuery, EventFilter, HandlerCounts, Leadership, PendingSample, Store,
    StoreError, StoreResult, SubscriptionSync, DEFAULT_IDEMPOTENCY_WINDOW,
};
pub use client::{
    Client, ClientError, EmitOptions, EmitRequest, Release, StoredTopicEmit, SubscriberEmitted,
    TopicEmitted,
};
pub use handler::{Context, Handler, HandlerError, IntoOutcome, Job, Outcome};
pub use memory_queue::MemoryQueue;
pub use model::{
    AttemptError, Emitted, Event, EventId, EventState, Lease, LeaseToken, Millis, NewEvent,
    Notification, Rule, RuleKind, RuleMatch, RunAt, Subscription,
};
pub use queue::{Delivery, DeliveryTag, MessageLimits, Publish, Queue, QueueError, Retention};
pub use retry::{RetryPolicy, DEFAULT_MAX_ATTEMPTS};
pub use worker::{
    RunObserver, RunSettled, ShutdownHandle, ShutdownReport, StatsSnapshot, Worker, WorkerBuilder,
    WorkerConfig, WorkerConfigError, WorkerStats,
};
