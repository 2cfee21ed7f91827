//! Store scenarios for emit: fields kept as given, ids and idempotency keys deduplicated.

use std::sync::Arc;
use std::time::Duration;

use super::{claim_one, emit_one, get, new_event, settle_one, store_now, tick, LEASE};
use crate::backend::{Finish, Store, StoreError};
use crate::model::{Emitted, EventId, EventState, Millis, NewEvent, RunAt};
use crate::testkit::stored;

/// Emit stores every field as given (the payload byte for byte, an exact
/// `run_at`), pending, attempt 0, no lease, created and updated at the
/// store's now.
pub async fn emit_stores_the_event_as_given(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("acme", "send_email");
    e.payload = "{ \"n\": 1,  \"text\": \"é ✓\", \"nested\": {\"b\": [1, 2.50]} }".into();
    let run_at = store_now(store).await.plus(Duration::from_secs(5));
    e.run_at = RunAt::At(run_at);
    e.max_attempts = 7;
    e.idempotency_key = Some("k1".into());
    e.concurrency_key = Some("account-7".into());
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
    assert_eq!(got.run_at, run_at);
    assert_eq!(got.attempt, 0);
    assert_eq!(got.max_attempts, 7);
    assert_eq!(got.lease, None);
    assert_eq!(got.last_error, None);
    assert_eq!(got.idempotency_key.as_deref(), Some("k1"));
    assert_eq!(got.concurrency_key.as_deref(), Some("account-7"));
    assert!(got.created_at >= before && got.created_at <= after);
    assert_eq!(got.updated_at, got.created_at);
    assert_eq!(store.get(EventId::new()).await.expect("get"), None);
}

/// An emit's delay counts from the store's clock, read by the statement
/// that stores the event, not from the emitting process's: `run_at` is
/// the store's now plus the delay, for immediate and delayed events, alone
/// or in a batch with an exact time. (The PostgreSQL suite also checks it
/// against a store clock that differs from the process's: a transaction's
/// `now()`.)
pub async fn a_delay_counts_from_the_store_clock(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let delays = [
        Duration::ZERO,
        Duration::from_secs(90),
        Duration::from_millis(1500),
    ];
    let mut events: Vec<NewEvent> = delays
        .iter()
        .map(|&d| NewEvent {
            run_at: RunAt::After(d),
            ..new_event("t", "h")
        })
        .collect();
    let exact = store_now(store).await.plus(Duration::from_secs(7));
    events.push(NewEvent {
        run_at: RunAt::At(exact),
        ..new_event("t", "h")
    });
    let before = store_now(store).await;
    for e in &events {
        emit_one(store, e.clone()).await;
    }
    let batch: Vec<NewEvent> = events
        .iter()
        .map(|e| NewEvent {
            id: EventId::new(),
            ..e.clone()
        })
        .collect();
    assert_eq!(store.emit(&batch).await.expect("emit").len(), batch.len());
    let after = store_now(store).await;
    for e in events.iter().chain(&batch) {
        let got = get(store, e.id).await;
        match e.run_at {
            RunAt::After(d) => assert!(
                got.run_at >= before.plus(d) && got.run_at <= after.plus(d),
                "run_at {:?} of a delay of {d:?} is not the store's now ({before:?} to {after:?}) plus it",
                got.run_at
            ),
            RunAt::At(at) => assert_eq!(got.run_at, at),
        }
    }
    // A delay beyond any date saturates: due never, not in the past.
    let never = NewEvent {
        run_at: RunAt::After(Duration::MAX),
        ..new_event("t", "h")
    };
    emit_one(store, never.clone()).await;
    assert_eq!(get(store, never.id).await.run_at, Millis(i64::MAX));
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
    assert_eq!(stored(store).await, 2);
}

/// One event per `(tenant, handler, key)`: existing within a batch, in a
/// later batch and while running; independent per tenant and handler;
/// still named by its key once it went dead, was deleted or is done, until
/// [`Reconciliation::purge_keys`] removes the key (ADR 0013); and revive refuses to
/// make a second live event with the key.
pub async fn idempotency_key_names_one_event_until_purged(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let keyed = |key: &str| NewEvent {
        idempotency_key: Some(key.into()),
        topic: None,
        ..new_event("t", "h")
    };
    let emit_k = || async {
        let e = keyed("k");
        let out = store.emit(std::slice::from_ref(&e)).await.expect("emit");
        (e, out)
    };
    // Every key stored so far, whatever its time, looked at once.
    // A key whose event is gone goes at its second purge (the first
    // marks it, keeping it a window more).
    let purge_all = || async {
        tick().await;
        let marked = store
            .purge_keys(Duration::ZERO, 100)
            .await
            .expect("purge_keys");
        assert_eq!(marked, 0, "the first purge after the end keeps the key");
        tick().await;
        store
            .purge_keys(Duration::ZERO, 100)
            .await
            .expect("purge_keys")
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
    assert_eq!(emit_k().await.1, vec![Emitted::Existing(a.id)]);
    // While running.
    let token = claim_one(store, a.id, LEASE).await.expect("claimed");
    assert_eq!(emit_k().await.1, vec![Emitted::Existing(a.id)]);
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
    assert_eq!(stored(store).await, 3);
    // Once it went dead, the key still names it.
    let error = "boom".to_string();
    assert!(settle_one(store, a.id, Some(token), Finish::Bury { error }).await);
    assert_eq!(emit_k().await.1, vec![Emitted::Existing(a.id)]);
    assert_eq!(stored(store).await, 3, "nothing new stored");
    // Purged (its event is no longer live), the key is free; the live
    // events' keys are kept.
    assert_eq!(purge_all().await, 1);
    let (c, out) = emit_k().await;
    assert_eq!(out, vec![Emitted::Created(c.id)]);
    for e in [&other_handler, &other_tenant] {
        assert_eq!(
            store.emit(std::slice::from_ref(e)).await.expect("emit"),
            vec![Emitted::Existing(e.id)],
            "a live event's key is kept by the purge"
        );
    }
    // Reviving the dead one now would make two live events with one key.
    match store.revive(a.id).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains(&c.id.to_string()), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(get(store, a.id).await.state, EventState::Dead, "unchanged");
    // Once deleted, the key still names it, until purged.
    assert!(store.delete(c.id).await.expect("delete"));
    assert_eq!(emit_k().await.1, vec![Emitted::Existing(c.id)]);
    assert_eq!(purge_all().await, 1);
    let (d, out) = emit_k().await;
    assert_eq!(out, vec![Emitted::Created(d.id)]);
    // And once done (archived).
    assert!(settle_one(store, d.id, None, Finish::Archive).await);
    assert_eq!(emit_k().await.1, vec![Emitted::Existing(d.id)]);
    assert_eq!(purge_all().await, 1);
    let (e, out) = emit_k().await;
    assert_eq!(out, vec![Emitted::Created(e.id)]);
}
