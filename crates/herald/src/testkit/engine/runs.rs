//! Engine scenarios for plain runs: one event, several in sequence or at once, a delayed one.

use std::sync::Arc;
use std::time::Duration;

use super::{Rig, H, SOON, T};
use crate::client::{EmitOptions, EmitRequest};
use crate::store::Store;

/// One event succeeds: it runs once and is deleted.
pub async fn one_event_succeeds(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    let id = rig.emit().await;
    rig.runs_once(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1]);
    assert_eq!(rig.stored().await, 0);
    let s = w.stats();
    assert_eq!((s.claimed, s.done), (1, 1));
    w.shutdown(SOON).await;
}

/// Three events, each emitted after the previous one ran.
pub async fn three_in_sequence(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    for i in 1..=3 {
        let id = rig.emit().await;
        rig.runs_once(id).await;
        assert_eq!(rig.ledger.total(), i);
        assert_eq!(rig.stored().await, 0);
    }
    w.shutdown(SOON).await;
}

/// Three events emitted at once.
pub async fn three_at_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let batch = (0..3)
        .map(|_| EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "{}".into(),
            options: EmitOptions::default(),
        })
        .collect();
    let ids = rig.client.emit_batch(batch).await.expect("emit");
    assert_eq!(rig.stored().await, 3);
    let w = rig.worker();
    for e in &ids {
        rig.runs_once(e.id()).await;
    }
    assert_eq!(rig.ledger.total(), 3);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// A delayed event does not run before its time.
pub async fn delayed_event_waits(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    let start = std::time::Instant::now();
    let id = rig
        .emit_to(H, EmitOptions::default().delay(Duration::from_millis(800)))
        .await;
    rig.runs_once(id).await;
    assert!(start.elapsed() >= Duration::from_millis(800));
    w.shutdown(SOON).await;
}
