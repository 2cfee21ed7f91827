//! Engine scenarios for failing handlers: crash loops, retries, snoozes, dead events retried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, QUIET, SOON};
use crate::backend::Store;
use crate::client::EmitOptions;
use crate::handler::{Context, HandlerError};
use crate::model::EventId;

/// A handler that panics every time uses up its attempts and goes dead.
pub async fn crash_looping_handler_ends_dead(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let w = rig
        .builder()
        .handler("crash", move |_: serde_json::Value, _cx: Context| {
            r.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            async move {
                if r.load(Ordering::SeqCst) > 0 {
                    panic!("segfault simulator");
                }
            }
        })
        .start();
    let id = rig
        .emit_to("crash", EmitOptions::default().max_attempts(3))
        .await;
    rig.until_dead(id).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let e = rig.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.attempt, 3);
    assert!(e.lease.is_none());
    let error = e.last_error.unwrap_or_default();
    assert!(
        error.contains("3/3") && error.contains("segfault simulator"),
        "{error}"
    );
    let s = w.stats();
    assert_eq!((s.retried, s.dead), (2, 1));
    assert_eq!(rig.stored().await, 1, "dead events are kept");
    w.shutdown(SOON).await;
}

/// Two failures, then success: three attempts, two retries, deleted.
pub async fn failures_retry_with_backoff_then_succeed(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("flaky", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if cx.attempt < 3 {
                    return Err(HandlerError::retry("upstream 502"));
                }
                Ok(())
            }
        })
        .start();
    let id = rig.emit_to("flaky", EmitOptions::default()).await;
    rig.until_gone(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 2, 3]);
    rig.counted(&w, "the run is counted done", |s| s.done == 1)
        .await;
    let s = w.stats();
    assert_eq!((s.retried, s.done, s.dead), (2, 1, 0));
    w.shutdown(SOON).await;
}

/// A snooze runs the event again later without using up an attempt.
pub async fn snooze_gives_the_attempt_back(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("sleepy", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if ledger.runs_of(cx.event_id) < 3 {
                    return Err(HandlerError::snooze(Duration::from_millis(100)));
                }
                Ok(())
            }
        })
        .start();
    let id = rig
        .emit_to("sleepy", EmitOptions::default().max_attempts(1))
        .await;
    rig.until_gone(id).await;
    // max_attempts is 1, yet it ran three times: snoozes gave their attempts back.
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 1, 1]);
    assert_eq!(w.stats().snoozed, 2);
    w.shutdown(SOON).await;
}

/// A dead event can be retried by an operator: it runs again with fresh attempts.
pub async fn dead_event_can_be_retried(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("picky", move |_: serde_json::Value, cx: Context| {
            let (f, ledger) = (f.clone(), ledger.clone());
            async move {
                ledger.record(cx.event_id, cx.attempt);
                if f.load(Ordering::SeqCst) {
                    return Err(HandlerError::fail("bad address"));
                }
                Ok(())
            }
        })
        .start();
    let id = rig.emit_to("picky", EmitOptions::default()).await;
    rig.until_dead(id).await;
    assert_eq!(
        rig.ledger.attempts_of(id),
        vec![1],
        "failed for good: no retry"
    );
    assert!(!rig.client.retry_dead(EventId::new()).await.unwrap());
    fail.store(false, Ordering::SeqCst);
    assert!(rig.client.retry_dead(id).await.unwrap());
    rig.until_gone(id).await;
    assert_eq!(rig.ledger.attempts_of(id), vec![1, 1]);
    w.shutdown(SOON).await;
}
