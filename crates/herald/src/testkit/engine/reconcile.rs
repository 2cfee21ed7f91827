//! Engine scenarios for the reconciler: events stored without a notification still run.

use std::sync::Arc;

use super::{new_event, Rig, H, SOON};
use crate::model::NewEvent;
use crate::store::Store;
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
/// stored event, and each runs once.
pub async fn every_stored_event_runs_after_a_restart(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let events: Vec<NewEvent> = (0..2500).map(|_| new_event(H)).collect();
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
