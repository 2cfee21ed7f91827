//! Engine scenarios for events claimed ahead of free handler slots: they
//! keep their leases while they wait, never raise the running handlers past
//! the concurrency, and a shutdown treats them as runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, SOON};
use crate::client::EmitOptions;
use crate::handler::Context;
use crate::store::Store;
use crate::testkit::eventually;
use crate::worker::{Worker, MIN_LEASE};

/// Handlers running now, and the most seen at once.
#[derive(Clone, Default)]
struct Running {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Running {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Two workers of 2 handlers each, each claiming up to 4 more ahead, with
/// the shortest lease: an event claimed ahead waits up to three rounds of
/// 200 ms, twice its lease, so only the heartbeat keeps it from being
/// rescued and run by the other worker. Every event runs once, no worker
/// runs more than 2 handlers at once, and the workers did claim ahead.
pub async fn claimed_ahead_events_keep_their_leases_while_they_wait(store: Arc<dyn Store>) {
    let rig = Rig::with_ack_wait(store, Duration::from_secs(1)).await;
    let start = |running: Running| -> Worker {
        let ledger = rig.ledger.clone();
        rig.builder()
            .configure(|c| {
                c.concurrency = 2;
                c.claim_ahead = Some(4);
                c.lease = MIN_LEASE;
            })
            .handler("slow", move |_: serde_json::Value, cx: Context| {
                let (ledger, running) = (ledger.clone(), running.clone());
                async move {
                    running.enter();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    running.leave();
                    ledger.record(cx.event_id, cx.attempt);
                }
            })
            .start()
    };
    let (ra, rb) = (Running::default(), Running::default());
    let (a, b) = (start(ra.clone()), start(rb.clone()));
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(rig.emit_to("slow", EmitOptions::default()).await);
    }
    let mut most_held = 0;
    let deadline = tokio::time::Instant::now() + SOON;
    while rig.ledger.total() < ids.len() && tokio::time::Instant::now() < deadline {
        most_held = most_held.max(a.in_flight()).max(b.in_flight());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for id in &ids {
        rig.runs_once(*id).await;
        assert_eq!(rig.ledger.attempts_of(*id), vec![1], "one claim, one run");
    }
    assert_eq!(rig.stored().await, 0);
    for (w, running) in [(&a, &ra), (&b, &rb)] {
        assert!(
            running.most.load(Ordering::SeqCst) <= 2,
            "a worker ran {} handlers at once, past its concurrency of 2",
            running.most.load(Ordering::SeqCst)
        );
        assert_eq!(w.stats().lease_lost, 0, "a lease lapsed while it waited");
    }
    // Held counts runs until they are settled, so a run that ended and
    // waits for its settle can push it past 2 + 4: only the lower bound is
    // the claim's.
    assert!(
        most_held >= 3,
        "a worker held {most_held} events at most: none was claimed ahead"
    );
    a.shutdown(SOON).await;
    b.shutdown(SOON).await;
}

/// Events claimed ahead start within a shutdown's grace period like the
/// runs ahead of them: none is cancelled.
pub async fn shutdown_within_grace_runs_the_events_claimed_ahead(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let running = Running::default();
    let r = running.clone();
    let w = rig
        .builder()
        .configure(|c| {
            c.concurrency = 1;
            c.claim_ahead = Some(2);
        })
        .handler("slow", move |_: serde_json::Value, _cx: Context| {
            let r = r.clone();
            async move {
                r.enter();
                tokio::time::sleep(Duration::from_millis(100)).await;
                r.leave();
            }
        })
        .start();
    for _ in 0..3 {
        rig.emit_to("slow", EmitOptions::default()).await;
    }
    eventually("all three are claimed", SOON, || {
        let n = w.in_flight();
        async move { n == 3 }
    })
    .await;
    let report = w.shutdown(SOON).await;
    assert_eq!((report.in_flight, report.cancelled), (3, 0));
    assert_eq!(running.most.load(Ordering::SeqCst), 1);
    assert_eq!(rig.stored().await, 0, "all three ran and were settled");
}

/// Past the grace period, the events still waiting for a slot are released
/// with the running one: attempt given back, no lease, and the next worker
/// runs each once.
pub async fn shutdown_past_grace_releases_the_events_claimed_ahead(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let started = Arc::new(AtomicUsize::new(0));
    let first = rig.waits_for_cancel(started.clone(), |c| {
        c.concurrency = 1;
        c.claim_ahead = Some(3);
    });
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(rig.emit_to("slow", EmitOptions::default()).await);
    }
    eventually("one runs and three wait, all claimed", SOON, || {
        let (n, held) = (started.load(Ordering::SeqCst), first.in_flight());
        async move { n == 1 && held == 4 }
    })
    .await;
    let report = first.shutdown(Duration::from_millis(200)).await;
    assert_eq!((report.in_flight, report.cancelled), (4, 4));
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "no waiting event started"
    );
    rig.released_then_run_once(&ids).await;
}
