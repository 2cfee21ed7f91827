//! The `Client`: emit events, and the operator's verbs (pause, unpause,
//! block, unblock, retry and delete dead events, inspect).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::backend::{
    CountsQuery, EventFilter, EventStore, HandlerCounts, Limits, Operator, Rules, Store,
    StoreError, Topics,
};
use crate::group_commit::GroupCommit;
pub use crate::group_commit::{
    DEFAULT_EMIT_TIMEOUT, DEFAULT_GROUP_COMMIT_WRITES, GROUP_MAX_EVENTS,
};
use crate::handler::Job;
use crate::limit::{Limit, LimitKind, LimitScope, StoredLimit};
use crate::model::{
    AttemptError, Emitted, Event, EventId, Keep, Millis, NewEvent, Rule, RuleKind, RuleMatch,
    RunAt, Singleton, Subscription,
};
use crate::publisher::{created, Publisher};
pub use crate::publisher::{DEFAULT_NOTIFY_LINGER, DEFAULT_NOTIFY_PUBLISHES, DEFAULT_NOTIFY_WAIT};
use crate::queue::Queue;
use crate::retry::DEFAULT_MAX_ATTEMPTS;

pub use crate::model::{DEFAULT_MAX_PAYLOAD, MAX_NAME_LEN};

/// Errors from the [`Client`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The payload is not valid JSON.
    #[error("payload is not valid JSON: {0}")]
    NotJson(String),
    /// The payload is larger than the configured limit.
    #[error("payload is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A name (tenant, handler, key) breaks the naming rule.
    #[error("{field} {value:?} is invalid: {reason}")]
    InvalidName {
        /// Which field.
        field: &'static str,
        /// The value given.
        value: String,
        /// The rule it broke.
        reason: &'static str,
    },
    /// `max_attempts` must be at least 1.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// An emit gave both an absolute `run_at` and a relative `delay`.
    #[error("give run_at or delay, not both")]
    RunAtAndDelay,
    /// One request of a batch was refused; nothing of the batch was stored.
    #[error("event {index} of the batch: {error}")]
    InBatch {
        /// Its position in the batch, from 0.
        index: usize,
        /// What was wrong with it.
        error: Box<ClientError>,
    },
    /// No handler is subscribed to the topic for the tenant: nothing was
    /// stored. An event that nobody will run is a loss the emitter should
    /// see, not a silent success (docs/semantics.md, "Fan-out").
    #[error(
        "no handler is subscribed to topic {topic:?} for tenant {tenant:?}; nothing was stored"
    )]
    NoSubscribers {
        /// The tenant emitted for.
        tenant: String,
        /// The topic emitted to.
        topic: String,
    },
    /// The store failed; nothing was stored.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One subscriber's copy of a topic emit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberEmitted {
    /// The subscribed handler.
    pub handler: String,
    /// Its event: new, or the one its idempotency key names.
    pub emitted: Emitted,
}

/// What [`Client::emit_topic`] stored: one event per subscribed handler,
/// in handler order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicEmitted {
    /// The topic.
    pub topic: String,
    /// Per subscribed handler, its event.
    pub events: Vec<SubscriberEmitted>,
}

/// Options of one emit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmitOptions {
    /// Run no earlier than this long from now, by the store's clock (the
    /// store adds it to its own now when it stores the event).
    pub delay: Option<Duration>,
    /// Run no earlier than this time (ms since the Unix epoch, UTC), by the
    /// store's clock: an absolute time beside the relative [`delay`]; an
    /// emit gives one or neither ([`ClientError::RunAtAndDelay`]). A time
    /// already past runs at once.
    ///
    /// [`delay`]: EmitOptions::delay
    pub run_at: Option<Millis>,
    /// Attempts before the event goes dead. Left out: the job's
    /// [`Job::MAX_ATTEMPTS`] on every typed path ([`Client::emit`],
    /// [`Client::emit_many`], [`EmitRequest::job`]), and
    /// [`DEFAULT_MAX_ATTEMPTS`] (10) for raw JSON.
    pub max_attempts: Option<u32>,
    /// One event per `(tenant, handler, key)`: a second emit returns the
    /// first's id, while the first is stored and for at least the store's
    /// idempotency window after the emit and after it finished (24 h by
    /// default: `with_idempotency_window` of the PostgreSQL and SQLite
    /// stores, herald.toml `idempotency_window`), so an emit retried after
    /// a timeout never stores a second event.
    pub idempotency_key: Option<String>,
    /// What the handler's limits per key count the event under, within its
    /// tenant (a customer, an account): at most the limit's number of runs
    /// at once per key ([`crate::limit`]). Without a limit per key it is
    /// stored and shown, and limits nothing.
    pub concurrency_key: Option<String>,
    /// At most one waiting event of this key (within the tenant and
    /// handler): keep the one waiting, or replace it ([`Singleton`]).
    pub singleton: Option<Singleton>,
}

impl EmitOptions {
    /// Delay the first run.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    /// Run no earlier than this time, by the store's clock.
    pub fn run_at(mut self, at: Millis) -> Self {
        self.run_at = Some(at);
        self
    }

    /// When the event is due: at `run_at`, or `delay` after the store's
    /// now (now when neither is given).
    fn due(&self) -> Result<RunAt, ClientError> {
        match (self.run_at, self.delay) {
            (Some(_), Some(_)) => Err(ClientError::RunAtAndDelay),
            (Some(at), None) => Ok(RunAt::At(at)),
            (None, delay) => Ok(RunAt::After(delay.unwrap_or_default())),
        }
    }

    /// Attempts before the event goes dead.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Deduplicate on this key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Count the event's runs under this key for its handler's limits per
    /// key.
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// One waiting event of this key: keep the one waiting
    /// ([`Keep::Oldest`]) or replace it ([`Keep::Newest`]).
    pub fn singleton(mut self, key: impl Into<String>, keep: Keep) -> Self {
        self.singleton = Some(Singleton {
            key: key.into(),
            keep,
        });
        self
    }
}

/// One event to emit, for [`Client::emit_batch`]: raw JSON for any handler
/// name, or a typed job with [`EmitRequest::job`].
#[derive(Clone, Debug)]
pub struct EmitRequest {
    /// Owner namespace.
    pub tenant: String,
    /// Handler name.
    pub handler: String,
    /// JSON text.
    pub payload: String,
    /// Options; with `max_attempts` left out, raw JSON gets
    /// [`DEFAULT_MAX_ATTEMPTS`].
    pub options: EmitOptions,
}

impl EmitRequest {
    /// A typed job for `tenant`, under [`Job::NAME`], with
    /// [`Job::MAX_ATTEMPTS`]: what [`Client::emit`] stores.
    pub fn job<J: Job>(tenant: impl Into<String>, job: &J) -> Result<Self, ClientError> {
        Self::job_with(tenant, job, EmitOptions::default())
    }

    /// [`EmitRequest::job`] with options; `max_attempts` left out is
    /// [`Job::MAX_ATTEMPTS`].
    pub fn job_with<J: Job>(
        tenant: impl Into<String>,
        job: &J,
        mut options: EmitOptions,
    ) -> Result<Self, ClientError> {
        options.max_attempts = options.max_attempts.or(Some(J::MAX_ATTEMPTS));
        Ok(EmitRequest {
            tenant: tenant.into(),
            handler: J::NAME.to_string(),
            payload: to_json(job)?,
            options,
        })
    }
}

/// What unpause or unblock did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Whether the rule existed.
    pub removed: bool,
    /// The rules that still hold the handler (the other kind).
    pub still_held: RuleMatch,
    /// Events re-notified (0 while still held).
    pub notified: u64,
}

/// Emits events and runs operator commands against a store and a queue.
#[derive(Clone)]
pub struct Client {
    /// Emits, through group commit.
    events: Arc<dyn EventStore>,
    /// Pause, block, and the re-notification when one is lifted.
    rules: Arc<dyn Rules>,
    /// Subscriptions, and the subscribers of a topic emit.
    topics: Arc<dyn Topics>,
    /// The operator's reads and writes of events.
    operator: Arc<dyn Operator>,
    /// Concurrency limits, and the wake of their waiters.
    limits: Arc<dyn Limits>,
    queue: Arc<dyn Queue>,
    max_payload: usize,
    publisher: Arc<Publisher>,
    commit: Arc<GroupCommit>,
}

/// How many events a re-notify page holds.
const RENOTIFY_PAGE: usize = 1000;

/// How many scopes with waiters one wake call looks at.
const WAKE_SCOPES: usize = 100;

/// Checks the tenant and key a limit's scope names.
fn check_limit_names(scope: &LimitScope) -> Result<(), ClientError> {
    match scope {
        LimitScope::Handler
        | LimitScope::Tenant { tenant: None }
        | LimitScope::Key { key: None } => Ok(()),
        LimitScope::Tenant { tenant: Some(t) } => check_name("tenant", t),
        LimitScope::Key { key: Some(k) } => {
            check_name("tenant", &k.tenant)?;
            check_name("concurrency_key", &k.key)
        }
    }
}

impl Client {
    /// A client on a store and a queue.
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>) -> Self {
        let publisher = Arc::new(Publisher::new(
            queue.clone(),
            DEFAULT_NOTIFY_LINGER,
            DEFAULT_NOTIFY_PUBLISHES,
            DEFAULT_NOTIFY_WAIT,
        ));
        Client {
            commit: Arc::new(GroupCommit::new(
                store.clone(),
                publisher.clone(),
                DEFAULT_GROUP_COMMIT_WRITES,
                DEFAULT_EMIT_TIMEOUT,
            )),
            publisher,
            events: store.clone(),
            rules: store.clone(),
            topics: store.clone(),
            limits: store.clone(),
            operator: store,
            queue,
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }

    /// Sets how long notifications wait at most for a publish in flight to
    /// end, to be published together with the others that wait (default
    /// [`DEFAULT_NOTIFY_LINGER`], 1 ms; zero publishes each at once).
    /// What waits is one grouped write's notifications (see
    /// [`Client::group_commit`]), or one emit's when it is written on its
    /// own. While fewer than [`Client::notify_publishes`] are in flight they
    /// go out at once; beyond that an emit returns up to this much later,
    /// and emits close in time share messages (docs/semantics.md).
    pub fn notify_linger(self, linger: Duration) -> Self {
        let (publishes, wait) = (self.publisher.publishes, self.publisher.wait);
        self.publishing(linger, publishes, wait)
    }

    /// Sets how many publishes of emits' notifications may be in flight
    /// before the next emits' wait (at most the linger) to be grouped
    /// (default [`DEFAULT_NOTIFY_PUBLISHES`]; 0 counts as 1). More lets a
    /// write's notifications rarely wait out another's broker round trip;
    /// fewer groups more under load (fewer, larger messages).
    pub fn notify_publishes(self, publishes: usize) -> Self {
        let (linger, wait) = (self.publisher.linger, self.publisher.wait);
        self.publishing(linger, publishes, wait)
    }

    /// Sets how long an emit whose events are stored waits at most for
    /// their notifications' publish (default [`DEFAULT_NOTIFY_WAIT`],
    /// 250 ms). Past it the emit answers and the publish goes on in the
    /// background; a publish that fails (the broker is away) is logged, and
    /// the reconciler notifies those events once they have been quiet for
    /// its `sweep_quiet`. The wait only matters when the broker is slow or
    /// away: a publish to one that answers ends well within it.
    pub fn notify_wait(self, wait: Duration) -> Self {
        let (linger, publishes) = (self.publisher.linger, self.publisher.publishes);
        self.publishing(linger, publishes, wait)
    }

    /// Sets how long an emit waits at most for the store (default
    /// [`DEFAULT_EMIT_TIMEOUT`], 5 s): past it the emit fails with
    /// [`StoreError::Unavailable`] (`herald serve` answers 503
    /// `store_unavailable`), whether the store is slow, retrying a lost
    /// connection, or not answering at all. A write already under way goes
    /// on, so such an emit's events may be stored all the same: an emit
    /// tried again after it should carry an idempotency key. A topic emit's
    /// read of the subscribers counts toward the same bound.
    pub fn emit_timeout(mut self, timeout: Duration) -> Self {
        self.commit = Arc::new(GroupCommit::new(
            self.events.clone(),
            self.publisher.clone(),
            self.commit.writes,
            timeout,
        ));
        self
    }

    /// A new publisher with these settings, and a group commit that
    /// notifies through it.
    fn publishing(mut self, linger: Duration, publishes: usize, wait: Duration) -> Self {
        self.publisher = Arc::new(Publisher::new(self.queue.clone(), linger, publishes, wait));
        let writes = self.commit.writes;
        self.group_commit(writes)
    }

    /// Sets how many store writes of emits may run at once (default
    /// [`DEFAULT_GROUP_COMMIT_WRITES`]). An emit that finds one free is
    /// written at once; emits that arrive while all are busy are written
    /// together by the next free one, in one store call (group commit:
    /// single emits under load share statements and commits), and their
    /// notifications are published together once it commits, as one
    /// publish (grouped only with other writes' by the linger). Zero writes
    /// each emit on its own, as it comes, with no limit on how many at once.
    /// Batches of [`GROUP_MAX_EVENTS`] or more are always written on their
    /// own. Each emit's answer is its own: a grouped write that fails for
    /// one emit's events is tried again emit by emit.
    pub fn group_commit(mut self, writes: usize) -> Self {
        self.commit = Arc::new(GroupCommit::new(
            self.events.clone(),
            self.publisher.clone(),
            writes,
            self.commit.timeout,
        ));
        self
    }

    /// Sets the payload size limit in bytes.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// The payload size limit in bytes ([`Client::max_payload`]).
    pub fn payload_limit(&self) -> usize {
        self.max_payload
    }

    /// The queue.
    pub fn queue(&self) -> &Arc<dyn Queue> {
        &self.queue
    }

    /// Emits a typed job for `tenant`.
    pub async fn emit<J: Job>(&self, tenant: &str, job: &J) -> Result<EventId, ClientError> {
        self.emit_with(tenant, job, EmitOptions::default())
            .await
            .map(Emitted::id)
    }

    /// Emits a typed job with options.
    pub async fn emit_with<J: Job>(
        &self,
        tenant: &str,
        job: &J,
        options: EmitOptions,
    ) -> Result<Emitted, ClientError> {
        let request = EmitRequest::job_with(tenant, job, options)?;
        let mut out = self.emit_batch(vec![request]).await?;
        Ok(out.pop().expect("one result per request"))
    }

    /// Emits typed jobs for `tenant` in one store call and one publish,
    /// each with [`Job::MAX_ATTEMPTS`], as [`Client::emit`] would. Returns
    /// their ids in order. One bad job refuses the whole batch.
    pub async fn emit_many<J: Job>(
        &self,
        tenant: &str,
        jobs: &[J],
    ) -> Result<Vec<EventId>, ClientError> {
        let out = self
            .emit_many_with(tenant, jobs, EmitOptions::default())
            .await?;
        Ok(out.into_iter().map(Emitted::id).collect())
    }

    /// [`Client::emit_many`] with the same options for every job. An
    /// idempotency key applies to each, so that the first job stands for
    /// the rest: give keys per job with [`EmitRequest::job_with`] and
    /// [`Client::emit_batch`] instead.
    pub async fn emit_many_with<J: Job>(
        &self,
        tenant: &str,
        jobs: &[J],
        options: EmitOptions,
    ) -> Result<Vec<Emitted>, ClientError> {
        let batch = jobs
            .iter()
            .enumerate()
            .map(|(index, job)| {
                EmitRequest::job_with(tenant, job, options.clone()).map_err(|e| {
                    ClientError::InBatch {
                        index,
                        error: Box::new(e),
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.emit_batch(batch).await
    }

    /// Emits raw JSON for any handler name. The handler need not be
    /// registered anywhere yet: the event waits, stored, until one is.
    pub async fn emit_json(
        &self,
        tenant: &str,
        handler: &str,
        payload: &str,
        options: EmitOptions,
    ) -> Result<Emitted, ClientError> {
        let request = EmitRequest {
            tenant: tenant.to_string(),
            handler: handler.to_string(),
            payload: payload.to_string(),
            options,
        };
        let mut out = self.emit_batch(vec![request]).await?;
        Ok(out.pop().expect("one result per request"))
    }

    /// Emits many events in one store call and one publish. Every request is
    /// validated first: one bad request refuses the whole batch, naming its
    /// index. Typed jobs: build requests with [`EmitRequest::job`] (which
    /// carries the job's max attempts), or use [`Client::emit_many`].
    pub async fn emit_batch(&self, batch: Vec<EmitRequest>) -> Result<Vec<Emitted>, ClientError> {
        let events = self.prepare(batch)?;
        let deadline = self.commit.deadline();
        let (events, emitted) = self.commit.emit(events, deadline).await;
        let emitted = emitted?;
        count_emitted(&events, &emitted);
        Ok(emitted)
    }

    /// Validates requests into events ready to store, without storing them.
    /// For stores that insert inside the caller's own transaction: store
    /// them there, commit, then call [`Client::notify_emitted`]. One bad
    /// request refuses the whole batch, naming its index.
    pub fn prepare(&self, batch: Vec<EmitRequest>) -> Result<Vec<NewEvent>, ClientError> {
        let single = batch.len() == 1;
        let mut events = Vec::with_capacity(batch.len());
        for (index, r) in batch.into_iter().enumerate() {
            match self.validate(r) {
                Ok(e) => events.push(e),
                Err(e) if single => return Err(e),
                Err(e) => {
                    return Err(ClientError::InBatch {
                        index,
                        error: Box::new(e),
                    })
                }
            }
        }
        Ok(events)
    }

    /// Publishes the notifications of stored events (only those newly
    /// created; an idempotent hit was notified when it was created). Call it
    /// after the transaction that stored them committed. A failure is
    /// logged, not returned: the reconciler notifies what this could not.
    pub async fn notify_emitted(&self, events: &[NewEvent], emitted: &[Emitted]) {
        count_emitted(events, emitted);
        self.publisher.publish(created(events, emitted)).await;
    }

    /// Emits raw JSON to a topic for `tenant`: one event per handler
    /// subscribed for this tenant or for every tenant, each with the same
    /// payload and options, stored in one store call (all or none) and then
    /// notified. Each copy is an event of its own (attempts, delay, pause
    /// and block, dead state, retry), with [`Event::topic`] set; an
    /// idempotency key deduplicates each copy on its own `(tenant, handler,
    /// key)`. No subscriber: [`ClientError::NoSubscribers`], nothing stored.
    /// A subscription added or removed while this runs applies if it was
    /// stored before the subscribers were read.
    pub async fn emit_topic_json(
        &self,
        tenant: &str,
        topic: &str,
        payload: &str,
        options: EmitOptions,
    ) -> Result<TopicEmitted, ClientError> {
        // Refuse bad input before reading the store.
        self.check_topic_emit(tenant, topic, payload, &options)?;
        let deadline = self.commit.deadline();
        let handlers =
            match tokio::time::timeout_at(deadline, self.topics.subscribers(tenant, topic)).await {
                Ok(handlers) => handlers?,
                Err(_) => return Err(self.commit.timed_out().into()),
            };
        let events = topic_copies(tenant, topic, payload, options, &handlers)?;
        let (events, emitted) = self.commit.emit(events, deadline).await;
        let emitted = emitted?;
        count_emitted(&events, &emitted);
        Ok(topic_emitted(topic, &events, &emitted))
    }

    /// [`Client::emit_topic_json`] with a payload serialized to JSON.
    pub async fn emit_topic<T: Serialize>(
        &self,
        tenant: &str,
        topic: &str,
        payload: &T,
        options: EmitOptions,
    ) -> Result<TopicEmitted, ClientError> {
        let payload = to_json(payload)?;
        self.emit_topic_json(tenant, topic, &payload, options).await
    }

    /// Builds a topic emit's events, one per handler of `subscribers` (read
    /// with [`Topics::subscribers`], or inside the caller's transaction: see
    /// `herald_postgres::PgStore::emit_topic_in`), without storing them.
    /// No subscriber: [`ClientError::NoSubscribers`].
    pub fn prepare_topic(
        &self,
        tenant: &str,
        topic: &str,
        payload: &str,
        options: EmitOptions,
        subscribers: &[String],
    ) -> Result<Vec<NewEvent>, ClientError> {
        self.check_topic_emit(tenant, topic, payload, &options)?;
        topic_copies(tenant, topic, payload, options, subscribers)
    }

    /// The checks of a topic emit that need no subscriber (names, payload,
    /// options): what [`Client::emit_topic_json`] refuses before it reads
    /// the store.
    pub fn check_topic_emit(
        &self,
        tenant: &str,
        topic: &str,
        payload: &str,
        options: &EmitOptions,
    ) -> Result<(), ClientError> {
        check_name("tenant", tenant)?;
        check_name("topic", topic)?;
        self.check_payload(payload)?;
        if let Some(key) = &options.idempotency_key {
            check_name("idempotency_key", key)?;
        }
        if let Some(key) = &options.concurrency_key {
            check_name("concurrency_key", key)?;
        }
        if let Some(s) = &options.singleton {
            check_name("singleton key", &s.key)?;
        }
        if options.max_attempts == Some(0) {
            return Err(ClientError::NoAttempts);
        }
        Ok(())
    }

    fn check_payload(&self, payload: &str) -> Result<(), ClientError> {
        if payload.len() > self.max_payload {
            return Err(ClientError::TooLarge {
                size: payload.len(),
                limit: self.max_payload,
            });
        }
        serde_json::from_str::<&RawValue>(payload)
            .map_err(|e| ClientError::NotJson(e.to_string()))?;
        Ok(())
    }

    /// Subscribes a handler to a topic (for one tenant or every tenant);
    /// false if it already was. It applies to the topic emits that read
    /// the subscribers after it is stored.
    pub async fn subscribe(&self, subscription: &Subscription) -> Result<bool, ClientError> {
        check_subscription(subscription)?;
        Ok(self.topics.subscribe(subscription).await?)
    }

    /// Removes a subscription; false if there was none. Events already
    /// stored for it stay, and run.
    pub async fn unsubscribe(&self, subscription: &Subscription) -> Result<bool, ClientError> {
        check_subscription(subscription)?;
        Ok(self.topics.unsubscribe(subscription).await?)
    }

    /// The handlers an emit to `topic` for `tenant` would store an event
    /// for, in name order.
    pub async fn subscribers(&self, tenant: &str, topic: &str) -> Result<Vec<String>, ClientError> {
        check_name("tenant", tenant)?;
        check_name("topic", topic)?;
        Ok(self.topics.subscribers(tenant, topic).await?)
    }

    /// The subscriptions, of one topic or of all.
    pub async fn subscriptions(
        &self,
        topic: Option<&str>,
    ) -> Result<Vec<Subscription>, ClientError> {
        if let Some(topic) = topic {
            check_name("topic", topic)?;
        }
        Ok(self.topics.subscriptions(topic).await?)
    }

    /// Publishes the notifications of a topic emit stored in the caller's
    /// transaction ([`Client::notify_emitted`] for its events): call it
    /// after the commit. A failure is logged; the reconciler notifies what
    /// this could not.
    pub async fn notify_topic(&self, stored: &StoredTopicEmit) {
        self.notify_emitted(&stored.events, &stored.emitted).await;
    }

    fn validate(&self, r: EmitRequest) -> Result<NewEvent, ClientError> {
        check_name("tenant", &r.tenant)?;
        check_name("handler", &r.handler)?;
        if let Some(key) = &r.options.idempotency_key {
            check_name("idempotency_key", key)?;
        }
        if let Some(key) = &r.options.concurrency_key {
            check_name("concurrency_key", key)?;
        }
        if let Some(s) = &r.options.singleton {
            check_name("singleton key", &s.key)?;
        }
        self.check_payload(&r.payload)?;
        let max_attempts = r.options.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(ClientError::NoAttempts);
        }
        let run_at = r.options.due()?;
        Ok(NewEvent {
            singleton: r.options.singleton,
            concurrency_key: r.options.concurrency_key,
            id: EventId::new(),
            tenant: r.tenant,
            handler: r.handler,
            payload: r.payload,
            run_at,
            max_attempts,
            idempotency_key: r.options.idempotency_key,
            topic: None,
        })
    }

    /// Pauses `(tenant, handler)`: its events stay stored and do not start.
    /// Returns false if it was already paused.
    pub async fn pause(&self, tenant: &str, handler: &str) -> Result<bool, ClientError> {
        self.add_rule(tenant, handler, RuleKind::Pause).await
    }

    /// Blocks `(tenant, handler)` (an operator's rule, stronger than pause).
    pub async fn block(&self, tenant: &str, handler: &str) -> Result<bool, ClientError> {
        self.add_rule(tenant, handler, RuleKind::Block).await
    }

    /// Lifts a pause; if no block remains, re-notifies every stored event of
    /// the handler, page by page.
    pub async fn unpause(&self, tenant: &str, handler: &str) -> Result<Release, ClientError> {
        self.remove_rule(tenant, handler, RuleKind::Pause).await
    }

    /// Lifts a block; if no pause remains, re-notifies every stored event.
    pub async fn unblock(&self, tenant: &str, handler: &str) -> Result<Release, ClientError> {
        self.remove_rule(tenant, handler, RuleKind::Block).await
    }

    async fn add_rule(
        &self,
        tenant: &str,
        handler: &str,
        kind: RuleKind,
    ) -> Result<bool, ClientError> {
        Ok(self.rules.add_rule(&rule(tenant, handler, kind)?).await?)
    }

    async fn remove_rule(
        &self,
        tenant: &str,
        handler: &str,
        kind: RuleKind,
    ) -> Result<Release, ClientError> {
        let removed = self
            .rules
            .remove_rule(&rule(tenant, handler, kind)?)
            .await?;
        let still_held = self.rules.rules_for(tenant, handler).await?;
        let mut release = Release {
            removed,
            still_held,
            notified: 0,
        };
        if still_held.holds() {
            return Ok(release);
        }
        // Page through all of them, however many: no cap. Only an empty page
        // ends it: a short one does not, because events of a page can finish
        // while the page is read (the reconciler re-notifies the events of a
        // rule that is gone, and workers run them meanwhile).
        let mut after = None;
        loop {
            let page = self
                .rules
                .renotify_page(tenant, handler, after, RENOTIFY_PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = Some(last.event_id);
            release.notified += page.len() as u64;
            self.publisher.publish_now(page).await;
        }
        Ok(release)
    }

    /// Sets a concurrency limit ([`crate::limit`]), replacing the same
    /// scope's; a raised limit wakes as many of its waiters as it has room
    /// for now. Returns false if it was already so.
    pub async fn set_limit(&self, limit: &Limit) -> Result<bool, ClientError> {
        check_name("handler", &limit.handler)?;
        check_limit_names(&limit.scope)?;
        let changed = self.limits.set_limit(limit).await?;
        if changed {
            self.wake_limit(&limit.handler, limit.scope.kind()).await?;
        }
        Ok(changed)
    }

    /// Removes a concurrency limit, waking every event it held. Returns
    /// false if there was none.
    pub async fn remove_limit(
        &self,
        handler: &str,
        scope: &LimitScope,
    ) -> Result<bool, ClientError> {
        check_name("handler", handler)?;
        check_limit_names(scope)?;
        let removed = self.limits.remove_limit(handler, scope).await?;
        if removed {
            self.wake_limit(handler, scope.kind()).await?;
        }
        Ok(removed)
    }

    /// The concurrency limits, of one handler or of all.
    pub async fn limits(&self, handler: Option<&str>) -> Result<Vec<StoredLimit>, ClientError> {
        Ok(self.limits.limits(handler).await?)
    }

    /// Makes the config file's concurrency limits exactly `declared` (the
    /// API's stay), waking the waiters of those raised or removed.
    pub async fn sync_limits(&self, declared: &[Limit]) -> Result<(), ClientError> {
        for l in declared {
            check_name("handler", &l.handler)?;
            check_limit_names(&l.scope)?;
        }
        for (handler, kind) in self.limits.sync_limits(declared).await? {
            self.wake_limit(&handler, kind).await?;
        }
        Ok(())
    }

    /// Wakes, page by page, the waiters that `handler`'s scopes of `kind`
    /// have room for now, and notifies them. Returns how many woke.
    async fn wake_limit(&self, handler: &str, kind: LimitKind) -> Result<u64, ClientError> {
        let mut after = None;
        let mut woken = 0;
        loop {
            let page = self
                .limits
                .wake_limit(handler, kind, after, WAKE_SCOPES)
                .await?;
            woken += page.woken.len() as u64;
            if !page.woken.is_empty() {
                self.publisher.publish_now(page.woken).await;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(woken),
            }
        }
    }

    /// Moves a dead event back to pending with fresh attempts and notifies it.
    /// Returns false if the event is not dead.
    pub async fn retry_dead(&self, id: EventId) -> Result<bool, ClientError> {
        match self.operator.revive(id).await? {
            Some(s) => {
                self.publisher.publish_now(vec![s]).await;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Deletes an event that is not running. Returns whether it was deleted.
    pub async fn delete(&self, id: EventId) -> Result<bool, ClientError> {
        Ok(self.operator.delete(id).await?)
    }

    /// One event.
    pub async fn get(&self, id: EventId) -> Result<Option<Event>, ClientError> {
        Ok(self.operator.get(id).await?)
    }

    /// The full concurrency limit that holds an event (parked until a
    /// slot frees), if one does.
    pub async fn waiting(
        &self,
        id: EventId,
    ) -> Result<Option<crate::limit::LimitWait>, ClientError> {
        let seen = self.events.inspect(&[id]).await?;
        Ok(seen.found.into_iter().find_map(|i| i.waiting))
    }

    /// The event's error history, oldest first (see
    /// [`Operator::history`]).
    pub async fn history(&self, id: EventId) -> Result<Vec<AttemptError>, ClientError> {
        Ok(self.operator.history(id).await?)
    }

    /// Events matching `filter`, in id order.
    pub async fn list(
        &self,
        filter: &EventFilter,
        limit: usize,
    ) -> Result<Vec<Event>, ClientError> {
        Ok(self.operator.list(filter, limit).await?)
    }

    /// Counts per `(tenant, handler)`: waiting, running, delayed, held,
    /// dead and done, cheap on millions of events (see [`Operator::counts`];
    /// a row says when its split is `estimated`).
    pub async fn handler_counts(
        &self,
        query: &CountsQuery,
    ) -> Result<Vec<HandlerCounts>, ClientError> {
        Ok(self.operator.counts(query).await?)
    }

    /// Every pause and block.
    pub async fn rules(&self) -> Result<Vec<Rule>, ClientError> {
        Ok(self.rules.rules().await?)
    }
}

/// Checks a subscription's names.
pub fn check_subscription(s: &Subscription) -> Result<(), ClientError> {
    if let Some(tenant) = &s.tenant {
        check_name("tenant", tenant)?;
    }
    check_name("topic", &s.topic)?;
    check_name("handler", &s.handler)
}

/// Pairs a topic emit's events with the store's answers.
fn topic_emitted(topic: &str, events: &[NewEvent], emitted: &[Emitted]) -> TopicEmitted {
    TopicEmitted {
        topic: topic.to_string(),
        events: events
            .iter()
            .zip(emitted)
            .map(|(e, &emitted)| SubscriberEmitted {
                handler: e.handler.clone(),
                emitted,
            })
            .collect(),
    }
}

/// A topic emit stored inside the caller's transaction (as
/// `herald_postgres::PgStore::emit_topic_in` does): its events and the
/// store's answers, to notify with [`Client::notify_topic`] once the
/// transaction committed.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTopicEmit {
    /// The topic.
    pub topic: String,
    /// The events, one per subscriber.
    pub events: Vec<NewEvent>,
    /// The store's answer for each.
    pub emitted: Vec<Emitted>,
}

impl StoredTopicEmit {
    /// Per subscribed handler, its event.
    pub fn outcome(&self) -> TopicEmitted {
        topic_emitted(&self.topic, &self.events, &self.emitted)
    }
}

fn rule(tenant: &str, handler: &str, kind: RuleKind) -> Result<Rule, ClientError> {
    check_name("tenant", tenant)?;
    check_name("handler", handler)?;
    Ok(Rule {
        tenant: tenant.into(),
        handler: handler.into(),
        kind,
    })
}

/// Adds the newly created events to `herald_events_emitted_total`, one
/// increment per handler name of the batch.
fn count_emitted(events: &[NewEvent], emitted: &[Emitted]) {
    let mut per_handler: Vec<(&str, u64)> = Vec::new();
    for (ev, e) in events.iter().zip(emitted) {
        if !matches!(e, Emitted::Created(_)) {
            continue;
        }
        match per_handler.iter_mut().find(|(h, _)| *h == ev.handler) {
            Some((_, n)) => *n += 1,
            None => per_handler.push((&ev.handler, 1)),
        }
    }
    for (handler, n) in per_handler {
        metrics::counter!("herald_events_emitted_total", "handler" => handler.to_string())
            .increment(n);
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<String, ClientError> {
    serde_json::to_string(value).map_err(|e| ClientError::NotJson(e.to_string()))
}

/// A checked topic emit's events, one per subscribed handler, each with
/// the topic: the emit was checked once ([`Client::check_topic_emit`]), and
/// the handlers' names when they were subscribed, so a topic of 1,000
/// subscribers does not parse its payload 1,000 times.
fn topic_copies(
    tenant: &str,
    topic: &str,
    payload: &str,
    options: EmitOptions,
    subscribers: &[String],
) -> Result<Vec<NewEvent>, ClientError> {
    if subscribers.is_empty() {
        return Err(ClientError::NoSubscribers {
            tenant: tenant.to_string(),
            topic: topic.to_string(),
        });
    }
    let run_at = options.due()?;
    let max_attempts = options.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    Ok(subscribers
        .iter()
        .map(|handler| NewEvent {
            singleton: options.singleton.clone(),
            concurrency_key: options.concurrency_key.clone(),
            id: EventId::new(),
            tenant: tenant.to_string(),
            handler: handler.clone(),
            payload: payload.to_string(),
            run_at,
            max_attempts,
            idempotency_key: options.idempotency_key.clone(),
            topic: Some(topic.to_string()),
        })
        .collect())
}

/// The naming rule for tenants, handlers, topics and keys: 1 to 200 bytes of UTF-8
/// with no control characters. Anything else (quotes, slashes, unicode, SQL)
/// is stored and shown exactly as given.
pub fn check_name(field: &'static str, value: &str) -> Result<(), ClientError> {
    match crate::model::name_rule_broken(value) {
        None => Ok(()),
        Some(reason) => Err(ClientError::InvalidName {
            field,
            value: value.chars().take(60).collect(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        assert!(check_name("tenant", "acme").is_ok());
        assert!(check_name("tenant", "O'Brien/\"x\"; DROP TABLE events;--ü").is_ok());
        assert!(check_name("tenant", "").is_err());
        assert!(check_name("tenant", "a\nb").is_err());
        assert!(check_name("tenant", &"x".repeat(201)).is_err());
        assert!(check_name("topic", "user.signup").is_ok());
    }
}
