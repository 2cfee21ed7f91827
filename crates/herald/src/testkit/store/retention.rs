//! Store scenarios for what an operator does to stored events: purge, revive and delete.

use std::sync::Arc;
use std::time::Duration;

use super::{
    bury, claim_one, emit_one, get, new_event, old_event, settle_one, store_now, tick, LEASE,
    PAST_SHORT, SHORT,
};
use crate::backend::{Finish, Store};
use crate::model::{Emitted, EventId, EventState, NewEvent};
use crate::testkit::stored;

/// Purge deletes dead events that died more than `dead_retention` ago and
/// done events finished more than `done_retention` ago, by the store's
/// clock, at most `limit` per call, and never a pending one.
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
    // Retentions, counted back from the store's clock: a minute keeps
    // them all, zero none (once the store's clock moved past their end).
    let (past, future) = (Duration::from_secs(60), Duration::ZERO);
    tick().await;
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

/// An emit retried after its event ran and was deleted (a client that
/// timed out and tried again) returns the original event and stores
/// nothing, as long as its key is within the window: a purge of keys older
/// than the window leaves it. The first purge that covers it sees its event
/// gone and keeps it one more window, which is at least the window after
/// the event finished; the next one deletes it, and the next emit with the
/// key creates a new event.
pub async fn a_retried_emit_after_its_event_finished_returns_it_within_the_window(
    store: Arc<dyn Store>,
) {
    let store = store.as_ref();
    let keyed = || NewEvent {
        idempotency_key: Some("order-17".into()),
        ..new_event("t", "h")
    };
    let first = keyed();
    let id = emit_one(store, first.clone()).await;
    let token = claim_one(store, id, LEASE).await.expect("claimed");
    assert!(settle_one(store, id, Some(token), Finish::Delete).await);
    assert_eq!(store.get(id).await.expect("get"), None, "ran and deleted");
    let retry = keyed();
    assert_eq!(
        store
            .emit(std::slice::from_ref(&retry))
            .await
            .expect("emit"),
        vec![Emitted::Existing(id)]
    );
    assert_eq!(stored(store).await, 0, "nothing new stored");
    // A window of a minute, by the store's clock: the key is a second old.
    let window = Duration::from_secs(60);
    assert_eq!(store.purge_keys(window, 100).await.expect("purge_keys"), 0);
    assert_eq!(
        store.emit(&[keyed()]).await.expect("emit"),
        vec![Emitted::Existing(id)]
    );
    // The window has passed: the event is seen gone, the key kept a window
    // more (its time reset to now).
    let window = Duration::from_millis(500);
    let past_window = Duration::from_millis(700);
    tokio::time::sleep(past_window).await;
    assert_eq!(store.purge_keys(window, 100).await.expect("purge_keys"), 0);
    assert_eq!(
        store.emit(&[keyed()]).await.expect("emit"),
        vec![Emitted::Existing(id)]
    );
    assert_eq!(store.purge_keys(window, 100).await.expect("purge_keys"), 0);
    // A window after it was seen gone.
    tokio::time::sleep(past_window).await;
    assert_eq!(store.purge_keys(window, 100).await.expect("purge_keys"), 1);
    let again = keyed();
    assert_eq!(
        store
            .emit(std::slice::from_ref(&again))
            .await
            .expect("emit"),
        vec![Emitted::Created(again.id)]
    );
}

/// A purge of keys handles at most `limit` keys, oldest first: the key of
/// a finished event is marked gone the first time and goes the next, a
/// live event's key is kept (and its time reset, so that the next purge of
/// the same age passes it by). Keys stored within the window are left
/// alone.
pub async fn purge_keys_goes_oldest_first_up_to_the_limit_and_keeps_live_events_keys(
    store: Arc<dyn Store>,
) {
    let store = store.as_ref();
    let keyed = |key: &str| NewEvent {
        idempotency_key: Some(key.into()),
        ..new_event("t", "h")
    };
    let mut finished = Vec::new();
    for i in 0..5 {
        let id = emit_one(store, keyed(&format!("k{i}"))).await;
        assert!(store.delete(id).await.expect("delete"));
        finished.push(id);
    }
    // Stored later, by the store's clock, than the finished ones' keys.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let live = emit_one(store, keyed("live")).await;
    // Windows, counted back from the store's clock: a minute covers no key,
    // zero every key stored before the store's now.
    let (past, future) = (Duration::from_secs(60), Duration::ZERO);
    assert_eq!(store.purge_keys(past, 100).await.expect("purge_keys"), 0);
    assert_eq!(store.purge_keys(future, 0).await.expect("purge_keys"), 0);
    // Seen gone, two at a time, oldest first (each pass a few ms apart, so
    // that the times it resets keep that order); then the live one.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(store.purge_keys(future, 2).await.expect("purge_keys"), 0);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(store.purge_keys(future, 2).await.expect("purge_keys"), 2);
    assert_eq!(store.purge_keys(future, 2).await.expect("purge_keys"), 2);
    // The last finished one, and the live one (kept).
    assert_eq!(store.purge_keys(future, 2).await.expect("purge_keys"), 1);
    // Reset to now: not covered by a window of a second.
    assert_eq!(
        store
            .purge_keys(Duration::from_secs(1), 100)
            .await
            .expect("purge_keys"),
        0
    );
    assert_eq!(
        store.emit(&[keyed("live")]).await.expect("emit"),
        vec![Emitted::Existing(live)]
    );
    for (i, old) in finished.iter().enumerate() {
        let again = keyed(&format!("k{i}"));
        assert_eq!(
            store
                .emit(std::slice::from_ref(&again))
                .await
                .expect("emit"),
            vec![Emitted::Created(again.id)],
            "the key of {old} was purged"
        );
    }
}

/// The purge of dead and done events does not touch idempotency keys: a
/// key outlives its event's purge, until [`Reconciliation::purge_keys`].
pub async fn purge_leaves_idempotency_keys_alone(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let keyed = || NewEvent {
        idempotency_key: Some("k".into()),
        ..new_event("t", "h")
    };
    let id = emit_one(store, keyed()).await;
    assert!(settle_one(store, id, None, Finish::Archive).await);
    tick().await;
    let none = Duration::ZERO;
    assert_eq!(store.purge(none, none, 100).await.expect("purge"), 1);
    assert_eq!(store.get(id).await.expect("get"), None);
    assert_eq!(
        store.emit(&[keyed()]).await.expect("emit"),
        vec![Emitted::Existing(id)]
    );
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
    assert_eq!(s.event_id, id);
    assert_eq!(s.tenant, "t");
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
    assert_eq!(stored(store).await, 1, "only the running one");
}
