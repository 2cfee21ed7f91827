//! Engine scenarios for shutdown: the grace period, cancelling past it, and the second signal.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, SOON};
use crate::backend::Store;
use crate::client::EmitOptions;
use crate::handler::Context;
use crate::testkit::eventually;

/// Handlers that finish within the grace period finish; nothing is cancelled.
pub async fn shutdown_within_grace_lets_handlers_finish(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (s, f) = (started.clone(), finished.clone());
    let w = rig
        .builder()
        .handler("slow", move |_: serde_json::Value, _cx: Context| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                f.fetch_add(1, Ordering::SeqCst);
            }
        })
        .start();
    for _ in 0..5 {
        rig.emit_to("slow", EmitOptions::default()).await;
    }
    eventually("all five start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 5 }
    })
    .await;
    let report = w.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.in_flight, 5);
    assert_eq!(report.cancelled, 0);
    assert_eq!(finished.load(Ordering::SeqCst), 5);
    assert_eq!(
        rig.stored().await,
        0,
        "finished runs were settled before shutdown returned"
    );
}

/// Past the grace period, running handlers are cancelled, their events
/// released with the attempt given back, and the next worker runs them at once.
pub async fn shutdown_past_grace_snoozes_and_the_next_worker_runs_them(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let first = rig.waits_for_cancel(started.clone(), |_| {});
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(rig.emit_to("slow", EmitOptions::default()).await);
    }
    eventually("all three start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 3 }
    })
    .await;
    let report = first.shutdown(Duration::from_millis(200)).await;
    assert_eq!(report.cancelled, 3);
    rig.released_then_run_once(&ids).await;
}

/// A second signal during a long grace period cancels the running handlers
/// at once; they are released as in any shutdown cancel.
pub async fn second_signal_cancels_at_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let w = rig.waits_for_cancel(started.clone(), |_| {});
    let a = rig.emit_to("slow", EmitOptions::default()).await;
    let b = rig.emit_to("slow", EmitOptions::default()).await;
    eventually("both start", SOON, || {
        let n = started.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let second_signal = w.shutdown_handle();
    let shutdown = tokio::spawn(w.shutdown(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!shutdown.is_finished(), "the grace period is running");
    second_signal.cancel_now();
    let report = tokio::time::timeout(SOON, shutdown)
        .await
        .expect("shutdown returns at once after the second signal")
        .expect("shutdown task");
    assert_eq!((report.in_flight, report.cancelled), (2, 2));
    for id in [a, b] {
        let e = rig.store.get(id).await.unwrap().expect("kept");
        assert_eq!(
            (e.attempt, e.lease),
            (0, None),
            "released, attempt given back"
        );
    }
}
