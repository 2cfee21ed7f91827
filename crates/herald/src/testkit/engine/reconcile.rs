//! Engine scenarios for the reconciler: events stored without a notification still run.

use std::sync::Arc;
use std::time::Duration;

use super::{new_event, Rig, H, SOON, T};
use crate::backend::Store;
use crate::client::{EmitOptions, EmitRequest};
use crate::handler::Context;
use crate::model::{Millis, NewEvent, RunAt};
use crate::testkit::eventually;

/// An event stored without a notification (a crash between insert and
/// publish) is found by the reconciler and run.
pub async fn lost_notification_is_run_by_the_reconciler(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    // After the start-up sweep, so this is the steady-state path.
    rig.swept(&w).await;
    let e = new_event(H);
    rig.store
        .emit(std::slice::from_ref(&e))
        .await
        .expect("insert");
    if let Some(q) = &rig.memory {
        assert!(q.is_empty(), "no notification was published");
    }
    rig.runs_once(e.id).await;
    assert!(w.stats().reconciled >= 1);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// The in-process queue starts empty: the first sweep notifies every due
/// event stored (and notified) before the queue began, by the process
/// before this one, and each runs once.
pub async fn every_stored_event_runs_after_a_restart(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let before = Millis::now().minus(Duration::from_secs(1));
    let events: Vec<NewEvent> = (0..2500)
        .map(|_| NewEvent {
            run_at: RunAt::At(before),
            ..new_event(H)
        })
        .collect();
    rig.store.emit(&events).await.expect("insert");
    let w = rig.worker();
    let ledger = rig.ledger.clone();
    eventually("all 2500 run", SOON, || {
        let n = ledger.distinct();
        async move { n == 2500 }
    })
    .await;
    assert_eq!(rig.ledger.total(), 2500);
    assert!(w.stats().reconciled >= 2500);
    w.shutdown(SOON).await;
    assert_eq!(rig.stored().await, 0);
}

/// What this process notified before the worker started is in the queue:
/// the first sweep leaves it alone, and each event runs once. For the
/// in-process queue, that sweep notifies only what was notified before the
/// queue began; for a durable one, it is an ordinary sweep (what was
/// notified within `sweep_quiet` is left alone).
pub async fn the_first_sweep_leaves_what_the_queue_holds(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    // Past the in-process queue's first-sweep slack for clocks (100 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let requests = (0..500)
        .map(|i| EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: format!(r#"{{"i":{i}}}"#),
            options: EmitOptions::default(),
        })
        .collect();
    rig.client.emit_batch(requests).await.expect("emit");
    // Slow runs, so that most events are still waiting, unleased, when the
    // first sweep reads them.
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler(H, move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ledger.record(cx.event_id, cx.attempt)
            }
        })
        .start();
    rig.swept(&w).await;
    assert_eq!(
        w.stats().reconciled,
        0,
        "the first sweep notified events the queue held"
    );
    let ledger = rig.ledger.clone();
    eventually("all 500 run", SOON, || {
        let n = ledger.distinct();
        async move { n == 500 }
    })
    .await;
    assert_eq!(rig.ledger.total(), 500);
    w.shutdown(SOON).await;
    assert_eq!(rig.stored().await, 0);
}
