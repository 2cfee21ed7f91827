//! NATS-specific behaviour: checking an existing stream and consumer,
//! re-notifies, and a server restart.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use herald::queue::{Publish, Queue, QueueError};
use herald::{EventId, Notification};
use herald_nats::testing::{
    connect, nats_url, random_prefix, test_name, unreachable, OwnServer, TestStream,
};
use herald_nats::{NatsConfig, NatsQueue};

const ACK_WAIT: Duration = Duration::from_secs(2);

/// A client, a fresh prefix and the guard that deletes its stream; `None`
/// after the SKIPPED line.
async fn setup() -> Option<(async_nats::Client, String, TestStream)> {
    let client = match connect().await {
        Ok(c) => c,
        Err(e) => {
            unreachable(&test_name(), &nats_url(), &e);
            return None;
        }
    };
    let prefix = random_prefix();
    let guard = TestStream::adopt(&prefix);
    Some((client, prefix, guard))
}

fn config_error(r: Result<NatsQueue, QueueError>) -> String {
    match r {
        Err(QueueError::Config(m)) => m,
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("expected a config error, got a queue"),
    }
}

fn note() -> Publish {
    Publish {
        notification: Notification {
            tenant: "t".into(),
            event_id: EventId::new(),
        },
        delay: Duration::ZERO,
    }
}

#[tokio::test]
async fn a_consumer_with_a_backoff_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    let js = jetstream::new(client.clone());
    let s = js
        .create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    s.create_consumer(consumer::pull::Config {
        durable_name: Some(config.consumer.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver: 10,
        backoff: vec![Duration::from_secs(1), Duration::from_secs(5)],
        filter_subject: config.subject.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let m = config_error(NatsQueue::with_client(client, config).await);
    assert!(m.contains("backoff"), "{m}");
}

#[tokio::test]
async fn a_consumer_with_another_ack_wait_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    NatsQueue::with_client(
        client.clone(),
        NatsConfig::new(nats_url(), &prefix, ACK_WAIT),
    )
    .await
    .unwrap();
    let other = NatsConfig::new(nats_url(), &prefix, Duration::from_secs(30));
    let m = config_error(NatsQueue::with_client(client, other).await);
    assert!(m.contains("ack_wait"), "{m}");
}

#[tokio::test]
async fn a_stream_that_is_not_a_work_queue_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    jetstream::new(client.clone())
        .create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.subject.clone()],
            retention: stream::RetentionPolicy::Limits,
            ..Default::default()
        })
        .await
        .unwrap();
    let m = config_error(NatsQueue::with_client(client, config).await);
    assert!(m.contains("retention"), "{m}");
}

#[tokio::test]
async fn a_renotify_of_the_same_event_is_not_swallowed() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let q = NatsQueue::with_client(client, NatsConfig::new(nats_url(), &prefix, ACK_WAIT))
        .await
        .unwrap();
    let p = note();
    q.publish(std::slice::from_ref(&p)).await.unwrap();
    q.publish(std::slice::from_ref(&p)).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let more = tokio::time::timeout(Duration::from_secs(5), q.receive(10))
            .await
            .expect("both notifications")
            .unwrap();
        got.extend(more);
    }
    assert_eq!(got.len(), 2);
    assert!(q.durable());
    assert_eq!(q.max_delay(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_survives_a_server_restart() {
    let mut server = match OwnServer::start().await {
        Ok(s) => s,
        Err(e) => {
            unreachable(&test_name(), "a nats-server of its own", &e);
            return;
        }
    };
    let q = std::sync::Arc::new(
        NatsQueue::connect(NatsConfig::new(server.url(), "restart", ACK_WAIT))
            .await
            .unwrap(),
    );
    let p = note();
    q.publish(std::slice::from_ref(&p)).await.unwrap();
    server.stop();
    // A receive that starts while the server is down.
    let r = tokio::spawn({
        let q = q.clone();
        async move { q.receive(1).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), r)
        .await
        .expect("a delivery after the restart")
        .unwrap()
        .unwrap();
    assert_eq!(
        Notification::decode(&got[0].payload).unwrap(),
        p.notification
    );
    q.ack(&[got[0].tag.clone()]).await.unwrap();
    // And publishing works again too.
    let p2 = note();
    q.publish(std::slice::from_ref(&p2)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), q.receive(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Notification::decode(&got[0].payload).unwrap(),
        p2.notification
    );
}

/// While the server is down, answers to deliveries (nack, extend,
/// terminate, ack) fail within a few seconds instead of waiting for the
/// client to reconnect: a worker's heartbeat and settle loop must not stall
/// for the whole outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_fail_rather_than_wait_while_the_server_is_down() {
    let mut server = match OwnServer::start().await {
        Ok(s) => s,
        Err(e) => {
            unreachable(&test_name(), "a nats-server of its own", &e);
            return;
        }
    };
    let q = NatsQueue::connect(NatsConfig::new(server.url(), "down", ACK_WAIT))
        .await
        .unwrap();
    q.publish(&[note()]).await.unwrap();
    let got = q.receive(1).await.unwrap();
    let tag = got[0].tag.clone();
    server.stop();
    // All four at once: each fails within the same bound.
    let bound = Duration::from_secs(15);
    let nacks = [(tag.clone(), Duration::ZERO)];
    let tags = [tag];
    let (nack, extend, terminate, ack) = tokio::join!(
        tokio::time::timeout(bound, q.nack(&nacks)),
        tokio::time::timeout(bound, q.extend(&tags)),
        tokio::time::timeout(bound, q.terminate(&tags)),
        tokio::time::timeout(bound, q.ack(&tags)),
    );
    for (what, answer) in [
        ("nack", nack),
        ("extend", extend),
        ("terminate", terminate),
        ("ack", ack),
    ] {
        let answer = answer
            .unwrap_or_else(|_| panic!("{what} waited past {bound:?} while the server was down"));
        assert!(
            answer.is_err(),
            "{what} succeeded while the server was down"
        );
    }
}

/// A confirmed ack of a delivery that was already acked still gets its
/// confirmation (a late duplicate answer is not an error).
#[tokio::test]
async fn acking_twice_is_confirmed() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let q = NatsQueue::with_client(client, NatsConfig::new(nats_url(), &prefix, ACK_WAIT))
        .await
        .unwrap();
    q.publish(&[note()]).await.unwrap();
    let got = q.receive(1).await.unwrap();
    q.ack(&[got[0].tag.clone()]).await.unwrap();
    q.ack(&[got[0].tag.clone()]).await.unwrap();
}

/// A delay longer than the consumer's AckWait: the message is not delivered
/// early (the receiver naks it with the time left, and a nak's delay is not
/// bounded by AckWait), and it is delivered once due.
#[tokio::test]
async fn a_delay_longer_than_the_ack_wait_is_kept() {
    let Some((queue, _stream)) = herald_nats::testing::fresh_stream(
        "a_delay_longer_than_the_ack_wait_is_kept",
        Duration::from_secs(1),
    )
    .await
    else {
        return;
    };
    let note = Notification {
        tenant: "acme".into(),
        event_id: EventId::new(),
    };
    let start = std::time::Instant::now();
    queue
        .publish(&[Publish {
            notification: note.clone(),
            delay: Duration::from_secs(3),
        }])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(15), queue.receive(10))
        .await
        .expect("delivered once due")
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(got.len(), 1);
    assert_eq!(Notification::decode(&got[0].payload).unwrap(), note);
    assert!(
        waited >= Duration::from_millis(2900),
        "delivered after {waited:?}, before its delay of 3 s"
    );
    queue.ack(&[got[0].tag.clone()]).await.unwrap();
}
