//! Engine scenarios for plain runs: one event, several in sequence or at once, a delayed one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, H, SOON, T};
use crate::backend::Store;
use crate::client::{EmitOptions, EmitRequest};
use crate::model::Millis;
use crate::testkit::eventually;
use crate::testkit::faults::Faulty;
use crate::worker::MIN_LEASE;

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

/// `n` requests of an event for the `record` handler, due now.
fn requests(n: usize) -> Vec<EmitRequest> {
    (0..n)
        .map(|_| EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "{}".into(),
            options: EmitOptions::default(),
        })
        .collect()
}

/// Three events emitted at once.
pub async fn three_at_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ids = rig.client.emit_batch(requests(3)).await.expect("emit");
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

/// An event emitted for an absolute time (`run_at`) does not run before
/// it by the store's clock; one for a time already past runs at once.
pub async fn an_event_at_a_time_waits_for_it(store: Arc<dyn Store>) {
    let rig = Rig::new(store.clone()).await;
    let w = rig.worker();
    let now = store.clock().await.expect("the store's clock");
    let past = rig
        .emit_to(H, EmitOptions::default().run_at(Millis(now.0 - 3_600_000)))
        .await;
    rig.runs_once(past).await;
    let at = Millis(store.clock().await.expect("the store's clock").0 + 800);
    let id = rig.emit_to(H, EmitOptions::default().run_at(at)).await;
    rig.runs_once(id).await;
    let ran = store.clock().await.expect("the store's clock");
    assert!(ran.0 >= at.0, "ran at {ran:?}, before its time {at:?}");
    w.shutdown(SOON).await;
}

/// An emit names its time once: `run_at` or `delay`, not both.
pub async fn run_at_and_delay_together_are_refused(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let both = EmitOptions::default()
        .run_at(Millis(0))
        .delay(Duration::from_secs(1));
    let err = rig
        .client
        .emit_json(T, H, "{}", both)
        .await
        .expect_err("both refused");
    assert!(matches!(err, crate::ClientError::RunAtAndDelay), "{err}");
    assert_eq!(rig.stored().await, 0);
}

/// Settle calls overlap, two at most, each of at most a full batch: while
/// a slow settle call is in flight, the runs that end meanwhile fill a
/// second one, and past that they wait. Every event runs once and is
/// gone, and shutdown returns only once every call has ended.
pub async fn settle_calls_overlap_two_at_most(store: Arc<dyn Store>) {
    const EVENTS: usize = 4000;
    let rig = Rig::new(store.clone()).await;
    let slow = Arc::new(Faulty::around(store).slow_settles(Duration::from_millis(500)));
    let settles = slow.settles.clone();
    let w = rig
        .builder_on(slow)
        .configure(|c| {
            c.concurrency = 512;
            c.claim_ahead = Some(4096);
            c.batch = 512;
        })
        .start();
    for _ in 0..EVENTS / 1000 {
        rig.client.emit_batch(requests(1000)).await.expect("emit");
    }
    let ledger = rig.ledger.clone();
    eventually("every event runs", SOON, || {
        let n = ledger.distinct();
        async move { n == EVENTS }
    })
    .await;
    w.shutdown(SOON).await;
    assert_eq!(
        settles.in_flight(),
        0,
        "shutdown returned with a settle call in flight"
    );
    assert_eq!(rig.stored().await, 0, "every run was settled");
    assert_eq!(rig.ledger.total(), EVENTS, "an event ran twice");
    let most = settles.most_in_flight.load(Ordering::SeqCst);
    assert_eq!(most, 2, "settle calls in flight at once: {most}");
    let largest = settles.largest.load(Ordering::SeqCst);
    assert!(largest <= 1024, "a settle call of {largest} runs");
}

/// A settle call that panics (a bug) loses no event: its runs leave the
/// heartbeat as it unwinds, so their leases lapse, and the notification
/// it never answered comes back and runs the event again.
pub async fn a_settle_call_that_panics_loses_no_event(store: Arc<dyn Store>) {
    let rig = Rig::with_ack_wait(store.clone(), Duration::from_secs(1)).await;
    let faulty = Arc::new(Faulty::around(store).panicking_settles(1));
    let w = rig
        .builder_on(faulty)
        .configure(|c| c.lease = MIN_LEASE)
        .start();
    let id = rig.emit().await;
    let ledger = rig.ledger.clone();
    eventually("the event ran again after the panic", SOON, || {
        let n = ledger.total();
        async move { n == 2 }
    })
    .await;
    eventually("the event settled", SOON, || {
        let rig = &rig;
        async move { rig.stored().await == 0 }
    })
    .await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 2]);
    w.shutdown(SOON).await;
}
