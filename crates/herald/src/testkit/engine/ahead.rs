//! Engine scenarios for events claimed ahead of free handler slots: they
//! keep their leases while they wait, never raise the running handlers past
//! the concurrency, and a shutdown treats them as runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, SOON};
use crate::backend::Store;
use crate::client::EmitOptions;
use crate::handler::Context;
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
/// the shortest lease. The handlers hold until the test opens a gate, so
/// nothing ends while it watches: all 12 events are claimed, 2 running and
/// 4 waiting on each worker. They stay so for 1.5 s (five leases, and past
/// the queue's 1-s ack wait, with the other worker's reconciler sweeping
/// every 200 ms): only the heartbeat keeps the waiting ones from being
/// rescued and run by the other worker. Then every event runs once, on its
/// first attempt, and no worker ever ran more than 2 handlers at once.
pub async fn claimed_ahead_events_keep_their_leases_while_they_wait(store: Arc<dyn Store>) {
    let rig = Rig::with_ack_wait(store, Duration::from_secs(1)).await;
    let open = Arc::new(AtomicBool::new(false));
    let start = |running: Running| -> Worker {
        let (ledger, open) = (rig.ledger.clone(), open.clone());
        rig.builder()
            .configure(|c| {
                c.concurrency = 2;
                c.claim_ahead = Some(4);
                c.lease = MIN_LEASE;
            })
            .handler("gated", move |_: serde_json::Value, cx: Context| {
                let (ledger, running, open) = (ledger.clone(), running.clone(), open.clone());
                async move {
                    running.enter();
                    while !open.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    running.leave();
                    ledger.record(cx.event_id, cx.attempt);
                }
            })
            .start()
    };
    let (ra, rb) = (Running::default(), Running::default());
    let (a, b) = (start(ra.clone()), start(rb.clone()));
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(rig.emit_to("gated", EmitOptions::default()).await);
    }
    let held = |a: &Worker, b: &Worker| {
        (
            a.in_flight(),
            ra.now.load(Ordering::SeqCst),
            b.in_flight(),
            rb.now.load(Ordering::SeqCst),
        )
    };
    eventually("each worker holds 6 events and runs 2", SOON, || {
        let h = held(&a, &b);
        async move { h == (6, 2, 6, 2) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        held(&a, &b),
        (6, 2, 6, 2),
        "an event claimed ahead was lost or started"
    );
    assert_eq!(rig.ledger.total(), 0);
    for w in [&a, &b] {
        assert_eq!(w.stats().lease_lost, 0, "a lease lapsed while it waited");
    }
    open.store(true, Ordering::SeqCst);
    for id in &ids {
        rig.runs_once(*id).await;
        assert_eq!(rig.ledger.attempts_of(*id), vec![1], "one claim, one run");
    }
    assert_eq!(rig.stored().await, 0);
    for running in [&ra, &rb] {
        let most = running.most.load(Ordering::SeqCst);
        assert!(
            most <= 2,
            "a worker ran {most} handlers at once, past its concurrency of 2"
        );
    }
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
