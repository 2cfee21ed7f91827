//! Store-level scenarios: the [`Store`] contract, exercised through the
//! trait alone, with exact results. No SQL: a backend proves itself with
//! `herald::store_suite!(fresh_store)`.
//!
//! Times the store writes are bracketed by the store's own clock, read as
//! [`Inspection::now`](crate::store::Inspection::now) of an empty
//! [`Store::inspect`]. Events are made due or old with `NewEvent::run_at` in
//! the past, leases made to lapse by claiming with [`SHORT`] and sleeping
//! [`PAST_SHORT`].
//!
//! Beyond the trait's own docs, the scenarios pin what `docs/semantics.md`
//! and ADR 0005 describe: an expired lease stays its holder's until someone
//! else claims the event; renewals and sweep stamps leave `updated_at`
//! alone; a sweep returns dead workers' events before the others; revive is
//! refused with [`StoreError::Invalid`] when a live event has the same
//! idempotency key; the payload is kept byte for byte; `rules()` is ordered
//! by tenant, handler and kind name, `counts()` by tenant, handler and state
//! (pending, dead, done).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{
    Emitted, Event, EventId, EventState, LeaseToken, Millis, NewEvent, Rule, RuleKind, RuleMatch,
};
use crate::store::{
    CountsQuery, EventFilter, Finish, HandlerCounts, Leadership, LeaseRef, Scheduled, Settle,
    Store, StoreError,
};

// The suite macro names every scenario in this module.
pub use super::parity::claim_takes_exactly_what_admit_would_claim;

/// A lease that outlives any scenario.
pub const LEASE: Duration = Duration::from_secs(60);
/// A lease that lapses during a scenario.
pub const SHORT: Duration = Duration::from_millis(50);
/// A sleep after which a [`SHORT`] lease has expired.
pub const PAST_SHORT: Duration = Duration::from_millis(120);
/// A quiet period that nothing notified during a scenario outlives.
const QUIET: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- helpers

/// A due event of `(tenant, handler)`: three attempts, no key. Due a second
/// ago rather than now, so that a store clock a little behind the test's
/// does not make it "not yet due".
fn new_event(tenant: &str, handler: &str) -> NewEvent {
    NewEvent {
        id: EventId::new(),
        tenant: tenant.into(),
        handler: handler.into(),
        payload: r#"{"n":1}"#.into(),
        run_at: ago(Duration::from_secs(1)),
        max_attempts: 3,
        idempotency_key: None,
    }
}

/// An event due (and, by `notified_at = run_at`, last notified) a minute ago.
fn old_event(tenant: &str, handler: &str) -> NewEvent {
    NewEvent {
        run_at: ago(Duration::from_secs(60)),
        ..new_event(tenant, handler)
    }
}

fn ago(d: Duration) -> Millis {
    Millis::now().minus(d)
}

fn from_now(d: Duration) -> Millis {
    Millis::now().plus(d)
}

fn handlers(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn pause(tenant: &str, handler: &str) -> Rule {
    Rule {
        tenant: tenant.into(),
        handler: handler.into(),
        kind: RuleKind::Pause,
    }
}

fn block(tenant: &str, handler: &str) -> Rule {
    Rule {
        kind: RuleKind::Block,
        ..pause(tenant, handler)
    }
}

/// The store's clock.
async fn store_now(store: &dyn Store) -> Millis {
    store.inspect(&[]).await.expect("inspect").now
}

async fn emit_one(store: &dyn Store, e: NewEvent) -> EventId {
    let out = store.emit(&[e]).await.expect("emit");
    match out[..] {
        [Emitted::Created(id)] => id,
        ref other => panic!("expected one Created, got {other:?}"),
    }
}

async fn emit_all(store: &dyn Store, events: &[NewEvent]) -> Vec<EventId> {
    let out = store.emit(events).await.expect("emit");
    assert_eq!(out.len(), events.len());
    for (e, o) in events.iter().zip(&out) {
        assert_eq!(*o, Emitted::Created(e.id));
    }
    out.into_iter().map(Emitted::id).collect()
}

/// Claims one id of handler `h` with a fresh token; the token if it was
/// claimed.
async fn claim_one(store: &dyn Store, id: EventId, lease: Duration) -> Option<LeaseToken> {
    let token = LeaseToken::new();
    let got = store
        .claim(&[id], &handlers(&["h"]), token, lease)
        .await
        .expect("claim");
    match got.len() {
        0 => None,
        1 => {
            assert_eq!(got[0].id, id);
            assert_eq!(got[0].lease.expect("a lease").token, token);
            Some(token)
        }
        n => panic!("claimed {n} events for one id"),
    }
}

async fn settle_one(
    store: &dyn Store,
    id: EventId,
    token: Option<LeaseToken>,
    finish: Finish,
) -> bool {
    let out = store
        .settle(&[Settle { id, token, finish }])
        .await
        .expect("settle");
    assert_eq!(out.len(), 1);
    out[0]
}

/// Moves an unleased pending event to `dead`.
async fn bury(store: &dyn Store, id: EventId) {
    let error = "e".to_string();
    assert!(settle_one(store, id, None, Finish::Bury { error }).await);
}

async fn get(store: &dyn Store, id: EventId) -> Event {
    store.get(id).await.expect("get").expect("stored")
}

fn ids_of(scheduled: &[Scheduled]) -> Vec<EventId> {
    scheduled.iter().map(|s| s.notification.event_id).collect()
}

/// The ids one page of a new sweep pass returns.
async fn sweep_once(store: &dyn Store, quiet: Duration, limit: usize) -> Vec<EventId> {
    ids_of(&store.sweep(quiet, None, limit).await.expect("sweep").due)
}

/// One whole sweep pass: the sizes of its pages and the ids, in order.
async fn sweep_pass(
    store: &dyn Store,
    quiet: Duration,
    limit: usize,
) -> (Vec<usize>, Vec<EventId>) {
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    let mut pass = None;
    loop {
        let page = store.sweep(quiet, pass, limit).await.expect("sweep");
        if let Some(p) = pass {
            assert_eq!(page.pass, p, "the cursor of a pass does not move");
        }
        pass = Some(page.pass);
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.delay, Duration::ZERO, "{s:?}");
        }
        seen.extend(ids_of(&page.due));
        if page.complete {
            return (pages, seen);
        }
        assert!(pages.len() < 20, "the pass does not end: {pages:?}");
    }
}

fn release(wait: Duration, error: Option<&str>, give_back: bool) -> Finish {
    Finish::Release {
        wait,
        error: error.map(str::to_string),
        give_back,
    }
}

/// The four ways a run ends.
fn every_finish(error: &str) -> [Finish; 4] {
    [
        Finish::Delete,
        Finish::Archive,
        release(Duration::ZERO, Some(error), true),
        Finish::Bury {
            error: error.into(),
        },
    ]
}

// ---------------------------------------------------------------- emit

/// Emit stores every field as given (the payload byte for byte), pending,
/// attempt 0, no lease, created and updated at the store's now.
pub async fn emit_stores_the_event_as_given(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("acme", "send_email");
    e.payload = "{ \"n\": 1,  \"text\": \"é ✓\", \"nested\": {\"b\": [1, 2.50]} }".into();
    e.run_at = from_now(Duration::from_secs(5));
    e.max_attempts = 7;
    e.idempotency_key = Some("k1".into());
    let before = store_now(store).await;
    let id = emit_one(store, e.clone()).await;
    let after = store_now(store).await;
    assert_eq!(id, e.id);
    let got = get(store, id).await;
    assert_eq!(got.id, e.id);
    assert_eq!(got.tenant, "acme");
    assert_eq!(got.handler, "send_email");
    assert_eq!(got.payload, e.payload, "the payload exactly as emitted");
    assert_eq!(got.state, EventState::Pending);
    assert_eq!(got.run_at, e.run_at);
    assert_eq!(got.attempt, 0);
    assert_eq!(got.max_attempts, 7);
    assert_eq!(got.lease, None);
    assert_eq!(got.last_error, None);
    assert_eq!(got.idempotency_key.as_deref(), Some("k1"));
    assert!(got.created_at >= before && got.created_at <= after);
    assert_eq!(got.updated_at, got.created_at);
    assert_eq!(store.get(EventId::new()).await.expect("get"), None);
}

/// Emitting an id that is stored already (a retried emit whose first try
/// committed) reports it as existing and stores nothing more.
pub async fn emitting_the_same_id_twice_reports_existing(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let e = new_event("t", "h");
    assert_eq!(
        store.emit(std::slice::from_ref(&e)).await.expect("emit"),
        vec![Emitted::Created(e.id)]
    );
    let other = new_event("t", "h");
    assert_eq!(
        store.emit(&[e.clone(), other.clone()]).await.expect("emit"),
        vec![Emitted::Existing(e.id), Emitted::Created(other.id)]
    );
    assert_eq!(super::stored(store).await, 2);
}

/// One live event per `(tenant, handler, key)`: existing within a batch, in
/// a later batch and while running; independent per tenant and handler;
/// free again once the event went dead, done or deleted; and revive refuses
/// to make a second live event with the key.
pub async fn idempotency_key_is_one_live_event_per_key(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let keyed = |key: &str| NewEvent {
        idempotency_key: Some(key.into()),
        ..new_event("t", "h")
    };
    // Within one batch.
    let a = keyed("k");
    let b = keyed("k");
    assert_eq!(
        store.emit(&[a.clone(), b.clone()]).await.expect("emit"),
        vec![Emitted::Created(a.id), Emitted::Existing(a.id)]
    );
    assert_eq!(store.get(b.id).await.expect("get"), None);
    // In a later batch, while pending.
    assert_eq!(
        store.emit(&[keyed("k")]).await.expect("emit"),
        vec![Emitted::Existing(a.id)]
    );
    // While running.
    let token = claim_one(store, a.id, LEASE).await.expect("claimed");
    assert_eq!(
        store.emit(&[keyed("k")]).await.expect("emit"),
        vec![Emitted::Existing(a.id)]
    );
    // Same key, other handler or tenant: independent.
    let other_handler = NewEvent {
        handler: "h2".into(),
        ..keyed("k")
    };
    let other_tenant = NewEvent {
        tenant: "t2".into(),
        ..keyed("k")
    };
    assert_eq!(
        store
            .emit(&[other_handler.clone(), other_tenant.clone()])
            .await
            .expect("emit"),
        vec![
            Emitted::Created(other_handler.id),
            Emitted::Created(other_tenant.id)
        ]
    );
    assert_eq!(super::stored(store).await, 3);
    // Once it went dead, the key is free again.
    let error = "boom".to_string();
    assert!(settle_one(store, a.id, Some(token), Finish::Bury { error }).await);
    let c = keyed("k");
    assert_eq!(
        store.emit(std::slice::from_ref(&c)).await.expect("emit"),
        vec![Emitted::Created(c.id)]
    );
    // Reviving the dead one now would make two live events with one key.
    match store.revive(a.id).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains(&c.id.to_string()), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(get(store, a.id).await.state, EventState::Dead, "unchanged");
    // Once deleted, the key is free again too.
    assert!(store.delete(c.id).await.expect("delete"));
    let d = keyed("k");
    assert_eq!(
        store.emit(std::slice::from_ref(&d)).await.expect("emit"),
        vec![Emitted::Created(d.id)]
    );
    // And once done (archived).
    assert!(settle_one(store, d.id, None, Finish::Archive).await);
    let e = keyed("k");
    assert_eq!(
        store.emit(std::slice::from_ref(&e)).await.expect("emit"),
        vec![Emitted::Created(e.id)]
    );
}

// ---------------------------------------------------------------- claim

/// LockClaim, won: the claim writes the token and `now + lease`, increments
/// `attempt`, and returns the event as updated (as `get` then reads it).
pub async fn claim_takes_the_lease_and_increments_attempt(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let token = LeaseToken::new();
    let before = store_now(store).await;
    let got = store
        .claim(&[id], &handlers(&["h"]), token, LEASE)
        .await
        .expect("claim");
    let after = store_now(store).await;
    assert_eq!(got.len(), 1);
    let e = &got[0];
    assert_eq!(e.id, id);
    assert_eq!(e.attempt, 1);
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.payload, r#"{"n":1}"#);
    let lease = e.lease.expect("a lease");
    assert_eq!(lease.token, token);
    assert!(lease.expires_at >= before.plus(LEASE) && lease.expires_at <= after.plus(LEASE));
    assert_eq!(e.updated_at, lease.expires_at.minus(LEASE));
    // As stored.
    assert_eq!(&get(store, id).await, e);
}

/// EventLoad: a missing id, a dead event and a done event are not claimed.
pub async fn claim_ignores_missing_ids_and_finished_events(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert_eq!(claim_one(store, EventId::new(), LEASE).await, None);
    let done = emit_one(store, new_event("t", "h")).await;
    let token = claim_one(store, done, LEASE).await.expect("claimed");
    assert!(settle_one(store, done, Some(token), Finish::Archive).await);
    let stored = get(store, done).await;
    assert_eq!(claim_one(store, done, Duration::ZERO).await, None);
    assert_eq!(claim_one(store, done, LEASE).await, None);
    assert_eq!(get(store, done).await, stored, "unchanged");
    let dead = emit_one(store, new_event("t", "h")).await;
    bury(store, dead).await;
    let stored = get(store, dead).await;
    assert_eq!(claim_one(store, dead, LEASE).await, None);
    assert_eq!(get(store, dead).await, stored, "unchanged");
}

/// DelayCheck: an event whose `run_at` is in the future is not claimed.
pub async fn claim_skips_an_event_that_is_not_due(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("t", "h");
    e.run_at = from_now(Duration::from_secs(60));
    let id = emit_one(store, e).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 0);
    assert_eq!(e.lease, None);
}

/// PauseCheck (pause): a paused event is not claimed; another tenant's or
/// another handler's pause does not hold it.
pub async fn claim_skips_a_paused_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    assert!(store.add_rule(&pause("t", "h")).await.expect("add_rule"));
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!((e.attempt, e.lease), (0, None));
    assert!(store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert!(store.add_rule(&pause("other", "h")).await.expect("add"));
    assert!(store.add_rule(&pause("t", "other")).await.expect("add"));
    assert!(claim_one(store, id, LEASE).await.is_some());
}

/// PauseCheck (block): a blocked event is not claimed until unblocked.
pub async fn claim_skips_a_blocked_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    assert!(store.add_rule(&block("t", "h")).await.expect("add_rule"));
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!((e.attempt, e.lease), (0, None));
    assert!(store.remove_rule(&block("t", "h")).await.expect("remove"));
    assert!(claim_one(store, id, LEASE).await.is_some());
}

/// LockCheck: a live lease is not taken; the holder and attempt stay.
pub async fn claim_skips_a_live_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let first = claim_one(store, id, LEASE).await.expect("claimed");
    let held = get(store, id).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!(e.lease.expect("a lease").token, first);
    assert_eq!(e.attempt, 1);
    assert_eq!(e, held, "unchanged");
}

/// LockCheck: an expired lease (by the store's clock) is claimed again,
/// with a new token and the next attempt.
pub async fn claim_takes_an_expired_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let first = claim_one(store, id, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    let second = claim_one(store, id, LEASE).await.expect("claimed again");
    assert_ne!(first, second);
    let e = get(store, id).await;
    assert_eq!(e.lease.expect("a lease").token, second);
    assert_eq!(e.attempt, 2);
}

/// LockCheck, no attempts left: an expired lease whose attempts are used up
/// is not claimed (the worker buries it), nor is an event with
/// `max_attempts = 0`.
pub async fn claim_skips_an_event_with_no_attempts_left(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("t", "h");
    e.max_attempts = 1;
    let id = emit_one(store, e).await;
    claim_one(store, id, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    // Expired, but attempt 1 of 1 was used: the worker must bury it instead.
    assert_eq!(claim_one(store, id, LEASE).await, None);
    assert_eq!(get(store, id).await.attempt, 1);
    let mut zero = new_event("t", "h");
    zero.max_attempts = 0;
    let zero = emit_one(store, zero).await;
    assert_eq!(claim_one(store, zero, LEASE).await, None);
    assert_eq!(get(store, zero).await.attempt, 0);
}

/// HandlerCheck: only events of a handler in the list are claimed; an
/// empty list claims nothing.
pub async fn claim_skips_a_handler_the_worker_does_not_have(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "other")).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let none = store
        .claim(&[id], &[], LeaseToken::new(), LEASE)
        .await
        .expect("claim");
    assert!(none.is_empty());
    assert_eq!(get(store, id).await.attempt, 0);
    let got = store
        .claim(&[id], &handlers(&["h", "other"]), LeaseToken::new(), LEASE)
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
}

/// Every claim condition at once: the ids to claim (with a missing one and
/// a duplicate) and the ones that may be claimed.
async fn claim_scenario(store: &dyn Store) -> (Vec<EventId>, HashSet<EventId>) {
    let ok1 = emit_one(store, new_event("t", "h")).await;
    let ok2 = emit_one(store, new_event("t", "h")).await;
    let mut late = new_event("t", "h");
    late.run_at = from_now(Duration::from_secs(60));
    let late = emit_one(store, late).await;
    let paused = emit_one(store, new_event("p", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add_rule");
    let blocked = emit_one(store, new_event("b", "h")).await;
    store.add_rule(&block("b", "h")).await.expect("add_rule");
    let foreign = emit_one(store, new_event("t", "x")).await;
    let live = emit_one(store, new_event("t", "h")).await;
    claim_one(store, live, LEASE).await.expect("claimed");
    let expired = emit_one(store, new_event("t", "h")).await;
    claim_one(store, expired, SHORT).await.expect("claimed");
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    claim_one(store, spent, SHORT).await.expect("claimed");
    let dead = emit_one(store, new_event("t", "h")).await;
    bury(store, dead).await;
    let done = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    tokio::time::sleep(PAST_SHORT).await;
    let ids = vec![
        ok1,
        late,
        EventId::new(),
        paused,
        blocked,
        foreign,
        live,
        expired,
        spent,
        dead,
        done,
        ok2,
        ok1,
    ];
    (ids, HashSet::from([ok1, ok2, expired]))
}

/// A batch claim returns exactly the claimable events, each once (though
/// one is asked twice), under the batch's token, with their attempts.
pub async fn claim_of_a_batch_returns_only_the_claimable(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let (ids, claimable) = claim_scenario(store).await;
    let token = LeaseToken::new();
    let got = store
        .claim(&ids, &handlers(&["h"]), token, LEASE)
        .await
        .expect("claim");
    let got_ids: HashSet<EventId> = got.iter().map(|e| e.id).collect();
    assert_eq!(
        got.len(),
        claimable.len(),
        "each once, though ok1 is asked twice"
    );
    assert_eq!(got_ids, claimable);
    for e in &got {
        assert_eq!(e.lease.expect("a lease").token, token);
        assert_eq!(&get(store, e.id).await, e);
    }
    let mut attempts: Vec<u32> = got.iter().map(|e| e.attempt).collect();
    attempts.sort_unstable();
    assert_eq!(attempts, vec![1, 1, 2], "the expired one's second attempt");
}

/// Claims of one id at a time, then of two, agree with the batch.
pub async fn claims_of_one_or_a_few_ids_agree_with_the_batch(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let (ids, claimable) = claim_scenario(store).await;
    let (singles, pairs) = ids.split_at(ids.len() / 2);
    let mut got = Vec::new();
    for chunk in singles.chunks(1).chain(pairs.chunks(2)) {
        let claimed = store
            .claim(chunk, &handlers(&["h"]), LeaseToken::new(), LEASE)
            .await
            .expect("claim");
        got.extend(claimed.into_iter().map(|e| e.id));
    }
    assert_eq!(got.len(), claimable.len(), "{got:?}");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), claimable);
}

/// LockClaim, lost: 16 tasks claim one event at once, five rounds; exactly
/// one wins each round, and the stored lease is the winner's.
pub async fn sixteen_concurrent_claims_of_one_event_have_one_winner(store: Arc<dyn Store>) {
    for round in 0..5 {
        let id = emit_one(store.as_ref(), new_event("t", "h")).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let store = store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let token = LeaseToken::new();
                    let got = store
                        .claim(&[id], &handlers(&["h"]), token, LEASE)
                        .await
                        .expect("claim");
                    (got.len(), token)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (n, token) = t.await.expect("task");
            assert!(n <= 1);
            if n == 1 {
                winners.push(token);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        let e = get(store.as_ref(), id).await;
        assert_eq!(e.attempt, 1, "round {round}");
        assert_eq!(e.lease.expect("a lease").token, winners[0]);
    }
}

// ---------------------------------------------------------------- inspect

/// Inspect loads the events that exist (as `get` reads them) with the rules
/// that match each, omits missing ids, and reports the store's clock.
pub async fn inspect_loads_events_and_their_rules(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let plain = emit_one(store, new_event("t", "h")).await;
    let paused = emit_one(store, new_event("p", "h")).await;
    let blocked = emit_one(store, new_event("k", "h")).await;
    let both = emit_one(store, new_event("b", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add_rule");
    store.add_rule(&block("k", "h")).await.expect("add_rule");
    store.add_rule(&pause("b", "h")).await.expect("add_rule");
    store.add_rule(&block("b", "h")).await.expect("add_rule");
    // A rule of another handler of the same tenant matches nothing here.
    store.add_rule(&block("t", "x")).await.expect("add_rule");
    let missing = EventId::new();
    let before = store_now(store).await;
    let got = store
        .inspect(&[plain, missing, paused, blocked, both])
        .await
        .expect("inspect");
    let after = store_now(store).await;
    assert!(got.now >= before && got.now <= after);
    assert_eq!(got.found.len(), 4);
    assert!(got.found.iter().all(|i| i.event.id != missing));
    let found = |id: EventId| {
        got.found
            .iter()
            .find(|i| i.event.id == id)
            .expect("inspected")
    };
    for id in [plain, paused, blocked, both] {
        assert_eq!(found(id).event, get(store, id).await);
    }
    assert_eq!(found(plain).rules, RuleMatch::default());
    assert_eq!(
        found(paused).rules,
        RuleMatch {
            blocked: false,
            paused: true
        }
    );
    assert_eq!(
        found(blocked).rules,
        RuleMatch {
            blocked: true,
            paused: false
        }
    );
    assert_eq!(
        found(both).rules,
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    let none = store.inspect(&[missing]).await.expect("inspect");
    assert!(none.found.is_empty());
}

// ---------------------------------------------------------------- settle

/// Settle reports per item, in order: Delete removes the event, Archive
/// keeps it `done`, Bury moves it to `dead` with the error; an unknown id
/// reports false; a finished event has no run to end.
pub async fn settle_delete_archive_and_bury(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let ids = emit_all(
        store,
        &[
            new_event("t", "h"),
            new_event("t", "h"),
            new_event("t", "h"),
        ],
    )
    .await;
    let token = LeaseToken::new();
    let claimed = store
        .claim(&ids, &handlers(&["h"]), token, LEASE)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let before = store_now(store).await;
    let out = store
        .settle(&[
            Settle {
                id: ids[0],
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[1],
                token: Some(token),
                finish: Finish::Archive,
            },
            Settle {
                id: EventId::new(),
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[2],
                token: Some(token),
                finish: Finish::Bury {
                    error: "failed for good".into(),
                },
            },
        ])
        .await
        .expect("settle");
    let after = store_now(store).await;
    assert_eq!(out, vec![true, true, false, true]);
    assert_eq!(store.get(ids[0]).await.expect("get"), None);
    let done = get(store, ids[1]).await;
    assert_eq!(done.state, EventState::Done);
    assert_eq!(done.lease, None);
    assert_eq!(done.attempt, 1);
    assert_eq!(done.last_error, None);
    assert!(done.updated_at >= before && done.updated_at <= after);
    let dead = get(store, ids[2]).await;
    assert_eq!(dead.state, EventState::Dead);
    assert_eq!(dead.lease, None);
    assert_eq!(dead.last_error.as_deref(), Some("failed for good"));
    assert_eq!(dead.attempt, 1);
    assert!(dead.updated_at >= before && dead.updated_at <= after);
    // A finished event has no run to end, even fenced on "no lease", nor
    // with the token that ended it.
    for id in [ids[1], ids[2]] {
        for token in [None, Some(token)] {
            for finish in every_finish("again") {
                assert!(
                    !settle_one(store, id, token, finish.clone()).await,
                    "{finish:?}"
                );
            }
        }
    }
    assert_eq!(get(store, ids[1]).await, done);
    assert_eq!(get(store, ids[2]).await, dead);
}

/// Release: a failure keeps the attempt, records the error and waits; a
/// release without an error keeps the last one; give_back returns the
/// Each failed attempt is recorded in the error history, oldest first, by
/// the statement that settles it; a snooze records nothing; the history
/// survives a revive and is empty for an unknown id.
pub async fn history_records_each_failed_attempt(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.history(EventId::new()).await.expect("history"), vec![]);
    let id = emit_one(s, new_event("t", "h")).await;
    assert_eq!(s.history(id).await.expect("history"), vec![]);
    let before = store_now(s).await;
    let token = claim_one(s, id, LEASE).await.expect("attempt 1");
    assert!(
        settle_one(
            s,
            id,
            Some(token),
            release(Duration::ZERO, Some("boom"), false)
        )
        .await
    );
    let token = claim_one(s, id, LEASE).await.expect("attempt 2");
    // A snooze gives the attempt back and records nothing.
    assert!(settle_one(s, id, Some(token), release(Duration::ZERO, None, true)).await);
    let token = claim_one(s, id, LEASE).await.expect("attempt 2 again");
    let bury = Finish::Bury {
        error: "gave up".into(),
    };
    assert!(settle_one(s, id, Some(token), bury).await);
    let after = store_now(s).await;
    let history = s.history(id).await.expect("history");
    let seen: Vec<(u32, &str)> = history
        .iter()
        .map(|h| (h.attempt, h.error.as_str()))
        .collect();
    assert_eq!(seen, vec![(1, "boom"), (2, "gave up")]);
    for h in &history {
        assert!(
            before <= h.at && h.at <= after,
            "{h:?} outside [{before:?}, {after:?}]"
        );
    }
    assert!(s.revive(id).await.expect("revive").is_some());
    assert_eq!(
        s.history(id).await.expect("history").len(),
        2,
        "kept across a revive"
    );
}

/// attempt, never below 0.
pub async fn release_arithmetic(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;

    // A failure: attempt kept, error recorded, run_at = now + wait.
    let t1 = claim_one(store, id, LEASE).await.expect("claimed");
    let wait = Duration::from_secs(30);
    let before = store_now(store).await;
    let fail = release(wait, Some("attempt 1/3 failed: boom"), false);
    assert!(settle_one(store, id, Some(t1), fail).await);
    let after = store_now(store).await;
    let e = get(store, id).await;
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.attempt, 1);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at >= before.plus(wait) && e.run_at <= after.plus(wait));
    assert_eq!(e.updated_at, e.run_at.minus(wait));
    // Not due now.
    assert_eq!(claim_one(store, id, LEASE).await, None);

    // Fenced on "no lease": the event is not leased now. No error given,
    // none given back: the attempt and the last error stay.
    assert!(settle_one(store, id, None, release(Duration::ZERO, None, false)).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 1);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at <= store_now(store).await);

    // A snooze: the attempt is given back; the last error is kept.
    let t2 = claim_one(store, id, LEASE).await.expect("claimed");
    assert_eq!(get(store, id).await.attempt, 2);
    assert!(settle_one(store, id, Some(t2), release(Duration::ZERO, None, true)).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 1);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at <= store_now(store).await);

    // A later failure replaces the error.
    let t3 = claim_one(store, id, LEASE).await.expect("claimed");
    let fail = release(Duration::ZERO, Some("attempt 2/3 failed: bang"), false);
    assert!(settle_one(store, id, Some(t3), fail).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 2);
    assert_eq!(e.last_error.as_deref(), Some("attempt 2/3 failed: bang"));

    // Giving back never goes below zero.
    let fresh = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, fresh, None, release(Duration::ZERO, None, true)).await);
    assert_eq!(get(store, fresh).await.attempt, 0);
}

/// Release and revive count as notifications (`notified_at` becomes the new
/// `run_at`): a sweep with a quiet period does not return them at once,
/// while an old event that was never released is returned.
pub async fn release_and_revive_count_as_notifications(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let released = emit_one(store, old_event("t", "h")).await;
    let revived = emit_one(store, old_event("t", "h")).await;
    let untouched = emit_one(store, old_event("t", "h")).await;
    let token = claim_one(store, released, LEASE).await.expect("claimed");
    let snooze = release(Duration::ZERO, None, true);
    assert!(settle_one(store, released, Some(token), snooze).await);
    bury(store, revived).await;
    assert!(store.revive(revived).await.expect("revive").is_some());
    assert_eq!(sweep_once(store, QUIET, 100).await, vec![untouched]);
    // With no quiet period, all three (notified before the pass began).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let got: HashSet<EventId> = sweep_once(store, Duration::ZERO, 100)
        .await
        .into_iter()
        .collect();
    assert_eq!(got, HashSet::from([released, revived, untouched]));
    // Released into the future: not due, not swept, even with no quiet.
    let token = claim_one(store, released, LEASE).await.expect("claimed");
    let later = release(Duration::from_secs(60), Some("boom"), false);
    assert!(settle_one(store, released, Some(token), later).await);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let got: HashSet<EventId> = sweep_once(store, Duration::ZERO, 100)
        .await
        .into_iter()
        .collect();
    assert_eq!(got, HashSet::from([revived, untouched]));
}

/// Fencing: once a lease expired and another token claimed the event, the
/// stale token can neither settle it (any of the four finishes) nor renew
/// it, nor can a settle fenced on "no lease"; the event is unchanged. The
/// new token can renew and settle.
pub async fn a_stale_token_can_neither_settle_nor_renew(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let finishes = every_finish("late");
    let mut runs = Vec::new();
    for _ in &finishes {
        let id = emit_one(store, new_event("t", "h")).await;
        let stale = claim_one(store, id, SHORT).await.expect("claimed");
        runs.push((id, stale));
    }
    tokio::time::sleep(PAST_SHORT).await;
    for ((id, stale), finish) in runs.into_iter().zip(finishes) {
        let fresh = claim_one(store, id, LEASE).await.expect("claimed again");
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: stale }], LEASE)
                .await
                .expect("renew"),
            vec![false],
            "{finish:?}"
        );
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: fresh }], LEASE)
                .await
                .expect("renew"),
            vec![true],
            "{finish:?}"
        );
        let held = get(store, id).await;
        assert_eq!(held.lease.expect("a lease").token, fresh);
        assert_eq!(held.attempt, 2);
        assert!(
            !settle_one(store, id, Some(stale), finish.clone()).await,
            "{finish:?}"
        );
        assert!(
            !settle_one(store, id, None, finish.clone()).await,
            "{finish:?}"
        );
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: stale }], LEASE)
                .await
                .expect("renew"),
            vec![false],
            "{finish:?}"
        );
        assert_eq!(get(store, id).await, held, "{finish:?}");

        // The holder still can.
        assert!(settle_one(store, id, Some(fresh), finish.clone()).await);
        let after = store.get(id).await.expect("get");
        match finish {
            Finish::Delete => assert_eq!(after, None),
            Finish::Archive => assert_eq!(after.expect("kept").state, EventState::Done),
            Finish::Release { .. } => {
                let e = after.expect("kept");
                assert_eq!(
                    (e.state, e.lease, e.attempt),
                    (EventState::Pending, None, 1)
                );
                assert_eq!(e.last_error.as_deref(), Some("late"));
            }
            Finish::Bury { .. } => {
                let e = after.expect("kept");
                assert_eq!(e.state, EventState::Dead);
                assert_eq!(e.last_error.as_deref(), Some("late"));
            }
        }
    }
}

/// An expired lease stays its holder's until another worker claims the
/// event: the holder can still renew it or settle it (the worker buries an
/// exhausted event fenced by the expired token), while a settle fenced on
/// "no lease" is refused.
pub async fn an_expired_lease_stays_valid_until_another_claim(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    let renewed = emit_one(store, new_event("t", "h")).await;
    let t_spent = claim_one(store, spent, SHORT).await.expect("claimed");
    let t_renewed = claim_one(store, renewed, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;

    for finish in every_finish("no lease") {
        assert!(
            !settle_one(store, spent, None, finish.clone()).await,
            "{finish:?}"
        );
    }
    let error = "attempt 1/1 did not finish".to_string();
    assert!(settle_one(store, spent, Some(t_spent), Finish::Bury { error }).await);
    let e = get(store, spent).await;
    assert_eq!(e.state, EventState::Dead);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/1 did not finish"));

    let before = store_now(store).await;
    let lease = LeaseRef {
        id: renewed,
        token: t_renewed,
    };
    assert_eq!(
        store.renew(&[lease], LEASE).await.expect("renew"),
        vec![true]
    );
    let e = get(store, renewed).await;
    assert!(e.lease.expect("a lease").expires_at >= before.plus(LEASE));
    // Live again: nobody else claims it.
    assert_eq!(claim_one(store, renewed, LEASE).await, None);
    assert!(settle_one(store, renewed, Some(t_renewed), Finish::Delete).await);
}

/// Settle with `token: None` fences on "no lease": it ends an unleased
/// pending event (each finish) and refuses a leased one, unchanged.
pub async fn settle_without_a_token_fences_on_no_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    for finish in every_finish("operator") {
        let idle = emit_one(store, new_event("t", "h")).await;
        let running = emit_one(store, new_event("t", "h")).await;
        let token = claim_one(store, running, LEASE).await.expect("claimed");
        let held = get(store, running).await;
        assert!(
            !settle_one(store, running, None, finish.clone()).await,
            "{finish:?}"
        );
        assert_eq!(get(store, running).await, held, "{finish:?}");
        assert!(
            settle_one(store, idle, None, finish.clone()).await,
            "{finish:?}"
        );
        let after = store.get(idle).await.expect("get");
        let state = after.map(|e| e.state);
        let expected = match finish {
            Finish::Delete => None,
            Finish::Archive => Some(EventState::Done),
            Finish::Release { .. } => Some(EventState::Pending),
            Finish::Bury { .. } => Some(EventState::Dead),
        };
        assert_eq!(state, expected, "{finish:?}");
        assert!(settle_one(store, running, Some(token), finish.clone()).await);
    }
}

// ---------------------------------------------------------------- renew

/// Renew extends, per item, only the leases still held by that token, to
/// `now + lease`; it leaves `updated_at` alone; a settled event's lease is
/// gone.
pub async fn renew_extends_held_leases_only(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let a = emit_one(store, new_event("t", "h")).await;
    let b = emit_one(store, new_event("t", "h")).await;
    let ta = claim_one(store, a, Duration::from_secs(1))
        .await
        .expect("claimed");
    let tb = claim_one(store, b, Duration::from_secs(1))
        .await
        .expect("claimed");
    let updated = [
        get(store, a).await.updated_at,
        get(store, b).await.updated_at,
    ];
    let before = store_now(store).await;
    let out = store
        .renew(
            &[
                LeaseRef { id: a, token: ta },
                LeaseRef { id: b, token: ta },
                LeaseRef {
                    id: EventId::new(),
                    token: ta,
                },
                LeaseRef { id: b, token: tb },
            ],
            LEASE,
        )
        .await
        .expect("renew");
    let after = store_now(store).await;
    assert_eq!(out, vec![true, false, false, true]);
    for (id, updated_at) in [a, b].into_iter().zip(updated) {
        let e = get(store, id).await;
        let lease = e.lease.expect("a lease");
        assert!(lease.expires_at >= before.plus(LEASE) && lease.expires_at <= after.plus(LEASE));
        assert_eq!(e.updated_at, updated_at, "a renewal is not an update");
        assert_eq!(e.attempt, 1);
    }
    // A settled event's lease is gone.
    assert!(settle_one(store, a, Some(ta), Finish::Archive).await);
    assert_eq!(
        store
            .renew(&[LeaseRef { id: a, token: ta }], LEASE)
            .await
            .expect("renew"),
        vec![false]
    );
    assert!(store.renew(&[], LEASE).await.expect("renew").is_empty());
}

// ---------------------------------------------------------------- rules

/// Rules are added and removed once each, matched per `(tenant, handler)`,
/// and listed by tenant, handler and kind name.
pub async fn rules_add_remove_and_list(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store.rules().await.expect("rules").is_empty());
    assert!(store.add_rule(&pause("t", "h")).await.expect("add"));
    assert!(!store.add_rule(&pause("t", "h")).await.expect("add"));
    assert!(store.add_rule(&block("t", "h")).await.expect("add"));
    assert!(store.add_rule(&block("a", "z")).await.expect("add"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    assert_eq!(
        store.rules_for("t", "other").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(
        store.rules_for("other", "h").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(
        store.rules().await.expect("rules"),
        vec![block("a", "z"), block("t", "h"), pause("t", "h")]
    );
    assert!(store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert!(!store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch {
            blocked: true,
            paused: false
        }
    );
    assert!(store.remove_rule(&block("t", "h")).await.expect("remove"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(store.rules().await.expect("rules"), vec![block("a", "z")]);
}

// ---------------------------------------------------------------- renotify

/// renotify_page pages through 2,500 pending events of one handler in pages
/// of 1,000: each once, in id order, no gaps; with the delay until `run_at`;
/// other handlers, tenants and finished events are not included. The pages
/// count as notifications: a sweep then returns only the others.
pub async fn renotify_pages_through_2500_events_without_duplicates_or_gaps(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut expected = Vec::new();
    let mut late = None;
    for chunk in 0..5 {
        let batch: Vec<NewEvent> = (0..500)
            .map(|i| {
                let mut e = old_event("t", "h");
                if chunk == 4 && i == 499 {
                    e.run_at = from_now(Duration::from_secs(120));
                    late = Some(e.id);
                }
                e
            })
            .collect();
        expected.extend(emit_all(store, &batch).await);
    }
    let late = late.expect("a delayed event");
    // Not part of the page set: other handler, other tenant, finished.
    let other_handler = emit_one(store, old_event("t", "other")).await;
    let other_tenant = emit_one(store, old_event("u", "h")).await;
    let dead = emit_one(store, old_event("t", "h")).await;
    bury(store, dead).await;
    let done = emit_one(store, old_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    expected.sort();

    assert!(store
        .renotify_page("t", "h", None, 0)
        .await
        .expect("renotify")
        .is_empty());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = Vec::new();
    loop {
        let page = store
            .renotify_page("t", "h", after, 1000)
            .await
            .expect("renotify");
        if page.is_empty() {
            break;
        }
        pages.push(page.len());
        after = Some(page.last().expect("a page").notification.event_id);
        for s in page {
            assert_eq!(s.notification.tenant, "t");
            if s.notification.event_id == late {
                assert!(
                    s.delay > Duration::from_secs(100) && s.delay <= Duration::from_secs(120),
                    "{s:?}"
                );
            } else {
                assert_eq!(s.delay, Duration::ZERO, "{s:?}");
            }
            seen.push(s.notification.event_id);
        }
        assert!(pages.len() < 10, "the paging does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, expected, "every pending event once, in id order");
    // Stamped as notified: only the two others are swept.
    let got: HashSet<EventId> = sweep_once(store, QUIET, 5000).await.into_iter().collect();
    assert_eq!(got, HashSet::from([other_handler, other_tenant]));
}

// ---------------------------------------------------------------- sweep

/// Sweeps with a quiet period through 2,500 due events in pages of 1,000,
/// each page a new pass (the next scenario pages with the pass cursor):
/// each event once, dead workers' events first (returned without waiting
/// for the quiet period, even with no attempts left); events held by a
/// rule, running under a live lease, not yet due, or notified recently are
/// not returned. Returned ones count as notified, so the next pass returns
/// nothing; once the pause is lifted, renotify pages through the paused.
pub async fn sweep_pages_through_due_events_and_skips_held_ones(store: Arc<dyn Store>) {
    let store = store.as_ref();
    // 2,500 due events, not notified for a minute.
    let mut due: Vec<EventId> = Vec::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500).map(|_| old_event("t", "h")).collect();
        due.extend(emit_all(store, &batch).await);
    }
    // Held by rules: not returned.
    let mut held: Vec<NewEvent> = (0..5).map(|_| old_event("paused", "h")).collect();
    let paused: Vec<EventId> = held.iter().map(|e| e.id).collect();
    let blocked = old_event("blocked", "h");
    held.push(blocked.clone());
    emit_all(store, &held).await;
    store.add_rule(&pause("paused", "h")).await.expect("add");
    store.add_rule(&block("blocked", "h")).await.expect("add");
    // Running under a live lease: skipped.
    let running = emit_one(store, old_event("t", "h")).await;
    claim_one(store, running, LEASE).await.expect("claimed");
    // Not due.
    let mut later = new_event("t", "h");
    later.run_at = from_now(Duration::from_secs(60));
    let later = emit_one(store, later).await;
    // Recently notified (emitted just now): not yet.
    let fresh = emit_one(store, new_event("t", "h")).await;
    // A dead worker's event: emitted and claimed just now (so notified
    // recently), its lease already expired. Returned at once, no quiet needed.
    let orphan = emit_one(store, new_event("t", "h")).await;
    claim_one(store, orphan, SHORT).await.expect("claimed");
    // Out of attempts but expired: returned too (the worker buries it).
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    claim_one(store, spent, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    let sample = get(store, due[0]).await;

    // Each call a new pass, as the reconciler's sweeps come one after the
    // other: what a call stamped, the next does not return.
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    loop {
        let page = store.sweep(QUIET, None, 1000).await.expect("sweep");
        if page.due.len() < 1000 {
            assert!(page.complete, "{} due", page.due.len());
        }
        if page.due.is_empty() {
            break;
        }
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.delay, Duration::ZERO, "{s:?}");
        }
        seen.extend(ids_of(&page.due));
        assert!(pages.len() < 10, "the sweep does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 502]);
    // The dead workers' events come first.
    let first_two: HashSet<EventId> = seen[..2].iter().copied().collect();
    assert_eq!(first_two, HashSet::from([orphan, spent]));
    let unique: HashSet<EventId> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    let mut expected: HashSet<EventId> = due.iter().copied().collect();
    expected.insert(orphan);
    expected.insert(spent);
    assert_eq!(unique, expected);
    for skipped in [running, later, fresh, blocked.id].iter().chain(&paused) {
        assert!(!unique.contains(skipped));
    }
    // A stamp is not an update.
    assert_eq!(get(store, due[0]).await, sample);
    // Returned ones were stamped now, so a new pass finds nothing.
    let (pages, seen) = sweep_pass(store, QUIET, 1000).await;
    assert_eq!((pages, seen), (vec![0], vec![]));

    // Unpause re-notifies the paused ones, and counts as a notification.
    assert!(store.remove_rule(&pause("paused", "h")).await.expect("rm"));
    let page = store
        .renotify_page("paused", "h", None, 100)
        .await
        .expect("renotify");
    let mut sorted = paused.clone();
    sorted.sort();
    assert_eq!(ids_of(&page), sorted);
    assert!(sweep_once(store, QUIET, 1000).await.is_empty());
    // With no quiet period, the paused ones are due again; the blocked one
    // still is not.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (_, seen) = sweep_pass(store, Duration::ZERO, 1000).await;
    let seen: HashSet<EventId> = seen.into_iter().collect();
    assert!(paused.iter().all(|id| seen.contains(id)));
    assert!(!seen.contains(&blocked.id));
    assert!(!seen.contains(&running));
    assert!(!seen.contains(&later));
}

/// A pass with no quiet period (the start-up sweep) through 2,500 due
/// events with the explicit cursor returns each exactly once and ends with
/// `complete`. A new pass with a quiet period returns nothing just stamped;
/// a new pass with none returns them all again.
pub async fn a_sweep_pass_with_no_quiet_returns_each_due_event_once_and_ends(
    store: Arc<dyn Store>,
) {
    let store = store.as_ref();
    let mut all = HashSet::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500).map(|_| new_event("t", "h")).collect();
        all.extend(emit_all(store, &batch).await);
    }
    let mut pages = Vec::new();
    let mut seen = HashSet::new();
    let mut pass = None;
    loop {
        // Let the clock move, as publishing a page would.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let page = store
            .sweep(Duration::ZERO, pass, 1000)
            .await
            .expect("sweep");
        if let Some(p) = pass {
            assert_eq!(page.pass, p, "the cursor of a pass does not move");
        }
        pass = Some(page.pass);
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.notification.tenant, "t");
            assert_eq!(s.delay, Duration::ZERO);
            assert!(seen.insert(s.notification.event_id), "returned twice");
        }
        if page.complete {
            break;
        }
        assert!(pages.len() < 10, "the pass does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, all);
    // A new pass with a quiet period: nothing, all were just stamped.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let page = store.sweep(QUIET, None, 1000).await.expect("sweep");
    assert!(page.due.is_empty());
    assert!(page.complete);
    // A new pass with no quiet: all of them again, since all were notified
    // before it began.
    let page = store
        .sweep(Duration::ZERO, None, 1000)
        .await
        .expect("sweep");
    assert_eq!(page.due.len(), 1000);
    assert!(!page.complete);
}

/// A crash between removing a rule and re-notifying its events must not
/// leave them unswept: events held by a rule are not returned; once the
/// rule is removed without renotify_page, a later sweep returns them
/// (once); events still held by another rule are not.
pub async fn events_parked_under_a_rule_that_is_gone_are_swept_again(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let held: Vec<NewEvent> = (0..3).map(|_| old_event("p", "h")).collect();
    emit_all(store, &held).await;
    let still_held = emit_one(store, old_event("b", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add");
    store.add_rule(&pause("b", "h")).await.expect("add");
    store.add_rule(&block("b", "h")).await.expect("add");
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    // Unpause "p" and crash before paging; unpause "b", still blocked.
    store.remove_rule(&pause("p", "h")).await.expect("remove");
    store.remove_rule(&pause("b", "h")).await.expect("remove");
    let (_, got) = sweep_pass(store, QUIET, 100).await;
    assert_eq!(got.len(), held.len(), "each once: {got:?}");
    let got: HashSet<EventId> = got.into_iter().collect();
    assert_eq!(got, held.iter().map(|e| e.id).collect());
    assert!(!got.contains(&still_held));
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    // Unblocked, again without renotify: swept too.
    store.remove_rule(&block("b", "h")).await.expect("remove");
    let (_, got) = sweep_pass(store, QUIET, 100).await;
    assert_eq!(got, vec![still_held]);
}

/// Many held events in front of a few runnable ones, with a small page:
/// one pass still returns every runnable event, each once, and ends.
pub async fn held_events_do_not_starve_the_sweep(store: Arc<dyn Store>) {
    let store = store.as_ref();
    store.add_rule(&pause("p", "h")).await.expect("add");
    let held: Vec<NewEvent> = (0..40).map(|_| old_event("p", "h")).collect();
    emit_all(store, &held).await;
    let runnable: Vec<NewEvent> = (0..3).map(|_| old_event("t", "h")).collect();
    let runnable: HashSet<EventId> = emit_all(store, &runnable).await.into_iter().collect();
    let (pages, seen) = sweep_pass(store, QUIET, 2).await;
    assert!(pages.iter().all(|&n| n <= 2), "{pages:?}");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), runnable);
    let (pages, seen) = sweep_pass(store, QUIET, 2).await;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(pages.len() < 10);
}

// ---------------------------------------------------------------- leaders

/// Leader election: one holder per role at a time; the holder renews (and a
/// holder of the same name takes its own row at once, as a restarted
/// process does); roles are independent; resigning only gives up one's own
/// lease; another holder takes over only after the lease expired (or was
/// resigned), and a follower's answer says how long until it does.
pub async fn lead_and_resign_with_two_holders(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let role = "reconciler";
    let lead = |holder: &'static str, lease: Duration| async move {
        store.lead(role, holder, lease).await.expect("lead")
    };
    let a = lead("a", LEASE).await;
    assert_eq!(
        a,
        Leadership {
            leading: true,
            left: LEASE
        }
    );
    let b = lead("b", LEASE).await;
    assert!(!b.leading);
    assert!(
        b.left > Duration::ZERO && b.left <= LEASE,
        "a follower is told the holder's lease left: {b:?}"
    );
    assert!(lead("a", LEASE).await.leading, "renewal");
    // Another role is independent.
    assert!(
        store
            .lead("purger", "b", LEASE)
            .await
            .expect("lead")
            .leading
    );
    // Resigning someone else's lease does nothing.
    store.resign(role, "b").await.expect("resign");
    assert!(!lead("b", LEASE).await.leading);
    store.resign(role, "a").await.expect("resign");
    let start = Instant::now();
    assert!(lead("b", SHORT).await.leading, "free after the resignation");
    // a asks again when told the lease lapses: then it leads, and not before.
    let mut asked = 0;
    loop {
        let l = lead("a", LEASE).await;
        if l.leading {
            break;
        }
        asked += 1;
        assert!(l.left <= SHORT, "more left than b asked for: {l:?}");
        assert!(start.elapsed() < Duration::from_secs(5), "no takeover");
        // The store's clock counts whole milliseconds.
        tokio::time::sleep(l.left + Duration::from_millis(2)).await;
    }
    assert!(asked >= 1, "a took b's live lease at once");
    assert!(
        asked <= 3,
        "a's waits by `left` took {asked} asks to reach the lapse"
    );
    // Less 2 ms: the store's clock counts whole milliseconds.
    let waited = start.elapsed() + Duration::from_millis(2);
    assert!(waited >= SHORT, "a took over a live lease after {waited:?}");
    assert!(!lead("b", LEASE).await.leading);
    // The other role was not touched.
    assert!(
        !store
            .lead("purger", "a", LEASE)
            .await
            .expect("lead")
            .leading
    );
    store.resign(role, "a").await.expect("resign");
    store
        .resign(role, "a")
        .await
        .expect("resigning twice is fine");
}

// ---------------------------------------------------------------- retention

/// Purge deletes dead events that died before `dead_before` and done events
/// finished before `done_before`, at most `limit` per call, and never a
/// pending one.
pub async fn purge_deletes_old_dead_and_done_events_up_to_the_limit(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut dead = Vec::new();
    let mut done = Vec::new();
    for i in 0..5 {
        let id = emit_one(store, new_event("t", "h")).await;
        let finish = if i < 3 {
            dead.push(id);
            Finish::Bury { error: "x".into() }
        } else {
            done.push(id);
            Finish::Archive
        };
        assert!(settle_one(store, id, None, finish).await);
    }
    let pending = emit_one(store, old_event("t", "h")).await;
    let past = ago(Duration::from_secs(60));
    let future = from_now(Duration::from_secs(60));
    assert_eq!(store.purge(past, past, 100).await.expect("purge"), 0);
    assert_eq!(store.purge(future, past, 2).await.expect("purge"), 2);
    assert_eq!(store.purge(future, past, 2).await.expect("purge"), 1);
    assert_eq!(store.purge(future, past, 2).await.expect("purge"), 0);
    for id in &dead {
        assert_eq!(store.get(*id).await.expect("get"), None);
    }
    for id in &done {
        assert_eq!(get(store, *id).await.state, EventState::Done);
    }
    assert_eq!(store.purge(past, future, 0).await.expect("purge"), 0);
    assert_eq!(store.purge(past, future, 100).await.expect("purge"), 2);
    for id in &done {
        assert_eq!(store.get(*id).await.expect("get"), None);
    }
    assert_eq!(store.purge(future, future, 100).await.expect("purge"), 0);
    assert_eq!(get(store, pending).await.state, EventState::Pending);
}

/// Revive moves a dead event back to pending: attempt 0, due now, no lease,
/// the last error kept; it returns the notification to publish, and the
/// event can be claimed. Anything not dead: `None`.
pub async fn revive_moves_a_dead_event_back_to_pending(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let token = claim_one(store, id, LEASE).await.expect("claimed");
    // Not dead yet.
    assert_eq!(store.revive(id).await.expect("revive"), None);
    let error = "gave up".to_string();
    assert!(settle_one(store, id, Some(token), Finish::Bury { error }).await);
    let before = store_now(store).await;
    let s = store.revive(id).await.expect("revive").expect("revived");
    let after = store_now(store).await;
    assert_eq!(s.notification.event_id, id);
    assert_eq!(s.notification.tenant, "t");
    assert_eq!(s.delay, Duration::ZERO);
    let e = get(store, id).await;
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.attempt, 0);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("gave up"));
    assert!(e.run_at >= before && e.run_at <= after);
    assert_eq!(e.updated_at, e.run_at);
    // Pending now: not revived again.
    assert_eq!(store.revive(id).await.expect("revive"), None);
    assert!(claim_one(store, id, LEASE).await.is_some());
    assert_eq!(get(store, id).await.attempt, 1);
    assert_eq!(store.revive(EventId::new()).await.expect("revive"), None);
    let done = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    assert_eq!(store.revive(done).await.expect("revive"), None);
    assert_eq!(get(store, done).await.state, EventState::Done);
}

/// Delete removes an event that is not running (pending without a lease or
/// with an expired one, dead, done) and refuses one with a live lease.
pub async fn delete_refuses_only_a_running_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let idle = emit_one(store, new_event("t", "h")).await;
    assert!(store.delete(idle).await.expect("delete"));
    assert!(!store.delete(idle).await.expect("delete"));
    assert_eq!(store.get(idle).await.expect("get"), None);
    assert!(!store.delete(EventId::new()).await.expect("delete"));

    let running = emit_one(store, new_event("t", "h")).await;
    claim_one(store, running, LEASE).await.expect("claimed");
    let held = get(store, running).await;
    assert!(!store.delete(running).await.expect("delete"));
    assert_eq!(get(store, running).await, held);

    let expired = emit_one(store, new_event("t", "h")).await;
    claim_one(store, expired, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    assert!(store.delete(expired).await.expect("delete"));

    let dead = emit_one(store, new_event("t", "h")).await;
    bury(store, dead).await;
    assert!(store.delete(dead).await.expect("delete"));

    let done = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    assert!(store.delete(done).await.expect("delete"));
    assert_eq!(super::stored(store).await, 1, "only the running one");
}

/// List: id order, filtered by tenant, handler and state (alone or
/// together), paged with the keyset cursor, at most `limit`.
pub async fn list_filters_and_pages_by_id(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut all = Vec::new();
    for (tenant, handler) in [("a", "x"), ("a", "y"), ("b", "x")] {
        for _ in 0..4 {
            all.push((
                emit_one(store, new_event(tenant, handler)).await,
                tenant,
                handler,
            ));
        }
    }
    // Bury two of a/x, archive one of a/y.
    let ax: Vec<EventId> = all
        .iter()
        .filter(|(_, t, h)| *t == "a" && *h == "x")
        .map(|(id, _, _)| *id)
        .collect();
    for id in &ax[1..3] {
        bury(store, *id).await;
    }
    let ay: Vec<EventId> = all
        .iter()
        .filter(|(_, t, h)| *t == "a" && *h == "y")
        .map(|(id, _, _)| *id)
        .collect();
    assert!(settle_one(store, ay[2], None, Finish::Archive).await);
    let list = |filter: EventFilter, limit: usize| async move {
        let events = store.list(&filter, limit).await.expect("list");
        events.into_iter().map(|e| e.id).collect::<Vec<_>>()
    };

    let every = store
        .list(&EventFilter::default(), 100)
        .await
        .expect("list");
    let mut sorted: Vec<EventId> = all.iter().map(|(id, _, _)| *id).collect();
    sorted.sort();
    assert_eq!(every.iter().map(|e| e.id).collect::<Vec<_>>(), sorted);
    for e in &every {
        assert_eq!(e, &get(store, e.id).await);
    }

    // Paging with a cursor.
    let mut paged = Vec::new();
    let mut filter = EventFilter::default();
    loop {
        let page = list(filter.clone(), 5).await;
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 5);
        filter.after = page.last().copied();
        paged.extend(page);
    }
    assert_eq!(paged, sorted);

    // One handler, all states merged in id order, paged.
    let one = EventFilter {
        tenant: Some("a".into()),
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(one.clone(), 100).await, ax);
    assert_eq!(list(one.clone(), 3).await, ax[..3]);
    let rest = EventFilter {
        after: Some(ax[1]),
        ..one.clone()
    };
    assert_eq!(list(rest, 100).await, ax[2..]);
    let dead_only = EventFilter {
        state: Some(EventState::Dead),
        ..one.clone()
    };
    assert_eq!(list(dead_only.clone(), 100).await, ax[1..3]);
    let dead_rest = EventFilter {
        after: Some(ax[1]),
        ..dead_only
    };
    assert_eq!(list(dead_rest, 100).await, ax[2..3]);
    let pending_only = EventFilter {
        state: Some(EventState::Pending),
        ..one.clone()
    };
    assert_eq!(list(pending_only, 100).await, vec![ax[0], ax[3]]);

    // Tenant only, handler only, state only.
    let tenant_b = EventFilter {
        tenant: Some("b".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(tenant_b, 100).await.len(), 4);
    let handler_x = EventFilter {
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(handler_x, 100).await.len(), 8);
    let dead = EventFilter {
        state: Some(EventState::Dead),
        ..EventFilter::default()
    };
    assert_eq!(list(dead.clone(), 100).await, ax[1..3]);
    assert!(list(dead, 0).await.is_empty());
    let done = EventFilter {
        state: Some(EventState::Done),
        tenant: Some("a".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(done, 100).await, vec![ay[2]]);
    let nobody = EventFilter {
        tenant: Some("nobody".into()),
        ..EventFilter::default()
    };
    assert!(list(nobody, 100).await.is_empty());
}

fn counts_row(tenant: &str, handler: &str, six: [u64; 6]) -> HandlerCounts {
    let [waiting, running, delayed, held, dead, done] = six;
    HandlerCounts {
        tenant: tenant.into(),
        handler: handler.into(),
        waiting,
        running,
        delayed,
        held,
        dead,
        done,
        estimated: false,
    }
}

/// Counts per `(tenant, handler)` tell each state apart: waiting (due, no
/// lease, and a lapsed lease), running (a live lease), delayed (`run_at`
/// ahead), held (paused or blocked, whatever their `run_at`), dead and
/// done; ordered by tenant and handler; filtered by tenant and handler;
/// nothing for an empty store.
pub async fn counts_tell_waiting_running_delayed_held_dead_and_done_apart(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store
        .counts(&CountsQuery::all())
        .await
        .expect("counts")
        .is_empty());
    // (a, h): 2 waiting, 1 waiting after its lease lapsed, 2 running,
    // 1 delayed, 1 dead, 1 done.
    let w = emit_all(store, &[new_event("a", "h"), new_event("a", "h")]).await;
    let lapsed = emit_one(store, new_event("a", "h")).await;
    let running = emit_all(store, &[new_event("a", "h"), new_event("a", "h")]).await;
    emit_one(
        store,
        NewEvent {
            run_at: from_now(Duration::from_secs(3600)),
            ..new_event("a", "h")
        },
    )
    .await;
    let d = emit_one(store, new_event("a", "h")).await;
    let k = emit_one(store, new_event("a", "h")).await;
    assert!(claim_one(store, lapsed, Duration::from_millis(1))
        .await
        .is_some());
    for id in &running {
        assert!(claim_one(store, *id, Duration::from_secs(60))
            .await
            .is_some());
    }
    bury(store, d).await;
    assert!(settle_one(store, k, None, Finish::Archive).await);
    // (a, p) paused: a due one and a delayed one are both held.
    emit_one(store, new_event("a", "p")).await;
    emit_one(
        store,
        NewEvent {
            run_at: from_now(Duration::from_secs(3600)),
            ..new_event("a", "p")
        },
    )
    .await;
    store.add_rule(&pause("a", "p")).await.expect("pause");
    // (b, h) blocked with a dead one; (b, x) one waiting.
    let bd = emit_one(store, new_event("b", "h")).await;
    bury(store, bd).await;
    emit_one(store, new_event("b", "h")).await;
    store.add_rule(&block("b", "h")).await.expect("block");
    emit_one(store, new_event("b", "x")).await;
    let _ = w;
    // Let the 1 ms lease lapse by the store's clock.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let all = store.counts(&CountsQuery::all()).await.expect("counts");
    assert_eq!(
        all,
        vec![
            counts_row("a", "h", [3, 2, 1, 0, 1, 1]),
            counts_row("a", "p", [0, 0, 0, 2, 0, 0]),
            counts_row("b", "h", [0, 0, 0, 1, 1, 0]),
            counts_row("b", "x", [1, 0, 0, 0, 0, 0]),
        ]
    );
    assert_eq!(all.iter().map(HandlerCounts::total).sum::<u64>(), 13);
    let b = store
        .counts(&CountsQuery::all().tenant("b"))
        .await
        .expect("counts");
    assert_eq!(b, all[2..].to_vec());
    let h = store
        .counts(&CountsQuery::all().handler("h"))
        .await
        .expect("counts");
    assert_eq!(h, vec![all[0].clone(), all[2].clone()]);
    let one = store
        .counts(&CountsQuery::all().tenant("a").handler("p"))
        .await
        .expect("counts");
    assert_eq!(one, vec![all[1].clone()]);
    assert!(store
        .counts(&CountsQuery::all().tenant("zz"))
        .await
        .expect("counts")
        .is_empty());
}

/// Up to `exact_up_to` events per state, counts are exact; beyond it, the
/// row is `estimated`, its pending total more than was counted, and the
/// split still adds up to it.
pub async fn counts_beyond_the_cap_are_estimated_and_add_up(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let events: Vec<NewEvent> = (0..30).map(|_| new_event("a", "h")).collect();
    let ids = emit_all(store, &events).await;
    for id in &ids[..3] {
        assert!(claim_one(store, *id, Duration::from_secs(60))
            .await
            .is_some());
    }
    bury(store, ids[29]).await;
    let exact = store
        .counts(&CountsQuery::all().exact_up_to(30))
        .await
        .expect("counts");
    assert_eq!(exact, vec![counts_row("a", "h", [26, 3, 0, 0, 1, 0])]);
    let capped = store
        .counts(&CountsQuery::all().exact_up_to(10))
        .await
        .expect("counts");
    assert_eq!(capped.len(), 1);
    let r = &capped[0];
    assert!(r.estimated, "{r:?}");
    assert!(r.pending() > 10, "more pending than the cap: {r:?}");
    assert_eq!(
        r.waiting + r.running + r.delayed,
        r.pending(),
        "the split adds up: {r:?}"
    );
    assert_eq!((r.held, r.dead, r.done), (0, 1, 0), "under the cap, exact");
    // Totals only: exact, not split (every pending event counts as waiting).
    let totals = store.counts(&CountsQuery::totals()).await.expect("counts");
    assert_eq!(
        totals,
        vec![HandlerCounts {
            estimated: true,
            ..counts_row("a", "h", [29, 0, 0, 0, 1, 0])
        }]
    );
}

/// Counts by tenant, handler and state, ordered by tenant, handler and
/// state (pending, dead, done); nothing for an empty store.
pub async fn counts_by_tenant_handler_and_state(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let per_state = |rows: Vec<HandlerCounts>| -> Vec<(String, String, EventState, u64)> {
        let mut out = Vec::new();
        for r in rows {
            for (s, n) in [
                (EventState::Pending, r.pending()),
                (EventState::Dead, r.dead),
                (EventState::Done, r.done),
            ] {
                if n > 0 {
                    out.push((r.tenant.clone(), r.handler.clone(), s, n));
                }
            }
        }
        out
    };
    assert!(store
        .counts(&CountsQuery::all())
        .await
        .expect("counts")
        .is_empty());
    for _ in 0..3 {
        emit_one(store, new_event("a", "x")).await;
    }
    let d = emit_one(store, new_event("a", "x")).await;
    let k = emit_one(store, new_event("a", "x")).await;
    emit_one(store, new_event("b", "y")).await;
    bury(store, d).await;
    assert!(settle_one(store, k, None, Finish::Archive).await);
    let got = per_state(store.counts(&CountsQuery::all()).await.expect("counts"));
    assert_eq!(
        got,
        vec![
            ("a".into(), "x".into(), EventState::Pending, 3),
            ("a".into(), "x".into(), EventState::Dead, 1),
            ("a".into(), "x".into(), EventState::Done, 1),
            ("b".into(), "y".into(), EventState::Pending, 1),
        ]
    );
}
