//! The backend role traits ([`herald::backend`]) for [`SqliteStore`]: each method's guards, and its work sent
//! to the writer thread, done by the module of its role.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use herald::backend::{
    CountsQuery, EventFilter, EventStore, HandlerCounts, Inspection, LeaderElection, LeaseRef,
    Limits, Operator, Reconciliation, Rules, Scheduled, Schedules, Settle, Settled, StoreResult,
    SubscriptionSync, SweepPage, SweepPass, Topics, WakePage, KEY_PURGE_PAGE, KEY_PURGE_PAGES,
};
use herald::schedule::{DueSchedules, Schedule, ScheduleFiring};
use herald::{
    AttemptError, Emitted, Event, EventId, Leadership, Limit, LimitKind, LimitScope, LimitSource,
    NewEvent, Rule, RuleMatch, StoredLimit, Subscription,
};
use rusqlite::types::Value;

use crate::{
    admin, claim, emit, leaders, limits, reads, rules, schedules, settle, sweep, topics,
    SqliteStore,
};

#[async_trait]
impl EventStore for SqliteStore {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        let events = events.to_vec();
        self.call("emit", move |conn, now| emit::emit(conn, now, &events))
            .await
    }

    /// Ignores the tenants hint: SQLite's rule check is an in-process
    /// probe per row, cheaper than anything the hint could save.
    async fn claim(
        &self,
        leases: &[LeaseRef],
        handlers: &[String],
        _tenants: &[String],
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        if leases.is_empty() || handlers.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > claim::CLAIM_ONE_BY_ONE {
            let leases = claim::lease_values(leases);
            let handlers: Vec<Value> = handlers.iter().cloned().map(Value::Text).collect();
            return self
                .call("claim", move |conn, now| {
                    let claimed = claim::batch(conn, now, &leases, &handlers, lease)?;
                    limits::admit(conn, now, claimed)
                })
                .await;
        }
        let leases = leases.to_vec();
        let handlers: HashSet<String> = handlers.iter().cloned().collect();
        self.call("claim", move |conn, now| {
            let claimed = claim::one_by_one(conn, now, &leases, &handlers, lease)?;
            limits::admit(conn, now, claimed)
        })
        .await
    }

    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection> {
        let ids = ids.to_vec();
        self.call("inspect", move |conn, now| claim::inspect(conn, now, &ids))
            .await
    }

    async fn settle(&self, batch: &[Settle]) -> StoreResult<Settled> {
        let batch = batch.to_vec();
        self.call("settle", move |conn, now| {
            let held = settle::settle(conn, now, &batch)?;
            let ended: Vec<LeaseRef> = batch
                .iter()
                .zip(&held)
                .filter_map(|(s, &h)| {
                    h.then_some(s)
                        .and_then(|s| s.token.map(|token| LeaseRef { id: s.id, token }))
                })
                .collect();
            let woken = limits::free(conn, now, &ended)?;
            Ok(Settled { held, woken })
        })
        .await
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        let leases = leases.to_vec();
        self.call("renew", move |conn, now| {
            let held = settle::renew(conn, now, &leases, lease)?;
            let renewed: Vec<LeaseRef> = leases
                .iter()
                .zip(&held)
                .filter_map(|(l, &h)| h.then_some(*l))
                .collect();
            limits::renew(conn, &renewed, now.plus(lease))?;
            Ok(held)
        })
        .await
    }
}

#[async_trait]
impl Rules for SqliteStore {
    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool> {
        let rule = rule.clone();
        self.call("add_rule", move |conn, now| rules::add(conn, now, &rule))
            .await
    }

    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool> {
        let rule = rule.clone();
        self.call("remove_rule", move |conn, _| rules::remove(conn, &rule))
            .await
    }

    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
        let (tenant, handler) = (tenant.to_string(), handler.to_string());
        self.call("rules_for", move |conn, _| {
            rules::rule_match(conn, "rules_for", &tenant, &handler)
        })
        .await
    }

    async fn rules(&self) -> StoreResult<Vec<Rule>> {
        self.call("rules", move |conn, _| rules::all(conn)).await
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
        let (tenant, handler) = (tenant.to_string(), handler.to_string());
        self.call("renotify_page", move |conn, now| {
            rules::renotify_page(conn, now, &tenant, &handler, after, limit)
        })
        .await
    }
}

#[async_trait]
impl Topics for SqliteStore {
    async fn subscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        let s = subscription.clone();
        self.call("subscribe", move |conn, now| {
            topics::subscribe(conn, now, &s)
        })
        .await
    }

    async fn unsubscribe(&self, subscription: &Subscription) -> StoreResult<bool> {
        let s = subscription.clone();
        self.call("unsubscribe", move |conn, _| topics::unsubscribe(conn, &s))
            .await
    }

    async fn subscribers(&self, tenant: &str, topic: &str) -> StoreResult<Vec<String>> {
        let (tenant, topic) = (tenant.to_string(), topic.to_string());
        self.call("subscribers", move |conn, _| {
            topics::subscribers(conn, &tenant, &topic)
        })
        .await
    }

    async fn subscriptions(&self, topic: Option<&str>) -> StoreResult<Vec<Subscription>> {
        let topic = topic.map(str::to_string);
        self.call("subscriptions", move |conn, _| {
            topics::list(conn, topic.as_deref())
        })
        .await
    }

    async fn sync_subscriptions(&self, declared: &[Subscription]) -> StoreResult<SubscriptionSync> {
        let declared = declared.to_vec();
        self.call("sync_subscriptions", move |conn, now| {
            topics::sync(conn, now, &declared)
        })
        .await
    }
}

#[async_trait]
impl Limits for SqliteStore {
    async fn set_limit(&self, limit: &Limit) -> StoreResult<bool> {
        limit.check().map_err(herald::StoreError::Invalid)?;
        let limit = limit.clone();
        self.call("set_limit", move |conn, now| {
            limits::set(conn, now, &limit, LimitSource::Api)
        })
        .await
    }

    async fn remove_limit(&self, handler: &str, scope: &LimitScope) -> StoreResult<bool> {
        let (handler, scope) = (handler.to_string(), scope.clone());
        self.call("remove_limit", move |conn, _| {
            limits::remove(conn, &handler, &scope)
        })
        .await
    }

    async fn limits(&self, handler: Option<&str>) -> StoreResult<Vec<StoredLimit>> {
        let handler = handler.map(str::to_string);
        self.call("limits", move |conn, _| {
            limits::list(conn, handler.as_deref())
        })
        .await
    }

    async fn sync_limits(&self, declared: &[Limit]) -> StoreResult<Vec<(String, LimitKind)>> {
        for l in declared {
            l.check().map_err(herald::StoreError::Invalid)?;
        }
        let declared = declared.to_vec();
        self.call("sync_limits", move |conn, now| {
            limits::sync(conn, now, &declared)
        })
        .await
    }

    async fn wake_limit(
        &self,
        handler: &str,
        kind: LimitKind,
        after: Option<(String, String)>,
        scopes: usize,
    ) -> StoreResult<WakePage> {
        let handler = handler.to_string();
        self.call("wake_limit", move |conn, now| {
            limits::wake_limit(conn, now, &handler, kind, after.clone(), scopes)
        })
        .await
    }
}

#[async_trait]
impl Reconciliation for SqliteStore {
    async fn lapse_slots(&self, limit: usize) -> StoreResult<Vec<Scheduled>> {
        self.call("lapse_slots", move |conn, now| {
            limits::lapse(conn, now, limit)
        })
        .await
    }

    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
        self.call("sweep", move |conn, now| {
            sweep::page(conn, now, quiet, pass, limit)
        })
        .await
    }

    async fn purge_keys(&self, window: Duration, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        self.call("purge_keys", move |conn, now| {
            emit::purge_keys(conn, now, now.minus(window), limit)
        })
        .await
    }

    /// Purges the idempotency keys older than the window, a page at a
    /// time, at most [`KEY_PURGE_PAGES`] pages a pass.
    async fn upkeep(&self) -> StoreResult<()> {
        let window = self.idempotency_window();
        for _ in 0..KEY_PURGE_PAGES {
            if (self.purge_keys(window, KEY_PURGE_PAGE).await? as usize) < KEY_PURGE_PAGE {
                break;
            }
        }
        Ok(())
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
        self.call("purge", move |conn, now| {
            let (dead_before, done_before) = (now.minus(dead_retention), now.minus(done_retention));
            admin::purge(conn, dead_before, done_before, limit)
        })
        .await
    }
}

#[async_trait]
impl LeaderElection for SqliteStore {
    async fn lead(&self, role: &str, holder: &str, lease: Duration) -> StoreResult<Leadership> {
        let (role, holder) = (role.to_string(), holder.to_string());
        self.call("lead", move |conn, now| {
            leaders::lead(conn, now, &role, &holder, lease)
        })
        .await
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        let (role, holder) = (role.to_string(), holder.to_string());
        self.call("resign", move |conn, _| {
            leaders::resign(conn, &role, &holder)
        })
        .await
    }
}

#[async_trait]
impl Operator for SqliteStore {
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.call("get", move |conn, _| reads::get(conn, id)).await
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<AttemptError>> {
        let text = self
            .call("history", move |conn, _| reads::errors(conn, id))
            .await?;
        reads::attempt_errors(id, text)
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let filter = filter.clone();
        self.call("list", move |conn, _| reads::list(conn, &filter, limit))
            .await
    }

    async fn counts(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>> {
        let query = query.clone();
        self.call("counts", move |conn, now| reads::counts(conn, now, &query))
            .await
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        self.call("revive", move |conn, now| admin::revive(conn, now, id))
            .await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        self.call("delete", move |conn, now| admin::delete(conn, now, id))
            .await
    }
}

#[async_trait]
impl Schedules for SqliteStore {
    async fn clock(&self) -> StoreResult<herald::Millis> {
        Ok(EventStore::inspect(self, &[]).await?.now)
    }

    async fn put_schedule(&self, schedule: &Schedule) -> StoreResult<bool> {
        let schedule = schedule.clone();
        self.call("put_schedule", move |conn, now| {
            schedules::put(conn, now, &schedule)
        })
        .await
    }

    async fn schedule(&self, tenant: &str, name: &str) -> StoreResult<Option<Schedule>> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.call("schedule", move |conn, _| {
            schedules::get(conn, &tenant, &name)
        })
        .await
    }

    async fn schedules(&self, tenant: Option<&str>) -> StoreResult<Vec<Schedule>> {
        let tenant = tenant.map(str::to_string);
        self.call("schedules", move |conn, _| {
            schedules::list(conn, tenant.as_deref())
        })
        .await
    }

    async fn pause_schedule(&self, tenant: &str, name: &str, paused: bool) -> StoreResult<bool> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.call("pause_schedule", move |conn, now| {
            schedules::pause(conn, now, &tenant, &name, paused)
        })
        .await
    }

    async fn delete_schedule(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.call("delete_schedule", move |conn, _| {
            schedules::delete(conn, &tenant, &name)
        })
        .await
    }

    async fn due_schedules(&self, limit: usize) -> StoreResult<DueSchedules> {
        self.call("due_schedules", move |conn, now| {
            schedules::due(conn, now, limit)
        })
        .await
    }

    async fn fire_schedule(&self, firing: &ScheduleFiring) -> StoreResult<Option<Vec<Emitted>>> {
        let firing = firing.clone();
        self.call("fire_schedule", move |conn, now| {
            schedules::fire(conn, now, &firing)
        })
        .await
    }
}
