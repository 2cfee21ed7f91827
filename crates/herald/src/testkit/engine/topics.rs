//! Engine scenarios for topics: each subscriber's copy is an event of its
//! own (a pause holds only its copy), and a topic of 1,000 subscribers
//! stores, notifies and runs 1,000 events.

use std::sync::Arc;

use super::{Rig, H, SOON, T};
use crate::backend::Store;
use crate::client::EmitOptions;
use crate::handler::Context;
use crate::model::{EventId, Subscription};
use crate::testkit::eventually;

/// Two handlers subscribed to a topic; one is paused: its copy is held,
/// unused, while the other copy runs; unpausing runs the held one once.
pub async fn a_paused_subscriber_holds_only_its_copy(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let ledger = rig.ledger.clone();
    let w = rig
        .builder()
        .handler("other", move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move { ledger.record(cx.event_id, cx.attempt) }
        })
        .start();
    for handler in [H, "other"] {
        let s = Subscription::every_tenant("user.signup", handler);
        assert!(rig.client.subscribe(&s).await.expect("subscribe"));
    }
    assert!(rig.client.pause(T, "other").await.expect("pause"));
    let out = rig
        .client
        .emit_topic_json(T, "user.signup", "{}", EmitOptions::default())
        .await
        .expect("topic emit");
    let id_of = |h: &str| {
        out.events
            .iter()
            .find(|e| e.handler == h)
            .expect("a copy per subscriber")
            .emitted
            .id()
    };
    let (running, held) = (id_of(H), id_of("other"));
    rig.runs_once(running).await;
    rig.never_runs_for_a_while(held).await;
    assert_eq!(rig.stored().await, 1);
    let release = rig.client.unpause(T, "other").await.expect("unpause");
    assert_eq!(release.notified, 1);
    rig.runs_once(held).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// A topic with 1,000 subscribed handlers: one emit stores 1,000 events
/// (one store call), notifies them, and each runs once.
pub async fn a_topic_of_1000_subscribers_stores_and_runs_every_copy(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let names: Vec<String> = (0..1000).map(|i| format!("sub{i:04}")).collect();
    let mut builder = rig.builder();
    for name in &names {
        let ledger = rig.ledger.clone();
        builder = builder.handler(name, move |_: serde_json::Value, cx: Context| {
            let ledger = ledger.clone();
            async move { ledger.record(cx.event_id, cx.attempt) }
        });
        let s = Subscription::for_tenant(T, "big", name.clone());
        assert!(rig.client.subscribe(&s).await.expect("subscribe"));
    }
    assert_eq!(
        rig.client.subscribers(T, "big").await.expect("subscribers"),
        names
    );
    let w = builder.start();
    let out = rig
        .client
        .emit_topic_json(T, "big", r#"{"n":1}"#, EmitOptions::default())
        .await
        .expect("topic emit");
    assert_eq!(out.events.len(), 1000);
    let ids: Vec<EventId> = out.events.iter().map(|e| e.emitted.id()).collect();
    let ledger = rig.ledger.clone();
    eventually("every copy runs", SOON * 3, || {
        let n = ledger.distinct();
        async move { n == 1000 }
    })
    .await;
    for id in &ids {
        assert_eq!(rig.ledger.runs_of(*id), 1, "event {id} ran more than once");
    }
    let store = rig.store.clone();
    eventually("every copy is done", SOON, || {
        let store = store.clone();
        async move { crate::testkit::stored(store.as_ref()).await == 0 }
    })
    .await;
    w.shutdown(SOON).await;
}
