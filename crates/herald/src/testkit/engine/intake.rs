//! Engine scenarios for what comes in: bad payloads, idempotency keys, garbage, unknown handlers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{Rig, H, QUIET, SOON, T};
use crate::backend::Store;
use crate::client::{Client, ClientError, EmitOptions, EmitRequest};
use crate::model::{EventId, EventState, Notification};
use crate::testkit::eventually;
use crate::testkit::faults::Faulty;

/// Garbage on the queue is dropped with a log line; real events still run.
pub async fn garbage_on_the_queue_is_dropped(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    for garbage in [
        b"\x00\xffnot json".to_vec(),
        br#"{"tenant":"acme","event_id":"not-a-uuid"}"#.to_vec(),
    ] {
        rig.backdoor
            .publish_raw(garbage)
            .await
            .expect("publish garbage");
    }
    let id = rig.emit().await;
    rig.runs_once(id).await;
    assert_eq!(w.stats().garbage, 2);
    // Terminated, not nacked: it never comes back.
    tokio::time::sleep(QUIET).await;
    assert_eq!(w.stats().garbage, 2, "garbage is not redelivered");
    w.shutdown(SOON).await;
}

/// An event for a handler nobody registered is stored, kept and visible,
/// with its attempts untouched.
pub async fn unknown_handler_is_stored_and_kept(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    // After the start-up sweep, or it may notify the event a second time.
    rig.swept(&w).await;
    let id = rig
        .emit_to("not_deployed_yet", EmitOptions::default())
        .await;
    // The drop is counted when the event is answered and the message acked
    // just after: wait for both.
    let memory = rig.memory.clone();
    eventually("the notification is dropped and acked", SOON, || {
        let n = w.stats().dropped;
        let held = memory.as_ref().map_or(0, |q| q.len());
        async move { n >= 1 && held == 0 }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    if let Some(q) = &rig.memory {
        assert!(q.is_empty(), "no notification circulates for it");
    }
    let e = rig.store.get(id).await.unwrap().expect("kept");
    assert_eq!((e.state, e.attempt), (EventState::Pending, 0));
    let counts = rig
        .client
        .handler_counts(&crate::CountsQuery::totals())
        .await
        .unwrap();
    assert!(counts
        .iter()
        .any(|c| c.handler == "not_deployed_yet" && c.total() == 1));
    w.shutdown(SOON).await;
}

/// Payloads that are not JSON or too large are refused, saying which and why.
pub async fn bad_payloads_are_refused_and_nothing_is_stored(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let client = rig.client.clone().max_payload(1024);
    let err = client
        .emit_json(T, H, "{not json", EmitOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotJson(_)), "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(2000));
    let err = client
        .emit_json(T, H, &big, EmitOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::TooLarge {
                size: 2011,
                limit: 1024
            }
        ),
        "{err}"
    );
    let err = client
        .emit_json("", H, "{}", EmitOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tenant"), "{err}");
    let batch = vec![
        EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "{}".into(),
            options: EmitOptions::default(),
        },
        EmitRequest {
            tenant: T.into(),
            handler: H.into(),
            payload: "[1,".into(),
            options: EmitOptions::default(),
        },
    ];
    let err = client.emit_batch(batch).await.unwrap_err();
    assert!(err.to_string().starts_with("event 1 of the batch"), "{err}");
    assert_eq!(rig.stored().await, 0, "a refused batch stores nothing");
}

/// A second emit with the same idempotency key returns the first event,
/// also once it has run, until the key is purged.
pub async fn idempotency_key_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    rig.client.pause(T, H).await.unwrap();
    let opts = EmitOptions::default().idempotency_key("order-42");
    let a = rig
        .client
        .emit_json(T, H, "{}", opts.clone())
        .await
        .unwrap();
    let b = rig
        .client
        .emit_json(T, H, "{}", opts.clone())
        .await
        .unwrap();
    assert!(matches!(a, crate::Emitted::Created(_)));
    assert_eq!(b, crate::Emitted::Existing(a.id()));
    // Another handler or tenant is another key space.
    let c = rig
        .client
        .emit_json("other", H, "{}", opts.clone())
        .await
        .unwrap();
    assert!(matches!(c, crate::Emitted::Created(_)));
    assert_eq!(rig.stored().await, 2);
    let w = rig.worker();
    rig.client.unpause(T, H).await.unwrap();
    rig.runs_once(a.id()).await;
    // Once done, the key still names it: a retry stores and runs nothing.
    let again = rig
        .client
        .emit_json(T, H, "{}", opts.clone())
        .await
        .unwrap();
    assert_eq!(again, crate::Emitted::Existing(a.id()));
    // Purged after its window, the key is free again.
    // A window of zero, a few ms apart: the first purge sees it finished,
    // the next (a window later) frees it.
    let (window, tick) = (
        std::time::Duration::ZERO,
        std::time::Duration::from_millis(5),
    );
    tokio::time::sleep(tick).await;
    rig.store.purge_keys(window, 100).await.unwrap();
    tokio::time::sleep(tick).await;
    rig.store.purge_keys(window, 100).await.unwrap();
    let d = rig.client.emit_json(T, H, "{}", opts).await.unwrap();
    assert!(matches!(d, crate::Emitted::Created(_)));
    rig.runs_once(d.id()).await;
    w.shutdown(SOON).await;
}

/// Single emits from many tasks at once (written together by group
/// commit): each is answered with its own event, every one is stored, and
/// each runs once.
pub async fn concurrent_single_emits_each_get_their_own_event_and_run_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    // Paused while they come in, so that each can be read back.
    rig.client.pause(T, H).await.unwrap();
    let w = rig.worker();
    let emits = (0..300).map(|i| {
        let client = rig.client.clone();
        tokio::spawn(async move {
            let payload = format!(r#"{{"n":{i}}}"#);
            let out = client
                .emit_json(T, H, &payload, EmitOptions::default())
                .await
                .expect("emit");
            assert!(matches!(out, crate::Emitted::Created(_)), "{out:?}");
            (out.id(), payload)
        })
    });
    let mut ids = Vec::new();
    for e in emits.collect::<Vec<_>>() {
        let (id, payload) = e.await.expect("emit task");
        // Its answer names its own event: the payload it sent.
        let stored = rig.store.get(id).await.unwrap().expect("stored");
        assert_eq!(
            stored.payload, payload,
            "event {id} holds another emit's payload"
        );
        ids.push(id);
    }
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), 300, "every emit has its own event");
    assert_eq!(rig.stored().await, 300);
    rig.client.unpause(T, H).await.unwrap();
    rig.each_runs_once(&ids).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Emits of one idempotency key from many tasks at once: one is created,
/// every other is answered with that event, and one event is stored.
pub async fn concurrent_emits_of_one_key_store_one_event(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    rig.client.pause(T, H).await.unwrap();
    let emits = (0..50).map(|_| {
        let client = rig.client.clone();
        tokio::spawn(async move {
            let opts = EmitOptions::default().idempotency_key("signup-7");
            client.emit_json(T, H, "{}", opts).await.expect("emit")
        })
    });
    let mut answers = Vec::new();
    for e in emits.collect::<Vec<_>>() {
        answers.push(e.await.expect("emit task"));
    }
    let created: Vec<_> = answers
        .iter()
        .filter(|a| matches!(a, crate::Emitted::Created(_)))
        .collect();
    assert_eq!(created.len(), 1, "one emit creates the event: {answers:?}");
    let id = created[0].id();
    assert!(answers.iter().all(|a| a.id() == id), "{answers:?}");
    assert_eq!(rig.stored().await, 1);
    let w = rig.worker();
    rig.client.unpause(T, H).await.unwrap();
    rig.runs_once(id).await;
    w.shutdown(SOON).await;
}

/// A grouped write that the store refuses because of one emit's events
/// fails that emit only: the others of its group are stored and run.
pub async fn a_refused_emit_fails_only_itself_in_a_group(store: Arc<dyn Store>) {
    let refusing: Arc<dyn Store> = Arc::new(
        crate::testkit::faults::Faulty::around(store.clone()).refusing_emits_of("refused"),
    );
    let rig = Rig::new(store).await;
    // One write at a time, so that concurrent emits surely share writes.
    let client = crate::Client::new(refusing, rig.queue.clone()).group_commit(1);
    let w = rig.worker();
    let emits = (0..100).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let tenant = if i % 10 == 0 { "refused" } else { T };
            (
                tenant,
                client
                    .emit_json(tenant, H, "{}", EmitOptions::default())
                    .await,
            )
        })
    });
    let mut ok = Vec::new();
    for e in emits.collect::<Vec<_>>() {
        match e.await.expect("emit task") {
            ("refused", Err(ClientError::Store(err))) => {
                assert!(
                    err.to_string().contains("refuses events of tenant"),
                    "{err}"
                );
            }
            ("refused", other) => panic!("a refused emit was answered {other:?}"),
            (_, Ok(out)) => ok.push(out.id()),
            (_, Err(err)) => panic!("an emit grouped with a refused one failed: {err}"),
        }
    }
    assert_eq!(ok.len(), 90);
    rig.each_runs_once(&ok).await;
    assert_eq!(
        rig.stored().await,
        0,
        "nothing of the refused tenant was stored"
    );
    w.shutdown(SOON).await;
}

/// The emits that wait together for a write are stored in one store call
/// and notified in one message once it commits: a commit costs one
/// publish, however many emits it held.
pub async fn the_emits_of_one_write_share_one_message(store: Arc<dyn Store>) {
    let rig = Rig::new(store.clone()).await;
    let slow: Arc<dyn Store> =
        Arc::new(Faulty::around(store).slow_emits(Duration::from_millis(300)));
    // One write at a time: the first emit holds it while the others wait.
    let client = Client::new(slow, rig.queue.clone()).group_commit(1);
    let emit = |client: &Client| {
        let client = client.clone();
        tokio::spawn(async move {
            let out = client.emit_json(T, H, "{}", EmitOptions::default()).await;
            out.expect("emit").id()
        })
    };
    let first = emit(&client);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting: Vec<_> = (0..9).map(|_| emit(&client)).collect();
    let first = first.await.expect("emit task");
    let mut group = HashSet::new();
    for e in waiting {
        group.insert(e.await.expect("emit task"));
    }
    assert_eq!(group.len(), 9);
    // Every emit has returned, so every notification is on the queue.
    let mut messages: Vec<Vec<EventId>> = Vec::new();
    while messages.iter().map(Vec::len).sum::<usize>() < 10 {
        let got = tokio::time::timeout(SOON, rig.queue.receive(64))
            .await
            .expect("the notifications of every returned emit are on the queue")
            .expect("receive");
        let tags: Vec<_> = got.iter().map(|d| d.tag.clone()).collect();
        for d in got {
            let n = Notification::decode(&d.payload).expect("a notification");
            messages.push(n.event_ids);
        }
        rig.queue.ack(&tags).await.expect("ack");
    }
    // In either order: a queue need not keep the order of publishes.
    messages.sort_by_key(Vec::len);
    assert_eq!(messages.len(), 2, "one message per write: {messages:?}");
    assert_eq!(messages[0], vec![first], "the first write's message");
    let second: HashSet<EventId> = messages[1].iter().copied().collect();
    assert_eq!(second, group, "the waiting emits' write, in one message");
    assert_eq!(rig.stored().await, 10);
}
