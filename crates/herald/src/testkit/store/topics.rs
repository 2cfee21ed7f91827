//! Store scenarios for topics: subscriptions, their listing, the merge of
//! a tenant's and every tenant's, the config's sync, and a topic emit's
//! copies.

use std::sync::Arc;

use crate::backend::{Store, SubscriptionSync};
use crate::client::{Client, ClientError, EmitOptions};
use crate::memory_queue::MemoryQueue;
use crate::model::{Emitted, Subscription};

fn every(topic: &str, handler: &str) -> Subscription {
    Subscription::every_tenant(topic, handler)
}

fn of(tenant: &str, topic: &str, handler: &str) -> Subscription {
    Subscription::for_tenant(tenant, topic, handler)
}

/// Subscriptions are added and removed once each; `subscribers` merges the
/// tenant's with every tenant's, each handler once, in name order; the
/// listing is by topic, tenant (every tenant first) and handler.
pub async fn subscriptions_add_remove_list_and_merge_every_tenant(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store.subscriptions(None).await.expect("list").is_empty());
    assert!(store
        .subscribers("acme", "user.signup")
        .await
        .expect("subscribers")
        .is_empty());
    assert!(store
        .subscribe(&every("user.signup", "welcome"))
        .await
        .expect("subscribe"));
    assert!(!store
        .subscribe(&every("user.signup", "welcome"))
        .await
        .expect("subscribe"));
    assert!(store
        .subscribe(&of("acme", "user.signup", "crm"))
        .await
        .expect("subscribe"));
    // The same handler for the tenant and for every tenant: one copy.
    assert!(store
        .subscribe(&of("acme", "user.signup", "welcome"))
        .await
        .expect("subscribe"));
    assert!(store
        .subscribe(&of("other", "user.signup", "audit"))
        .await
        .expect("subscribe"));
    assert!(store
        .subscribe(&every("order.paid", "invoice"))
        .await
        .expect("subscribe"));
    assert_eq!(
        store
            .subscribers("acme", "user.signup")
            .await
            .expect("subscribers"),
        ["crm", "welcome"]
    );
    assert_eq!(
        store
            .subscribers("other", "user.signup")
            .await
            .expect("subscribers"),
        ["audit", "welcome"]
    );
    assert_eq!(
        store
            .subscribers("nobody", "user.signup")
            .await
            .expect("subscribers"),
        ["welcome"]
    );
    assert!(store
        .subscribers("acme", "user")
        .await
        .expect("subscribers")
        .is_empty());
    assert_eq!(
        store.subscriptions(None).await.expect("list"),
        vec![
            every("order.paid", "invoice"),
            every("user.signup", "welcome"),
            of("acme", "user.signup", "crm"),
            of("acme", "user.signup", "welcome"),
            of("other", "user.signup", "audit"),
        ]
    );
    assert_eq!(
        store.subscriptions(Some("order.paid")).await.expect("list"),
        vec![every("order.paid", "invoice")]
    );
    assert!(store
        .unsubscribe(&every("user.signup", "welcome"))
        .await
        .expect("unsubscribe"));
    assert!(!store
        .unsubscribe(&every("user.signup", "welcome"))
        .await
        .expect("unsubscribe"));
    // The tenant's own subscription of the same handler stays.
    assert_eq!(
        store
            .subscribers("acme", "user.signup")
            .await
            .expect("subscribers"),
        ["crm", "welcome"]
    );
    assert!(store
        .subscribers("nobody", "user.signup")
        .await
        .expect("subscribers")
        .is_empty());
}

/// The config's subscriptions are replaced as a whole; the API's stay; one
/// declared in both becomes the config's.
pub async fn syncing_the_config_replaces_its_subscriptions_and_keeps_the_api_s(
    store: Arc<dyn Store>,
) {
    let store = store.as_ref();
    assert!(store
        .subscribe(&every("t", "by_api"))
        .await
        .expect("subscribe"));
    assert!(store
        .subscribe(&every("t", "both"))
        .await
        .expect("subscribe"));
    let first = [every("t", "a"), of("acme", "t", "b"), every("t", "both")];
    assert_eq!(
        store.sync_subscriptions(&first).await.expect("sync"),
        SubscriptionSync {
            added: 3,
            removed: 0
        }
    );
    assert_eq!(
        store.sync_subscriptions(&first).await.expect("sync again"),
        SubscriptionSync::default(),
        "a second sync of the same set changes nothing"
    );
    let second = [of("acme", "t", "b"), every("t", "c")];
    assert_eq!(
        store.sync_subscriptions(&second).await.expect("sync"),
        SubscriptionSync {
            added: 1,
            removed: 2
        }
    );
    assert_eq!(
        store.subscriptions(Some("t")).await.expect("list"),
        vec![every("t", "by_api"), every("t", "c"), of("acme", "t", "b")]
    );
    assert_eq!(
        store.sync_subscriptions(&[]).await.expect("sync"),
        SubscriptionSync {
            added: 0,
            removed: 2
        }
    );
    assert_eq!(
        store.subscriptions(None).await.expect("list"),
        vec![every("t", "by_api")]
    );
}

/// A topic emit stores one event per subscriber, each with the topic, the
/// payload and the options; an idempotency key dedups each copy on its
/// own; no subscriber is an error that stores nothing.
pub async fn a_topic_emit_stores_one_event_per_subscriber(store: Arc<dyn Store>) {
    let client = Client::new(store.clone(), Arc::new(MemoryQueue::default()));
    match client
        .emit_topic_json("acme", "user.signup", "{}", EmitOptions::default())
        .await
    {
        Err(ClientError::NoSubscribers { tenant, topic }) => {
            assert_eq!((tenant.as_str(), topic.as_str()), ("acme", "user.signup"));
        }
        other => panic!("expected NoSubscribers, got {other:?}"),
    }
    assert_eq!(crate::testkit::stored(store.as_ref()).await, 0);
    store
        .subscribe(&every("user.signup", "welcome"))
        .await
        .expect("subscribe");
    store
        .subscribe(&of("acme", "user.signup", "crm"))
        .await
        .expect("subscribe");
    let options = EmitOptions::default()
        .max_attempts(4)
        .idempotency_key("signup-1");
    let out = client
        .emit_topic_json("acme", "user.signup", r#"{"user":7}"#, options.clone())
        .await
        .expect("topic emit");
    assert_eq!(out.topic, "user.signup");
    let handlers: Vec<&str> = out.events.iter().map(|e| e.handler.as_str()).collect();
    assert_eq!(handlers, ["crm", "welcome"]);
    for copy in &out.events {
        let Emitted::Created(id) = copy.emitted else {
            panic!("expected a new event, got {:?}", copy.emitted)
        };
        let e = store.get(id).await.expect("get").expect("stored");
        assert_eq!(e.handler, copy.handler);
        assert_eq!(e.tenant, "acme");
        assert_eq!(e.topic.as_deref(), Some("user.signup"));
        assert_eq!(e.payload, r#"{"user":7}"#);
        assert_eq!(e.max_attempts, 4);
        assert_eq!(e.idempotency_key.as_deref(), Some("signup-1"));
    }
    // The same key again: each copy finds its own.
    let again = client
        .emit_topic_json("acme", "user.signup", r#"{"user":7}"#, options)
        .await
        .expect("topic emit again");
    for (a, b) in out.events.iter().zip(&again.events) {
        assert_eq!(b.emitted, Emitted::Existing(a.emitted.id()));
    }
    // Another tenant has only the every-tenant subscriber.
    let other = client
        .emit_topic_json("other", "user.signup", "1", EmitOptions::default())
        .await
        .expect("topic emit");
    assert_eq!(other.events.len(), 1);
    assert_eq!(other.events[0].handler, "welcome");
    assert_eq!(crate::testkit::stored(store.as_ref()).await, 3);
    // A direct emit has no topic.
    let direct = client
        .emit_json("acme", "welcome", "{}", EmitOptions::default())
        .await
        .expect("emit");
    let e = store.get(direct.id()).await.expect("get").expect("stored");
    assert_eq!(e.topic, None);
    // Bad input is refused before anything is read or stored.
    for (tenant, topic, payload) in [
        ("acme", "", "{}"),
        ("acme", "a\nb", "{}"),
        ("", "user.signup", "{}"),
        ("acme", "user.signup", "not json"),
    ] {
        assert!(
            client
                .emit_topic_json(tenant, topic, payload, EmitOptions::default())
                .await
                .is_err(),
            "{tenant:?} {topic:?} {payload:?} was accepted"
        );
    }
    assert_eq!(crate::testkit::stored(store.as_ref()).await, 4);
}
