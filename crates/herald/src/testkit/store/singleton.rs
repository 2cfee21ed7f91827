//! Singleton keys: at most one waiting event per key, the one waiting kept
//! or replaced in the emit's own write.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::Store;
use crate::model::{Keep, Singleton};

fn single(tenant: &str, key: &str, keep: Keep) -> NewEvent {
    NewEvent {
        singleton: Some(Singleton {
            key: key.into(),
            keep,
        }),
        ..new_event(tenant, "h")
    }
}

/// Keep oldest: a second emit of a key whose event waits returns it and
/// stores nothing; another key, or another tenant, is its own; once the
/// first runs (a live lease), the next emit stores a new one, which waits
/// beside the running one.
pub async fn a_singleton_keeps_the_waiting_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let first = emit_one(store, single("t", "k", Keep::Oldest)).await;
    let again = store
        .emit(&[single("t", "k", Keep::Oldest)])
        .await
        .expect("emit");
    assert_eq!(
        again,
        vec![Emitted::Existing(first)],
        "the waiting one is kept"
    );
    let other_key = emit_one(store, single("t", "k2", Keep::Oldest)).await;
    let other_tenant = emit_one(store, single("u", "k", Keep::Oldest)).await;
    assert_ne!(other_key, other_tenant);
    assert!(claim_one(store, first, LEASE).await.is_some());
    let next = emit_one(store, single("t", "k", Keep::Oldest)).await;
    assert_ne!(next, first, "a running event does not count");
    // Two of one key in one batch (group commit puts emits together): the
    // second finds the first.
    let batch = store
        .emit(&[
            single("t", "b", Keep::Oldest),
            single("t", "b", Keep::Oldest),
        ])
        .await
        .expect("emit");
    assert_eq!(batch[1], Emitted::Existing(batch[0].id()));
}

/// Keep newest: each emit replaces the waiting event of its key (deleted,
/// its payload gone with it) and stores itself; a running one stays. With
/// a delay, a burst of emits leaves one event, due a delay after the last.
pub async fn a_singleton_replaces_the_waiting_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let first = emit_one(store, single("t", "k", Keep::Newest)).await;
    let second = emit_one(store, single("t", "k", Keep::Newest)).await;
    assert_ne!(first, second);
    assert!(store.get(first).await.expect("get").is_none(), "replaced");
    assert!(claim_one(store, second, LEASE).await.is_some());
    let third = emit_one(store, single("t", "k", Keep::Newest)).await;
    assert!(
        store.get(second).await.expect("get").is_some(),
        "a running event stays"
    );
    assert!(store.get(third).await.expect("get").is_some());
    // Debounce: each emit pushes the run a second past itself.
    let mut last = None;
    for _ in 0..3 {
        let e = NewEvent {
            run_at: from_now(Duration::from_secs(1)),
            ..single("t", "debounced", Keep::Newest)
        };
        last = Some(emit_one(store, e).await);
        tick().await;
    }
    let last = last.expect("emitted");
    let page = store
        .list(
            &crate::backend::EventFilter {
                tenant: Some("t".into()),
                ..Default::default()
            },
            100,
        )
        .await
        .expect("list");
    let debounced: Vec<EventId> = page
        .iter()
        .filter(|e| e.id != second && e.id != third && e.id != first)
        .map(|e| e.id)
        .collect();
    assert_eq!(debounced, vec![last], "one event left of the burst");
}
