//! A store that fails or slows down on purpose, around a real one: for
//! scenarios of what the engine and the client do when a store call fails
//! or takes long.

use crate::schedule::{DueSchedules, Schedule, ScheduleFiring};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    EventFilter, EventStore, Inspection, LeaderElection, LeaseRef, Limits, Operator,
    Reconciliation, Rules, Scheduled, Schedules, Settle, Settled, Store, StoreError, StoreResult,
    SubscriptionSync, SweepPage, SweepPass, Topics, WakePage,
};
use crate::limit::{Limit, LimitKind, LimitScope, StoredLimit};
use crate::model::{Emitted, Event, EventId, NewEvent, Rule, RuleMatch, Subscription};

/// A store around a real one that fails or slows down on purpose, and
/// passes everything else to the store inside: it refuses (with
/// [`StoreError::Backend`], nothing written) every emit that holds an
/// event of one tenant, makes every emit or settle call wait before the
/// store's, counting the settle calls in flight, can make settle calls
/// panic, and renew calls hang.
pub struct Faulty {
    /// The real store.
    pub inner: Arc<dyn Store>,
    /// The tenant whose events are refused, if any.
    pub refused_tenant: Option<String>,
    /// How long each emit call waits before the store's.
    pub emit_delay: Duration,
    /// How long each settle call waits before the store's.
    pub settle_delay: Duration,
    /// The settle calls seen.
    pub settles: Arc<SettleCalls>,
    /// How many of the next settle calls panic (before the store's).
    pub settle_panics: AtomicUsize,
    /// Whether renew calls never answer (a database that holds the
    /// connection open and says nothing).
    pub renewals_hang: bool,
}

/// What a [`Faulty`] store saw of the settle calls.
#[derive(Debug, Default)]
pub struct SettleCalls {
    in_flight: AtomicUsize,
    /// The most calls in flight at once.
    pub most_in_flight: AtomicUsize,
    /// The most runs in one call.
    pub largest: AtomicUsize,
}

impl SettleCalls {
    /// The calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

impl Faulty {
    /// `inner`, with no fault yet.
    pub fn around(inner: Arc<dyn Store>) -> Self {
        Faulty {
            inner,
            refused_tenant: None,
            emit_delay: Duration::ZERO,
            settle_delay: Duration::ZERO,
            settles: Arc::default(),
            settle_panics: AtomicUsize::new(0),
            renewals_hang: false,
        }
    }

    /// Makes every renew call wait forever.
    pub fn hanging_renewals(mut self) -> Self {
        self.renewals_hang = true;
        self
    }

    /// Refuses every emit that holds an event of `tenant`.
    pub fn refusing_emits_of(mut self, tenant: &str) -> Self {
        self.refused_tenant = Some(tenant.to_string());
        self
    }

    /// Makes every emit call wait `delay` first (a write that takes long).
    pub fn slow_emits(mut self, delay: Duration) -> Self {
        self.emit_delay = delay;
        self
    }

    /// Makes the next `n` settle calls panic, writing nothing (a bug in
    /// the call, as the worker sees it).
    pub fn panicking_settles(self, n: usize) -> Self {
        self.settle_panics.store(n, Ordering::SeqCst);
        self
    }

    /// Makes every settle call wait `delay` first.
    pub fn slow_settles(mut self, delay: Duration) -> Self {
        self.settle_delay = delay;
        self
    }
}

#[async_trait::async_trait]
impl EventStore for Faulty {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        if let Some(tenant) = &self.refused_tenant {
            if events.iter().any(|e| &e.tenant == tenant) {
                return Err(StoreError::backend(
                    "emit",
                    format!("the test store refuses events of tenant {tenant:?}"),
                ));
            }
        }
        tokio::time::sleep(self.emit_delay).await;
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

    async fn settle(&self, batch: &[Settle]) -> StoreResult<Settled> {
        let panics = &self.settle_panics;
        if panics
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("the test store panics in this settle call");
        }
        let c = &self.settles;
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        c.most_in_flight.fetch_max(now, Ordering::SeqCst);
        c.largest.fetch_max(batch.len(), Ordering::SeqCst);
        tokio::time::sleep(self.settle_delay).await;
        let held = self.inner.settle(batch).await;
        c.in_flight.fetch_sub(1, Ordering::SeqCst);
        held
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        if self.renewals_hang {
            std::future::pending::<()>().await;
        }
        self.inner.renew(leases, lease).await
    }
}

#[async_trait::async_trait]
impl Rules for Faulty {
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

#[async_trait::async_trait]
impl Limits for Faulty {
    async fn set_limit(&self, limit: &Limit) -> StoreResult<bool> {
        self.inner.set_limit(limit).await
    }

    async fn remove_limit(&self, handler: &str, scope: &LimitScope) -> StoreResult<bool> {
        self.inner.remove_limit(handler, scope).await
    }

    async fn limits(&self, handler: Option<&str>) -> StoreResult<Vec<StoredLimit>> {
        self.inner.limits(handler).await
    }

    async fn sync_limits(&self, declared: &[Limit]) -> StoreResult<Vec<(String, LimitKind)>> {
        self.inner.sync_limits(declared).await
    }

    async fn wake_limit(
        &self,
        handler: &str,
        kind: LimitKind,
        after: Option<(String, String)>,
        scopes: usize,
    ) -> StoreResult<WakePage> {
        self.inner.wake_limit(handler, kind, after, scopes).await
    }
}

#[async_trait::async_trait]
impl Topics for Faulty {
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

#[async_trait::async_trait]
impl Reconciliation for Faulty {
    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
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

    async fn lapse_slots(&self, limit: usize) -> StoreResult<Vec<Scheduled>> {
        self.inner.lapse_slots(limit).await
    }

    async fn upkeep(&self) -> StoreResult<()> {
        self.inner.upkeep().await
    }
}

#[async_trait::async_trait]
impl LeaderElection for Faulty {
    async fn lead(
        &self,
        role: &str,
        holder: &str,
        lease: Duration,
    ) -> StoreResult<crate::Leadership> {
        self.inner.lead(role, holder, lease).await
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        self.inner.resign(role, holder).await
    }
}

#[async_trait::async_trait]
impl Operator for Faulty {
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.inner.get(id).await
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<crate::AttemptError>> {
        self.inner.history(id).await
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        self.inner.list(filter, limit).await
    }

    async fn counts(&self, query: &crate::CountsQuery) -> StoreResult<Vec<crate::HandlerCounts>> {
        self.inner.counts(query).await
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        self.inner.revive(id).await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        self.inner.delete(id).await
    }
}

#[async_trait::async_trait]
impl Schedules for Faulty {
    async fn clock(&self) -> StoreResult<crate::Millis> {
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
