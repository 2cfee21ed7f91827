//! The backend interface: what a store implements. A store is where events
//! live, the only source of truth. Its interface is split by role, each
//! trait what one part of the runtime calls:
//!
//! - [`EventStore`]: the hot path (emit, claim, settle, renew, inspect,
//!   clock): the worker and the client's emits;
//! - [`Rules`]: pause and block, and the re-notification when one is lifted;
//! - [`Topics`]: topic subscriptions;
//! - [`Reconciliation`]: the elected reconciler's sweep, purges and upkeep;
//! - [`LeaderElection`]: the reconciler's and the scheduler's leader leases;
//! - [`Operator`]: the operator's reads and writes of single events;
//! - [`Schedules`]: schedule definitions and the scheduler's firing;
//! - [`Limits`]: concurrency limits, and the wake of the events they
//!   hold when one is raised or removed.
//!
//! A backend implements all eight and gets the umbrella [`Store`] from a
//! blanket implementation; the conformance tests in `herald::testkit`
//! (feature `testkit`) check it. Every hot-path method takes and returns a
//! batch, so that a backend can group-commit: one statement (or one
//! transaction) per batch, not per event. Operator methods (rules, revive,
//! delete, list) take one item.
//!
//! Hot-path methods ([`EventStore::claim`], [`EventStore::settle`],
//! [`EventStore::renew`], [`EventStore::inspect`]) touch events by primary
//! key only. Lease expiry and `run_at` are judged by the store's own clock.

pub mod sweep;

use std::time::Duration;

use async_trait::async_trait;

use crate::limit::{Limit, LimitKind, LimitScope, LimitWait, StoredLimit};
use crate::model::{
    AttemptError, Emitted, Event, EventId, EventState, LeaseToken, Millis, NewEvent, Rule,
    RuleKind, RuleMatch, Subscription,
};
use crate::schedule::{DueSchedules, Schedule, ScheduleFiring};

/// What [`LeaderElection::lead`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// Whether the caller holds the leader lease now.
    pub leading: bool,
    /// How long the lease has left: the caller's own when it leads (the
    /// whole `lease` asked for), the current holder's otherwise (zero when
    /// it lapses now).
    pub left: Duration,
}

/// Errors from a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened or reached.
    #[error("cannot open the store at {location}: {reason}")]
    Open {
        /// Path or URL.
        location: String,
        /// What went wrong.
        reason: String,
    },
    /// The database exists but is not one of herald's.
    #[error("{location} is not a herald database: {reason}")]
    NotHerald {
        /// Path or URL.
        location: String,
        /// What was found instead.
        reason: String,
    },
    /// The database's schema is newer than this build knows.
    #[error(
        "{location} has schema version {found}, newer than this herald ({known}); upgrade herald"
    )]
    TooNew {
        /// Path or URL.
        location: String,
        /// The version in the database.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
    /// A request that the store refuses as invalid.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store failed while serving a request; nothing was written.
    #[error("store failed: {context}: {source}")]
    Backend {
        /// What failed, and on what: the operation (`claim`, `sweep`, …),
        /// with the event or the step when that says more.
        context: String,
        /// The cause: the database's error, or what was wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store could not be reached (the connection was lost, the server
    /// shut down or does not answer) and did not come back within the
    /// store's retries. A write may or may not have happened: an emit may
    /// have been stored, and emitting the same events (same ids) again is
    /// safe. `herald serve` answers 503 `store_unavailable`.
    #[error("store unavailable: {op}: {source}")]
    Unavailable {
        /// The store operation (`emit`, `claim`, …).
        op: &'static str,
        /// The last connection error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store has been closed.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// A [`StoreError::Backend`]: `context` says what failed and on what,
    /// `source` why (an error, or a message).
    pub fn backend(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError::Backend {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// A lease as a worker holds it: the event and the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    /// The event.
    pub id: EventId,
    /// The token the claim wrote.
    pub token: LeaseToken,
}

/// An event that could not be claimed, as loaded to learn why.
#[derive(Clone, Debug, PartialEq)]
pub struct Inspected {
    /// The stored event.
    pub event: Event,
    /// The rules that match it now.
    pub rules: RuleMatch,
    /// The full limit that holds it (parked until a slot frees), if one does.
    pub waiting: Option<LimitWait>,
}

/// The result of [`EventStore::settle`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Per item in order, whether the fence held (the token still matched)
    /// and the write happened.
    pub held: Vec<bool>,
    /// Events that a full limit held and that a slot freed by these runs
    /// woke: un-parked in the store, for the caller to notify now.
    pub woken: Vec<Scheduled>,
}

/// The result of [`EventStore::inspect`].
#[derive(Clone, Debug, PartialEq)]
pub struct Inspection {
    /// The events that exist, in no particular order; missing ids are absent.
    pub found: Vec<Inspected>,
    /// The store's clock when they were loaded.
    pub now: Millis,
}

/// How a run ends in the store. Each is fenced by the run's lease token.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// Delete the event.
    Delete,
    /// Keep it as `done`.
    Archive,
    /// Clear the lease; run again after `wait`; `notified_at` becomes the new
    /// `run_at`, since the caller re-notifies with that delay.
    Release {
        /// Delay from the store's now.
        wait: Duration,
        /// Error to record, for a failed attempt.
        error: Option<String>,
        /// Give the attempt back (snooze, shutdown).
        give_back: bool,
    },
    /// Clear the lease and move to `dead`, recording the error.
    Bury {
        /// The error.
        error: String,
    },
}

/// One fenced write that ends a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Settle {
    /// The event.
    pub id: EventId,
    /// The lease token the write is fenced by; `None` fences on "no lease".
    pub token: Option<LeaseToken>,
    /// What to write.
    pub finish: Finish,
}

/// An event to notify, with the delay until it is due (by the store's
/// clock). Publishers group these into [`Notification`](crate::model::Notification)s
/// ([`crate::queue::Publish::group`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The event's tenant.
    pub tenant: String,
    /// The event.
    pub event_id: EventId,
    /// How long until `run_at`; zero when due.
    pub delay: Duration,
}

impl Scheduled {
    /// A notification of `tenant`'s event `id`, due now.
    pub fn due(tenant: String, id: EventId) -> Self {
        Scheduled {
            tenant,
            event_id: id,
            delay: Duration::ZERO,
        }
    }
}

/// Where a sweep pass is: its cutoff, fixed by the pass's first page by the
/// store's clock, and whether the dead workers' source is behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepPass {
    /// Events notified at or after this are not due for re-notification.
    pub cutoff: Millis,
    /// A page of this pass has read the dead workers' source to its end
    /// and notified all it found, so the pass's later pages go straight to
    /// the quiet source. Reading the dead workers' source walks every
    /// pending event notified since the cutoff to test its lease; once per
    /// pass is enough (an event whose lease lapses meanwhile is the next
    /// pass's).
    pub expired_done: bool,
}

/// One page of a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepPage {
    /// Notifications to publish (all due now).
    pub due: Vec<Scheduled>,
    /// The cursor for the next page of this pass.
    pub pass: SweepPass,
    /// True when this pass found nothing more.
    pub complete: bool,
}

/// Which events to list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this handler.
    pub handler: Option<String>,
    /// Only this state.
    pub state: Option<EventState>,
    /// Keyset cursor: only ids greater than this.
    pub after: Option<EventId>,
}

/// Which counts [`Operator::counts`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountsQuery {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this handler.
    pub handler: Option<String>,
    /// How many events of one `(tenant, handler)` and state are counted
    /// exactly (an index read of at most this many); beyond it the total is
    /// extrapolated and the row says `estimated`. The cost of a call is
    /// bounded by handlers × this, however many events are stored.
    /// Default [`CountsQuery::DEFAULT_EXACT_UP_TO`].
    pub exact_up_to: u64,
    /// How many pending events of one `(tenant, handler)` are read (table
    /// rows, not only the index) to split them into waiting, running and
    /// delayed; beyond it the split is scaled and the row says `estimated`.
    /// 0 reads none: every pending event counts as waiting, for a caller
    /// that wants totals only. Default [`CountsQuery::DEFAULT_EXACT_UP_TO`].
    pub split_up_to: u64,
}

impl CountsQuery {
    /// The default of [`CountsQuery::exact_up_to`].
    pub const DEFAULT_EXACT_UP_TO: u64 = 1_000;

    /// Every tenant and handler.
    pub fn all() -> Self {
        CountsQuery {
            tenant: None,
            handler: None,
            exact_up_to: Self::DEFAULT_EXACT_UP_TO,
            split_up_to: Self::DEFAULT_EXACT_UP_TO,
        }
    }

    /// Every tenant and handler, each state counted exactly, without the
    /// split of pending events (reads the whole index, no table rows).
    pub fn totals() -> Self {
        CountsQuery {
            exact_up_to: u64::MAX,
            split_up_to: 0,
            ..Self::all()
        }
    }

    /// Reads up to `n` pending events per handler to split them.
    pub fn split_up_to(mut self, n: u64) -> Self {
        self.split_up_to = n;
        self
    }

    /// Only `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only `handler`.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// Reads up to `n` pending events per handler to split them exactly.
    pub fn exact_up_to(mut self, n: u64) -> Self {
        self.exact_up_to = n;
        self
    }
}

impl Default for CountsQuery {
    fn default() -> Self {
        Self::all()
    }
}

/// The events of one `(tenant, handler)` by what they are doing now. The
/// six numbers add up to the events stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandlerCounts {
    /// Tenant.
    pub tenant: String,
    /// Handler.
    pub handler: String,
    /// Pending, due, not leased (or the lease expired): runnable now.
    pub waiting: u64,
    /// Pending under a live lease: a worker runs it.
    pub running: u64,
    /// Pending, not leased, due later (`run_at` in the future: a delay or a
    /// retry's backoff).
    pub delayed: u64,
    /// Pending while a pause or a block holds the handler (whatever their
    /// `run_at`).
    pub held: u64,
    /// Dead.
    pub dead: u64,
    /// Done (kept by `done_retention`).
    pub done: u64,
    /// Whether any number is extrapolated: a state held more events than
    /// [`CountsQuery::exact_up_to`] (its total is scaled by the creation
    /// times of the ids counted), or more pending events than were read to
    /// split them into waiting, running and delayed.
    pub estimated: bool,
}

/// One state's events of one `(tenant, handler)`, counted in id order up
/// to a cap (an index range read of at most the cap, never the whole
/// range): the count, and when it reached the cap, the first, the cap-th
/// and the last id, from which [`CappedCount::total`] extrapolates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CappedCount {
    /// Events counted: all of them, or the cap.
    pub counted: u64,
    /// Set when `counted` reached the cap: the first, the cap-th and the
    /// last event id of the range.
    pub span: Option<[EventId; 3]>,
}

impl CappedCount {
    /// The count, and whether it is an estimate. Ids are UUIDv7s, so the
    /// span of creation times the first `counted` events cover, against
    /// the whole range's span, scales the count: exact for a steady
    /// emission rate, and never less than what was counted.
    pub fn total(&self) -> (u64, bool) {
        let Some([first, at_cap, last]) = self.span else {
            return (self.counted, false);
        };
        if at_cap == last {
            return (self.counted, false);
        }
        let ms = |id: EventId| id.created_ms().unwrap_or(0);
        // +1 ms: a burst emitted within one millisecond still spans one.
        let counted_span = (ms(at_cap) - ms(first)).max(0) as f64 + 1.0;
        let whole_span = (ms(last) - ms(first)).max(0) as f64 + 1.0;
        let scaled = (self.counted as f64 * whole_span / counted_span).round() as u64;
        (scaled.max(self.counted + 1), true)
    }
}

/// What a store read of one `(tenant, handler)`'s pending events: up to
/// [`CountsQuery::exact_up_to`] of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSample {
    /// Events read.
    pub read: u64,
    /// Of those, under a live lease.
    pub running: u64,
    /// Of those, not leased and due later.
    pub delayed: u64,
}

impl HandlerCounts {
    /// Builds a row from the capped counts per state (pending, dead, done),
    /// whether a rule holds the handler, and the sample of its pending
    /// events (ignored when held). Beyond the cap, totals are extrapolated
    /// ([`CappedCount::total`]) and running and delayed are scaled from the
    /// sample to the pending total; the row is then `estimated`.
    pub fn from_parts(
        tenant: String,
        handler: String,
        [pending, dead, done]: [CappedCount; 3],
        held: bool,
        sample: PendingSample,
    ) -> Self {
        let ((pending, p_est), (dead, d_est), (done, o_est)) =
            (pending.total(), dead.total(), done.total());
        let mut row = HandlerCounts {
            tenant,
            handler,
            dead,
            done,
            estimated: p_est || d_est || o_est,
            ..HandlerCounts::default()
        };
        if held {
            row.held = pending;
            return row;
        }
        let (running, delayed) = if sample.read >= pending {
            (sample.running, sample.delayed)
        } else if sample.read == 0 {
            // Not split (`split_up_to` 0): all counted as waiting.
            row.estimated = true;
            (0, 0)
        } else {
            row.estimated = true;
            let scale = |n: u64| (n as f64 * pending as f64 / sample.read.max(1) as f64).round();
            (scale(sample.running) as u64, scale(sample.delayed) as u64)
        };
        row.running = running.min(pending);
        row.delayed = delayed.min(pending - row.running);
        row.waiting = pending - row.running - row.delayed;
        row
    }

    /// Events stored: the six numbers.
    pub fn total(&self) -> u64 {
        self.waiting + self.running + self.delayed + self.held + self.dead + self.done
    }

    /// Pending events: waiting, running, delayed and held.
    pub fn pending(&self) -> u64 {
        self.waiting + self.running + self.delayed + self.held
    }
}

/// What [`Topics::sync_subscriptions`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriptionSync {
    /// Subscriptions added (or taken over from the API).
    pub added: u64,
    /// Config subscriptions removed, no longer declared.
    pub removed: u64,
}

/// How long an idempotency key keeps naming its event by default, at least:
/// a day from the emit and from the event's end, as the event platforms
/// keep theirs (Stripe, Inngest). See
/// [`Reconciliation::purge_keys`] and ADR 0013.
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// How many idempotency keys one [`Reconciliation::purge_keys`] call of a store's
/// [`Reconciliation::upkeep`] handles at most, and how many calls one upkeep makes
/// at most: a pass purges up to 10,000 keys, in statements that each touch
/// at most 1,000 rows.
pub const KEY_PURGE_PAGE: usize = 1000;
/// See [`KEY_PURGE_PAGE`].
pub const KEY_PURGE_PAGES: usize = 10;

/// The hot path: what a worker's claim, settle and heartbeat and a
/// client's emit call, per batch.
///
/// Implementations must make every write that ends a run
/// ([`EventStore::settle`]) and every renewal conditional on the lease
/// token, and judge expiry by their own clock.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Stores new events. With an idempotency key, the event the key names
    /// is returned instead of a new one ([`Emitted::Existing`]): the key's
    /// stored row, written with the event that created it and kept after
    /// that event finished until [`Reconciliation::purge_keys`] removes it, or else a
    /// live event of the same `(tenant, handler, key)`.
    /// Each event's [`RunAt`](crate::model::RunAt) is resolved by the
    /// store's clock, in the write that stores it: `After(d)` is the
    /// store's now plus `d`. `notified_at` is set to each event's `run_at`:
    /// the caller publishes next.
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>>;

    /// The happy path in one statement: for each of `leases`, take the
    /// lease of its event with its token for `lease` if the event is
    /// pending, due, unleased or expired, has attempts left, has a handler
    /// in `handlers`, and no rule matches. Increments `attempt`. Returns the
    /// events claimed (as updated, each with its own token). A worker gives
    /// every event a token of its own, so a token names one run.
    ///
    /// Where limits count an event ([`Limits`]), the claim takes a slot in
    /// each, atomically with the lease, if every one has room (fewer live
    /// slots than the limit); an event of a full one is not claimed but
    /// parked, waiting in the store for a slot ([`EventStore::settle`] and
    /// [`Reconciliation::lapse_slots`] wake it).
    ///
    /// `tenants` is a hint: the tenants the notifications named (a worker
    /// passes them, each once). A store may use it to check the rules once
    /// per claim for those tenants rather than once per event; an event of
    /// a tenant not in it is still checked on its own, so a wrong or empty
    /// hint costs time, never a rule.
    async fn claim(
        &self,
        leases: &[LeaseRef],
        handlers: &[String],
        tenants: &[String],
        lease: Duration,
    ) -> StoreResult<Vec<Event>>;

    /// Loads events and their matching rules, to learn why a claim failed.
    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection>;

    /// Ends runs: whether each write's fence held, and the events a full
    /// limit held that the runs' freed slots woke. Every run whose write
    /// held gives back the slots of the limits that counted it.
    async fn settle(&self, batch: &[Settle]) -> StoreResult<Settled>;

    /// Extends leases to `now + lease`, and the limit slots of their runs
    /// with them. Returns, per item in order, whether the lease was still
    /// held by that token.
    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>>;
}

/// Pause and block rules, and the re-notification that lifting one
/// pages through.
#[async_trait]
pub trait Rules: Send + Sync + 'static {
    /// Adds a rule; false if it already existed.
    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool>;

    /// Removes a rule; false if there was none.
    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool>;

    /// The rules that match `(tenant, handler)`.
    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch>;

    /// Every rule.
    async fn rules(&self) -> StoreResult<Vec<Rule>>;

    /// One page of `(tenant, handler)`'s pending events with ids after
    /// `after`, in id order, stamping them as notified. Used by unpause and
    /// unblock, which page through all of them.
    async fn renotify_page(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<Scheduled>>;
}

/// Topic subscriptions: which handlers an emit to a topic stores events for.
#[async_trait]
pub trait Topics: Send + Sync + 'static {
    /// Adds a subscription (declared through the API: it stays until
    /// [`Topics::unsubscribe`]); false if it already existed.
    async fn subscribe(&self, subscription: &Subscription) -> StoreResult<bool>;

    /// Removes a subscription, whoever declared it; false if there was none.
    async fn unsubscribe(&self, subscription: &Subscription) -> StoreResult<bool>;

    /// The handlers an emit to `topic` for `tenant` stores an event for:
    /// those subscribed for this tenant or for every tenant, each once, in
    /// name order.
    async fn subscribers(&self, tenant: &str, topic: &str) -> StoreResult<Vec<String>>;

    /// The subscriptions, of one topic or of all, in topic, tenant (every
    /// tenant first) and handler order.
    async fn subscriptions(&self, topic: Option<&str>) -> StoreResult<Vec<Subscription>>;

    /// Makes the config file's subscriptions exactly `declared`, in one
    /// transaction: those declared and missing are added, the config's that
    /// are no longer declared are removed; the API's are left alone (one
    /// declared in the file that the API added becomes the file's).
    async fn sync_subscriptions(&self, declared: &[Subscription]) -> StoreResult<SubscriptionSync>;
}

/// The elected reconciler's passes: re-notify what the queue lost, purge
/// what outlived its retention, and the store's own upkeep.
#[async_trait]
pub trait Reconciliation: Send + Sync + 'static {
    /// Handles up to `limit` idempotency keys stored more than `window`
    /// ago, by the store's clock (the cut-off is the store's now minus
    /// `window`, so no caller's clock moves it), oldest first. A key whose event is still live is
    /// kept, its time reset to now, so that it names its event while it is
    /// live and is looked at again only after another window. A key whose
    /// event is no longer live (finished, dead or deleted) is marked gone,
    /// its time reset, the first time; the next time (a window later) it is
    /// deleted, so that the next emit with it creates a new event. So a key
    /// names its event for at least the window after the emit and after the
    /// event finished. Returns how many keys were deleted. A store's [`Reconciliation::upkeep`] calls it with its
    /// configured window ([`DEFAULT_IDEMPOTENCY_WINDOW`] by default).
    async fn purge_keys(&self, window: Duration, limit: usize) -> StoreResult<u64>;

    /// One page of the reconciler's sweep: up to `limit` pending events
    /// that are due, not held by a rule, unleased or expired, and either not
    /// notified since the pass's cutoff (`now - quiet` at its first page) or
    /// not notified since their lease expired. Stamps them as notified now.
    /// Events held by a rule may be parked (stamped so that the sweep skips
    /// them until unpause or unblock re-notifies them).
    ///
    /// Start a pass with `pass: None`, then pass each page's
    /// [`SweepPage::pass`] to the next call until a page says it is
    /// complete. The fixed cutoff is what ends a pass whose quiet period is
    /// shorter than the pass itself takes.
    ///
    /// [`crate::backend::sweep::Sweep`] decides the call; a store carries out its
    /// steps in one short transaction.
    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage>;

    /// Deletes up to `limit` dead events that died more than
    /// `dead_retention` ago and done events finished more than
    /// `done_retention` ago, both by the store's clock (the cut-offs are the
    /// store's now minus each, so no caller's clock moves them). Returns
    /// how many went.
    async fn purge(
        &self,
        dead_retention: Duration,
        done_retention: Duration,
        limit: usize,
    ) -> StoreResult<u64>;

    /// Deletes up to `limit` limit slots whose run's lease lapsed (its
    /// worker died or lost the store) and wakes, in their scopes, as many
    /// waiters as each has room for now. Returns the events woken, for the
    /// caller to notify. On every pass of the elected reconciler, so a dead
    /// worker's slots serve waiters within a pass of their lease's expiry.
    async fn lapse_slots(&self, limit: usize) -> StoreResult<Vec<Scheduled>>;

    /// The store's own upkeep, on every pass of the elected reconciler
    /// (after its sweep and purge): the PostgreSQL store turns its ring of
    /// leaves here, so that finished events' rows go with a TRUNCATE rather
    /// than wait for vacuum. A store that needs none keeps the default,
    /// which does nothing.
    async fn upkeep(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// Named leader leases: one reconciler and one scheduler among the
/// workers sharing a store.
#[async_trait]
pub trait LeaderElection: Send + Sync + 'static {
    /// Takes or keeps the named leader lease for `holder` for `lease`: it
    /// is taken when the row is free, expired, or already `holder`'s (so a
    /// restarted process under the same stable name leads again at once).
    /// Says whether `holder` leads now and, if not, how long the current
    /// holder's lease has left, so a follower asks again just as it lapses.
    async fn lead(&self, role: &str, holder: &str, lease: Duration) -> StoreResult<Leadership>;

    /// Gives the leader lease up, if `holder` has it.
    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()>;
}

/// The operator's reads and writes of single events: look up, list,
/// count, revive, delete.
#[async_trait]
pub trait Operator: Send + Sync + 'static {
    /// One event.
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>>;

    /// The event's error history, oldest first: one entry per failed
    /// attempt (retries and the final failure), written by the same
    /// statement that settles the attempt. Empty for an unknown id. It grows
    /// by at most `max_attempts` per life of the event (plus the operator's
    /// revivals), so it is not capped.
    async fn history(&self, id: EventId) -> StoreResult<Vec<AttemptError>>;

    /// Events in id order, matching `filter`, at most `limit`.
    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>>;

    /// Counts per `(tenant, handler)` with stored events, in tenant and
    /// handler order, without reading the whole table: the pairs by a
    /// skip scan of the `(tenant, handler, state, id)` index, the totals per
    /// state from that index, and at most `exact_up_to` pending events per
    /// pair to split them (see [`HandlerCounts::estimated`]).
    async fn counts(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>>;

    /// Moves a dead event back to pending with its attempts reset, due now.
    /// Returns the notification to publish, or `None` if it was not dead.
    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>>;

    /// Deletes an event that is not running (dead, done, or pending without a
    /// live lease). Returns whether it was deleted.
    async fn delete(&self, id: EventId) -> StoreResult<bool>;
}

/// Schedules: the operator's definitions and the elected scheduler's
/// firing of due occurrences.
#[async_trait]
pub trait Schedules: Send + Sync + 'static {
    /// The store's clock: what a caller computes a time from when the store
    /// compares that time with its own clock (a new schedule's first
    /// occurrence), so that the caller's wall clock plays no part. A store
    /// may read it with an [`EventStore::inspect`] of no events.
    async fn clock(&self) -> StoreResult<Millis>;

    /// Creates the schedule `(tenant, name)` or replaces its definition.
    /// A replacement with the same occurrences
    /// ([`Schedule::same_occurrences`]: cadence and zone) keeps the stored
    /// cursor; one with other occurrences takes `schedule.next_at`. Either
    /// keeps the stored `paused` and `last` (pause and resume are their own
    /// verbs). Returns whether it was created.
    async fn put_schedule(&self, schedule: &Schedule) -> StoreResult<bool>;

    /// One schedule.
    async fn schedule(&self, tenant: &str, name: &str) -> StoreResult<Option<Schedule>>;

    /// The schedules of `tenant` (every tenant's with `None`), in tenant
    /// and name order.
    async fn schedules(&self, tenant: Option<&str>) -> StoreResult<Vec<Schedule>>;

    /// Pauses (`true`) or resumes a schedule; false if there is none. The
    /// cursor stays: on resume, the occurrences that passed meanwhile are
    /// missed ones.
    async fn pause_schedule(&self, tenant: &str, name: &str, paused: bool) -> StoreResult<bool>;

    /// Deletes a schedule (not the events it emitted); false if there was none.
    async fn delete_schedule(&self, tenant: &str, name: &str) -> StoreResult<bool>;

    /// Up to `limit` unpaused schedules whose cursor is at or before the
    /// store's clock, earliest cursor first (an index range on the cursor),
    /// and that clock.
    async fn due_schedules(&self, limit: usize) -> StoreResult<DueSchedules>;

    /// In one transaction: moves the schedule's cursor from
    /// `expected_next_at` to `next_at` (compare-and-set), inserts the
    /// events as [`EventStore::emit`] does, and records the last of them as the
    /// schedule's last occurrence. `None`, with nothing written, when the
    /// schedule is gone or its cursor is not `expected_next_at` (another
    /// leader moved it): that is what makes each occurrence emitted once.
    async fn fire_schedule(&self, firing: &ScheduleFiring) -> StoreResult<Option<Vec<Emitted>>>;
}

/// Everything a backend implements: every role trait. A backend (the
/// SQLite and PostgreSQL stores, a test double) implements the eight role
/// traits and gets `Store` from the blanket implementation; an embedder
/// that wants one handle for all of them takes `Arc<dyn Store>`. Each part
/// of the runtime takes only the roles it uses.
pub trait Store:
    EventStore + Rules + Topics + Reconciliation + LeaderElection + Operator + Schedules + Limits
{
}

impl<T> Store for T where
    T: EventStore
        + Rules
        + Topics
        + Reconciliation
        + LeaderElection
        + Operator
        + Schedules
        + Limits
{
}

/// One page of [`Limits::wake_limit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WakePage {
    /// Events woken, un-parked in the store, for the caller to notify now.
    pub woken: Vec<Scheduled>,
    /// Where the next page starts (the last scope looked at: its tenant
    /// and key); `None` when every scope with waiters was looked at.
    pub next: Option<(String, String)>,
}

/// Concurrency limits ([`crate::limit`]): what the API, the CLI and the
/// config file set, and the wake of the events a limit held when it is
/// raised or removed.
#[async_trait]
pub trait Limits: Send + Sync + 'static {
    /// Sets a limit declared through the API (kept until removed),
    /// replacing the same scope's. False if it was already so.
    async fn set_limit(&self, limit: &Limit) -> StoreResult<bool>;

    /// Removes the limit of `handler` and `scope`, whoever declared it;
    /// false if there was none.
    async fn remove_limit(&self, handler: &str, scope: &LimitScope) -> StoreResult<bool>;

    /// The limits, of one handler or of all, in handler, kind, tenant and
    /// key order.
    async fn limits(&self, handler: Option<&str>) -> StoreResult<Vec<StoredLimit>>;

    /// Makes the config file's limits exactly `declared`, in one
    /// transaction (the API's are left alone; one declared in the file that
    /// the API set becomes the file's). Returns the `(handler, kind)` pairs
    /// whose limits were raised or removed: their waiters may have room.
    async fn sync_limits(&self, declared: &[Limit]) -> StoreResult<Vec<(String, LimitKind)>>;

    /// Wakes, in up to `scopes` of `handler`'s scopes of `kind` that hold
    /// waiters, after `after` (a [`WakePage::next`]), as many waiters as
    /// each has room for now (a scope whose limit is gone: up to 1,000 a
    /// call). Called after a limit is raised or removed, page by page.
    async fn wake_limit(
        &self,
        handler: &str,
        kind: LimitKind,
        after: Option<(String, String)>,
        scopes: usize,
    ) -> StoreResult<WakePage>;
}

impl RuleKind {
    /// Both kinds, strongest first.
    pub const ALL: [RuleKind; 2] = [RuleKind::Block, RuleKind::Pause];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id made at `ms` (Unix milliseconds).
    fn id_at(ms: u64) -> EventId {
        let ts =
            uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, (ms % 1000) as u32 * 1_000_000);
        EventId(uuid::Uuid::new_v7(ts))
    }

    #[test]
    fn a_backend_error_says_what_failed_and_keeps_its_cause() {
        let e = StoreError::backend("claim", std::io::Error::other("disk on fire"));
        assert_eq!(e.to_string(), "store failed: claim: disk on fire");
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        // A cause that is only a message is a source too.
        let e = StoreError::backend("rules", "unknown rule kind x");
        assert_eq!(e.to_string(), "store failed: rules: unknown rule kind x");
    }

    #[test]
    fn a_capped_count_is_exact_under_the_cap_and_scaled_by_id_time_beyond() {
        let under = CappedCount {
            counted: 7,
            span: None,
        };
        assert_eq!(under.total(), (7, false));
        // Exactly the cap: the cap-th id is the last one.
        let last = id_at(1_009);
        let at = CappedCount {
            counted: 10,
            span: Some([id_at(1_000), last, last]),
        };
        assert_eq!(at.total(), (10, false));
        // A steady rate of one event per ms: 10 counted over 10 ms of 100.
        let steady = CappedCount {
            counted: 10,
            span: Some([id_at(1_000), id_at(1_009), id_at(1_099)]),
        };
        assert_eq!(steady.total(), (100, true));
        // A burst within one millisecond still says "more than counted".
        let burst = CappedCount {
            counted: 10,
            span: Some([id_at(5_000), id_at(5_000), id_at(5_000)]),
        };
        assert_eq!(burst.total(), (11, true));
        let burst = CappedCount {
            counted: 10,
            span: Some([id_at(5_000), id_at(5_000), id_at(5_001)]),
        };
        assert_eq!(burst.total(), (20, true));
    }

    #[test]
    fn a_row_adds_up_and_says_when_it_is_estimated() {
        let exact = |n| CappedCount {
            counted: n,
            span: None,
        };
        let row = HandlerCounts::from_parts(
            "t".into(),
            "h".into(),
            [exact(10), exact(2), exact(0)],
            false,
            PendingSample {
                read: 10,
                running: 3,
                delayed: 4,
            },
        );
        assert_eq!(
            (
                row.waiting,
                row.running,
                row.delayed,
                row.dead,
                row.estimated
            ),
            (3, 3, 4, 2, false)
        );
        let held = HandlerCounts::from_parts(
            "t".into(),
            "h".into(),
            [exact(10), exact(0), exact(0)],
            true,
            PendingSample::default(),
        );
        assert_eq!((held.held, held.waiting, held.estimated), (10, 0, false));
        let scaled = HandlerCounts::from_parts(
            "t".into(),
            "h".into(),
            [exact(100), exact(0), exact(0)],
            false,
            PendingSample {
                read: 10,
                running: 1,
                delayed: 5,
            },
        );
        assert_eq!(
            (
                scaled.waiting,
                scaled.running,
                scaled.delayed,
                scaled.estimated
            ),
            (40, 10, 50, true)
        );
    }
}
