//! Engine scenarios for notifications of several events: each event is
//! answered by its own row of the decision table, and the message once all
//! of its events are.

use std::sync::Arc;
use std::time::Duration;

use super::{new_event, Rig, H, QUIET, SOON, T};
use crate::backend::{Finish, Settle, Store};
use crate::handler::Context;
use crate::model::{EventId, EventState, LeaseToken, Notification, RunAt};
use crate::queue::Publish;
use crate::testkit::eventually;
use crate::worker::Worker;

/// A worker without a reconciler (only the test's messages notify), with
/// `record` and `held`, both noting each run.
fn messages_only(rig: &Rig) -> Worker {
    let ledger = rig.ledger.clone();
    rig.builder()
        .configure(|c| c.reconcile = false)
        .handler("held", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move { ledger.record(cx.event_id, cx.attempt) }
        })
        .start()
}

async fn publish(rig: &Rig, event_ids: Vec<EventId>) {
    let notification = Notification {
        tenant: T.into(),
        event_ids,
    };
    rig.queue
        .publish(&[Publish {
            notification,
            delay: Duration::ZERO,
        }])
        .await
        .expect("publish");
}

/// One message names three events that run now (one of them twice), one
/// delayed, one of a paused handler, one of a handler no worker has and one
/// that does not exist; a garbage message arrives beside it. The runnable
/// ones run once; the delayed one runs once when due (requeued on its own);
/// the paused one waits for its unpause; the unknown one stays stored; the
/// garbage is dropped; nothing is left on the queue.
pub async fn a_message_of_many_events_answers_each_on_its_own(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    assert!(rig.client.pause(T, "held").await.expect("pause"));
    let runnable: Vec<_> = (0..3).map(|_| new_event(H)).collect();
    let mut delayed = new_event(H);
    delayed.run_at = RunAt::After(Duration::from_millis(400));
    let (paused, unknown) = (new_event("held"), new_event("nobody"));
    let mut events = runnable.clone();
    events.extend([delayed.clone(), paused.clone(), unknown.clone()]);
    rig.store.emit(&events).await.expect("emit");
    let [r1, r2, r3] = [runnable[0].id, runnable[1].id, runnable[2].id];
    let missing = EventId::new();
    rig.backdoor
        .publish_raw(b"{\"tenant\":\"acme\",\"event_ids\":[\"nope\"]}".to_vec())
        .await
        .expect("publish garbage");
    publish(
        &rig,
        vec![r1, delayed.id, paused.id, unknown.id, missing, r2, r1, r3],
    )
    .await;
    let w = messages_only(&rig);
    for id in [r1, r2, r3, delayed.id] {
        rig.runs_once(id).await;
        assert_eq!(rig.ledger.attempts_of(id), vec![1]);
    }
    rig.never_runs_for_a_while(paused.id).await;
    let kept = rig.store.get(unknown.id).await.unwrap().expect("kept");
    assert_eq!((kept.state, kept.attempt), (EventState::Pending, 0));
    assert_eq!(rig.ledger.runs_of(unknown.id), 0);
    assert_eq!(w.stats().garbage, 1);
    rig.client.unpause(T, "held").await.expect("unpause");
    rig.runs_once(paused.id).await;
    if let Some(memory) = &rig.memory {
        eventually("every message is answered", SOON, || {
            let n = memory.len();
            async move { n == 0 }
        })
        .await;
    }
    w.shutdown(SOON).await;
    assert_eq!(rig.stored().await, 1, "only the unknown handler's event");
}

/// A worker claimed the six events of a message, finished two and died
/// running the rest; the queue redelivers the message to another worker.
/// The finished ones are gone and dropped, the four under the dead lease
/// are requeued on their own until it expires and then run once each, on
/// their second attempt: nothing lost, nothing run twice.
pub async fn a_message_redelivered_after_its_worker_died_runs_what_is_left(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let events: Vec<_> = (0..6).map(|_| new_event(H)).collect();
    rig.store.emit(&events).await.expect("emit");
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    let dead = LeaseToken::new();
    let claimed = rig
        .store
        .claim(
            &crate::testkit::leases(&ids, dead),
            &[H.to_string()],
            &[T.to_string()],
            Duration::from_millis(800),
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 6);
    let finished: Vec<Settle> = ids[..2]
        .iter()
        .map(|&id| Settle {
            id,
            token: Some(dead),
            finish: Finish::Delete,
        })
        .collect();
    assert_eq!(
        rig.store.settle(&finished).await.expect("settle").held,
        vec![true, true]
    );
    publish(&rig, ids.clone()).await;
    let w = messages_only(&rig);
    for &id in &ids[2..] {
        rig.runs_once(id).await;
        assert_eq!(
            rig.ledger.attempts_of(id),
            vec![2],
            "rescued after the lease"
        );
    }
    tokio::time::sleep(QUIET).await;
    for &id in &ids[..2] {
        assert_eq!(rig.ledger.runs_of(id), 0, "a finished event ran again");
    }
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}
