//! The backend role traits ([`herald::backend`]) for [`PgStore`]: each method's guards and retries around one
//! try, done by the module of its role.

use std::time::Duration;

use async_trait::async_trait;
use herald::backend::{
    CountsQuery, EventFilter, EventStore, HandlerCounts, Inspection, LeaderElection, LeaseRef,
    Limits, Operator, Reconciliation, Rules, Scheduled, Schedules, Settle, Settled, StoreResult,
    SubscriptionSync, SweepPage, SweepPass, Topics, WakePage, KEY_PURGE_PAGE, KEY_PURGE_PAGES,
};
use herald::{
    AttemptError, Emitted, Event, EventId, Leadership, Limit, LimitKind, LimitScope, NewEvent,
    Rule, RuleMatch, StoreError, StoredLimit, Subscription,
};

use herald::schedule::{DueSchedules, Schedule, ScheduleFiring};

use crate::retry::retry;
use crate::rows::uuids;
use crate::sql::SettleKind;
use crate::PgStore;

/// The most tenants a claim's hint may name (its rule check,
/// `sql/claim.sql`): the claim tests each row's tenant against the hint by
/// a linear scan, about 13 ns a tenant on the benchmarks' machine (`bench/claim-sql.sh` with a
/// 16-tenant hint), so past about 64 the scan costs what the per-row probe
/// of `rules` it saves does. A longer hint is dropped: the rows are checked
/// as if no hint was given.
const TENANT_HINT_LIMIT: usize = 32;

#[async_trait]
impl EventStore for PgStore {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.emit_retrying(events).await
    }

    async fn claim(
        &self,
        leases: &[LeaseRef],
        handlers: &[String],
        tenants: &[String],
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        if leases.is_empty() || handlers.is_empty() {
            return Ok(Vec::new());
        }
        let mut pairs: Vec<(uuid::Uuid, uuid::Uuid)> =
            leases.iter().map(|l| (l.id.0, l.token.0)).collect();
        pairs.sort_unstable_by_key(|&(id, _)| id);
        pairs.dedup_by_key(|&mut (id, _)| id);
        let (ids, tokens): (Vec<uuid::Uuid>, Vec<uuid::Uuid>) = pairs.into_iter().unzip();
        let tenants = if tenants.len() > TENANT_HINT_LIMIT {
            &[][..]
        } else {
            tenants
        };
        retry("claim", || {
            self.claim_once(&ids, &tokens, handlers, tenants, lease)
        })
        .await
    }

    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection> {
        let ids = uuids(ids);
        retry("inspect", || self.inspect_once(&ids)).await
    }

    async fn settle(&self, batch: &[Settle]) -> StoreResult<Settled> {
        let mut held = vec![false; batch.len()];
        // One statement per kind, each item at its batch position; rows are
        // taken in id order, as claims take them.
        for kind in SettleKind::ALL {
            let mut items: Vec<usize> = (0..batch.len())
                .filter(|&i| SettleKind::of(&batch[i].finish) == kind)
                .collect();
            if items.is_empty() {
                continue;
            }
            items.sort_by_key(|&i| batch[i].id);
            let items = &*items;
            for i in retry("settle", || self.settle_kind(kind, batch, items)).await? {
                held[i] = true;
            }
        }
        // The slots of the runs that ended: a separate statement, so a
        // crash in between leaves them to lapse with the lease (the
        // reconciler frees them then), never to count a run twice.
        let mut ended: Vec<uuid::Uuid> = batch
            .iter()
            .zip(&held)
            .filter_map(|(s, &h)| if h { s.token.map(|t| t.0) } else { None })
            .collect();
        ended.sort_unstable();
        let woken = if ended.is_empty() {
            Vec::new()
        } else {
            retry("settle", || self.free_slots_once(&ended)).await?
        };
        Ok(Settled { held, woken })
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        let mut held = vec![false; leases.len()];
        if leases.is_empty() {
            return Ok(held);
        }
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by_key(|&i| leases[i].id);
        for i in retry("renew", || self.renew_once(leases, &order, lease)).await? {
            held[i] = true;
        }
        Ok(held)
    }
}

#[async_trait]
impl Limits for PgStore {
    async fn set_limit(&self, limit: &Limit) -> StoreResult<bool> {
        limit.check().map_err(StoreError::Invalid)?;
        retry("set_limit", || self.set_limit_once(limit)).await
    }

    async fn remove_limit(&self, handler: &str, scope: &LimitScope) -> StoreResult<bool> {
        retry("remove_limit", || self.remove_limit_once(handler, scope)).await
    }

    async fn limits(&self, handler: Option<&str>) -> StoreResult<Vec<StoredLimit>> {
        retry("limits", || self.limits_once(handler)).await
    }

    async fn sync_limits(&self, declared: &[Limit]) -> StoreResult<Vec<(String, LimitKind)>> {
        for l in declared {
            l.check().map_err(StoreError::Invalid)?;
        }
        retry("sync_limits", || self.sync_limits_once(declared)).await
    }

    async fn wake_limit(
        &self,
        handler: &str,
        kind: LimitKind,
        after: Option<(String, String)>,
        scopes: usize,
    ) -> StoreResult<WakePage> {
        retry("wake_limit", || {
            self.wake_limit_once(handler, kind, after.as_ref(), scopes)
        })
        .await
    }
}

#[async_trait]
impl Rules for PgStore {
    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool> {
        retry("add_rule", || self.add_rule_once(rule)).await
    }

    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool> {
        retry("remove_rule", || self.remove_rule_once(rule)).await
    }

    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
        self.rules_for_once(tenant, handler).await
    }

    async fn rules(&self) -> StoreResult<Vec<Rule>> {
        self.rules_once().await
    }

    async fn renotify_page(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<Scheduled>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        retry("renotify_page", || {
            self.renotify_once(tenant, handler, after, limit)
        })
        .await
    }
}

#[async_trait]
impl Topics for PgStore {
    async fn subscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        retry("subscribe", || self.subscribe_once(subscription)).await
    }

    async fn unsubscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        retry("unsubscribe", || self.unsubscribe_once(subscription)).await
    }

    async fn subscribers(&self, tenant: &str, topic: &str) -> StoreResult<Vec<String>> {
        retry("subscribers", || self.subscribers_once(tenant, topic)).await
    }

    async fn subscriptions(&self, topic: Option<&str>) -> StoreResult<Vec<Subscription>> {
        retry("subscriptions", || self.subscriptions_once(topic)).await
    }

    async fn sync_subscriptions(&self, declared: &[Subscription]) -> StoreResult<SubscriptionSync> {
        retry("sync_subscriptions", || {
            self.sync_subscriptions_once(declared)
        })
        .await
    }
}

#[async_trait]
impl Reconciliation for PgStore {
    async fn lapse_slots(&self, limit: usize) -> StoreResult<Vec<Scheduled>> {
        retry("lapse_slots", || self.lapse_slots_once(limit)).await
    }

    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
        retry("sweep", || self.sweep_once(quiet, pass, limit)).await
    }

    /// Turns the ring, then purges the idempotency keys older than the
    /// window, a page at a time, at most [`KEY_PURGE_PAGES`] pages a pass.
    async fn upkeep(&self) -> StoreResult<()> {
        retry("upkeep", || self.turn_ring()).await?;
        let window = self.idempotency_window();
        for _ in 0..KEY_PURGE_PAGES {
            if (self.purge_keys(window, KEY_PURGE_PAGE).await? as usize) < KEY_PURGE_PAGE {
                break;
            }
        }
        Ok(())
    }

    async fn purge_keys(&self, window: Duration, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        retry("purge_keys", || self.purge_keys_once(window, limit)).await
    }

    async fn purge(
        &self,
        dead_retention: Duration,
        done_retention: Duration,
        limit: usize,
    ) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        retry("purge", || {
            self.purge_once(dead_retention, done_retention, limit)
        })
        .await
    }
}

#[async_trait]
impl LeaderElection for PgStore {
    async fn lead(&self, role: &str, holder: &str, lease: Duration) -> StoreResult<Leadership> {
        retry("lead", || self.lead_once(role, holder, lease)).await
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        retry("resign", || self.resign_once(role, holder))
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Operator for PgStore {
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.get_once(id).await
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<AttemptError>> {
        self.history_once(id).await
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self.list_once(filter, limit).await?)
    }

    async fn counts(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>> {
        self.counts_once(query).await
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        retry("revive", || self.revive_once(id)).await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        retry("delete", || self.delete_once(id)).await
    }
}

#[async_trait]
impl Schedules for PgStore {
    async fn clock(&self) -> StoreResult<herald::Millis> {
        Ok(EventStore::inspect(self, &[]).await?.now)
    }

    async fn put_schedule(&self, schedule: &Schedule) -> StoreResult<bool> {
        retry("put_schedule", || self.put_schedule_once(schedule)).await
    }

    async fn schedule(&self, tenant: &str, name: &str) -> StoreResult<Option<Schedule>> {
        retry("schedule", || self.schedule_once(tenant, name)).await
    }

    async fn schedules(&self, tenant: Option<&str>) -> StoreResult<Vec<Schedule>> {
        retry("schedules", || self.schedules_once(tenant)).await
    }

    async fn pause_schedule(&self, tenant: &str, name: &str, paused: bool) -> StoreResult<bool> {
        retry("pause_schedule", || {
            self.pause_schedule_once(tenant, name, paused)
        })
        .await
    }

    async fn delete_schedule(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        retry("delete_schedule", || {
            self.delete_schedule_once(tenant, name)
        })
        .await
    }

    async fn due_schedules(&self, limit: usize) -> StoreResult<DueSchedules> {
        retry("due_schedules", || self.due_schedules_once(limit)).await
    }

    async fn fire_schedule(&self, firing: &ScheduleFiring) -> StoreResult<Option<Vec<Emitted>>> {
        retry("fire_schedule", || self.fire_schedule_once(firing)).await
    }
}
