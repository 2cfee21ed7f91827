//! Engine scenarios for leases: expired, live, lost while running, given up
//! before it can lapse when renewals hang, a late result fenced out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{Rig, H, QUIET, SOON, T};
use crate::backend::Store;
use crate::client::EmitOptions;
use crate::handler::{Context, HandlerError};
use crate::model::{LeaseToken, Millis};
use crate::testkit::eventually;
use crate::testkit::faults::Faulty;

/// An event whose lease expired (its worker died) is claimed and run.
pub async fn expired_lease_is_claimed_and_run(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let id = rig.emit().await;
    let dead_worker = LeaseToken::new();
    let got = rig
        .store
        .claim(
            &crate::testkit::leases(&[id], dead_worker),
            &[H.to_string()],
            &[T.to_string()],
            Duration::ZERO,
        )
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    let w = rig.worker();
    rig.runs_once(id).await;
    // The dead worker's claim counted: this is the second attempt.
    assert_eq!(rig.ledger.attempts_of(id), vec![2]);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// An event under a live lease is not run, and stays stored.
pub async fn live_lease_is_not_run_and_kept(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let id = rig.emit().await;
    let holder = LeaseToken::new();
    rig.store
        .claim(
            &crate::testkit::leases(&[id], holder),
            &[H.to_string()],
            &[T.to_string()],
            Duration::from_secs(3600),
        )
        .await
        .expect("claim");
    let w = rig.worker();
    eventually("the notification is requeued", SOON, || {
        let n = w.stats().requeued;
        async move { n >= 1 }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(rig.ledger.total(), 0);
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!(e.lease.map(|l| l.token), Some(holder));
    assert_eq!(e.attempt, 1);
    assert_eq!(rig.stored().await, 1);
    w.shutdown(SOON).await;
}

/// When a renewal finds the lease gone, the handler is cancelled and nothing
/// is written about the event.
pub async fn lost_lease_cancels_the_handler(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(Notify::new());
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (s, c) = (started.clone(), cancelled.clone());
    let w = rig
        .builder()
        .handler("stuck", move |_: serde_json::Value, cx: Context| {
            let (s, c) = (s.clone(), c.clone());
            async move {
                // Counts when the runtime drops the handler's future.
                let _guard = CountOnDrop(c);
                s.notify_one();
                cx.cancelled().await;
                Err::<(), _>(HandlerError::retry("cancelled"))
            }
        })
        .start();
    rig.swept(&w).await;
    let id = rig.emit_to("stuck", EmitOptions::default()).await;
    started.notified().await;
    let thief = rig.steal_lease(id, Duration::from_secs(3600)).await;
    eventually("the handler is cancelled", SOON, || {
        let n = cancelled.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    eventually("the loss is counted", SOON, || {
        let n = w.stats().lease_lost;
        async move { n == 1 }
    })
    .await;
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!(
        e.lease.map(|l| l.token),
        Some(thief),
        "the worker wrote nothing"
    );
    assert_eq!(e.last_error, None);
    assert_eq!(w.stats().retried, 0);
    w.shutdown(SOON).await;
}

/// When renewals hang (a database that accepts the call and never
/// answers), the run is cancelled by the worker's own clock before its
/// lease can lapse in the store, and nothing is written about the event.
pub async fn a_run_stops_before_its_lease_can_lapse_when_renewals_hang(store: Arc<dyn Store>) {
    let lease = Duration::from_millis(1500);
    let hanging: Arc<dyn Store> = Arc::new(Faulty::around(store.clone()).hanging_renewals());
    // The queue must not redeliver meanwhile: the extension stays on time.
    let rig = Rig::with_ack_wait(hanging, Duration::from_secs(60)).await;
    let started = Arc::new(Notify::new());
    let stopped = Arc::new(std::sync::Mutex::new(None));
    let (s, st) = (started.clone(), stopped.clone());
    let w = rig
        .builder()
        .lease(lease)
        .handler("long", move |_: serde_json::Value, cx: Context| {
            let (s, st) = (s.clone(), st.clone());
            async move {
                let began = std::time::Instant::now();
                let _on_drop = OnDrop(Some(move || {
                    *st.lock().unwrap() = Some((began.elapsed(), Millis::now()));
                }));
                s.notify_one();
                cx.cancelled().await;
                std::future::pending::<()>().await;
            }
        })
        .start();
    rig.swept(&w).await;
    let id = rig.emit_to("long", EmitOptions::default()).await;
    started.notified().await;
    eventually("the handler is cancelled", lease * 2, || {
        let done = stopped.lock().unwrap().is_some();
        async move { done }
    })
    .await;
    let (ran, at) = stopped.lock().unwrap().take().unwrap();
    assert!(
        ran < lease,
        "the run went on for {ran:?}, past its lease of {lease:?}"
    );
    let e = store.get(id).await.unwrap().expect("kept");
    let expires = e
        .lease
        .expect("the lease was never given up in the store")
        .expires_at;
    assert!(
        at < expires,
        "the run stopped at {at:?}, after the store's expiry {expires:?}"
    );
    assert_eq!(e.attempt, 1);
    assert_eq!(e.last_error, None, "nothing written about the event");
    assert_eq!(w.stats().lease_lost, 1);
    w.shutdown(SOON).await;
}

/// A handler that finishes after its lease was taken over: its "done" is
/// refused by the fence, and the event stays with the new holder.
pub async fn late_completion_is_refused_by_the_fence(store: Arc<dyn Store>) {
    let lease = Duration::from_secs(60);
    // The queue must not redeliver the running event's notification: its
    // heartbeat extends it only every `lease / 3`.
    let rig = Rig::with_ack_wait(store, lease).await;
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let w = rig
        .builder()
        // A long lease: the heartbeat won't notice before the handler returns.
        .lease(lease)
        .handler("late", move |_: serde_json::Value, _cx: Context| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                s.notify_one();
                r.notified().await;
            }
        })
        .start();
    rig.swept(&w).await;
    let id = rig.emit_to("late", EmitOptions::default()).await;
    started.notified().await;
    let thief = rig.steal_lease(id, Duration::from_secs(3600)).await;
    release.notify_one();
    eventually("the late result is refused", SOON, || {
        let n = w.stats().fenced_out;
        async move { n == 1 }
    })
    .await;
    let e = rig.store.get(id).await.unwrap().expect("not deleted");
    assert_eq!(e.lease.map(|l| l.token), Some(thief));
    assert_eq!(w.stats().done, 0, "a refused result is not counted as done");
    assert_eq!(rig.stored().await, 1);
    w.shutdown(SOON).await;
}

struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs a closure when dropped (as the runtime drops a cancelled handler).
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}
