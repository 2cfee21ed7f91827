//! What the Pub/Sub queue does beyond the conformance suite, on the
//! emulator: the bound on outstanding messages, the check of an existing
//! subscription, and recovery when the topic and subscription vanish (as
//! in an emulator restart).

use std::collections::HashSet;
use std::time::Duration;

use gcloud_pubsub::subscription::SubscriptionConfig;
use herald::queue::{Publish, Queue, QueueError};
use herald::{EventId, Notification};
use herald_pubsub::testing::{
    delete, emulator_host, fresh_config, reachable, test_name, unreachable, TestTopic,
};
use herald_pubsub::{PubsubConfig, PubsubQueue, PullMode};

fn notes(n: usize) -> Vec<Publish> {
    (0..n)
        .map(|_| Publish {
            notification: Notification::one("t", EventId::new()),
            delay: Duration::ZERO,
        })
        .collect()
}

/// The emulator's host, or `None` after the SKIPPED line.
async fn emulator() -> Option<String> {
    let host = emulator_host();
    match reachable(&host).await {
        Ok(()) => Some(host),
        Err(e) => {
            unreachable(&test_name(), &host, &e);
            None
        }
    }
}

/// Receives for `within`, without answering; returns every delivery.
async fn receive_for(q: &PubsubQueue, within: Duration) -> Vec<herald::queue::Delivery> {
    let mut got = Vec::new();
    let until = tokio::time::Instant::now() + within;
    while let Ok(Ok(more)) = tokio::time::timeout_at(until, q.receive(100)).await {
        got.extend(more);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_at_most_max_outstanding_messages_until_it_answers() {
    let Some(host) = emulator().await else { return };
    let config = PubsubConfig {
        max_outstanding: 5,
        ..fresh_config(&host, Duration::from_secs(30))
    };
    let _guard = TestTopic::adopt(&config);
    let q = PubsubQueue::connect(config).await.expect("connect");
    q.publish(&notes(20)).await.expect("publish");
    let first = receive_for(&q, Duration::from_secs(3)).await;
    assert_eq!(first.len(), 5, "held: {}", first.len());
    assert_eq!(q.held(), 5);
    // Answering frees the budget; a nack with a delay does not (Pub/Sub
    // counts a held-back message as outstanding).
    let tags: Vec<_> = first.iter().map(|d| d.tag.clone()).collect();
    q.ack(&tags).await.expect("ack");
    let second = receive_for(&q, Duration::from_secs(3)).await;
    assert_eq!(second.len(), 5, "after the acks: {}", second.len());
    let ids: HashSet<_> = first.iter().chain(&second).map(|d| d.tag.clone()).collect();
    assert_eq!(ids.len(), 10, "ten distinct deliveries");
    q.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_with_another_ack_deadline_is_refused_with_the_fix() {
    let Some(host) = emulator().await else { return };
    let config = fresh_config(&host, Duration::from_secs(9));
    let _guard = TestTopic::adopt(&config);
    // Made by someone else, with the emulator's default 10 s... and then 60 s.
    let q = PubsubQueue::connect(config.clone()).await.expect("connect");
    let sub = q.client().subscription(&config.subscription);
    sub.delete(None).await.expect("delete the subscription");
    sub.create(
        &config.topic_name(),
        SubscriptionConfig {
            ack_deadline_seconds: 60,
            ..SubscriptionConfig::default()
        },
        None,
    )
    .await
    .expect("create it with a 60 s deadline");
    q.close().await;
    match PubsubQueue::connect(config.clone()).await {
        Err(QueueError::Config(m)) => {
            assert!(m.contains("ack deadline is 60 s, herald needs 10 s"), "{m}");
            assert!(
                m.contains(&format!(
                    "gcloud pubsub subscriptions update {} --project herald-test --ack-deadline=10",
                    config.subscription
                )),
                "{m}"
            );
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a 60 s deadline was accepted for a 9 s lease"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_topic_and_subscription_are_made_again() {
    let Some(host) = emulator().await else { return };
    let config = fresh_config(&host, Duration::from_secs(9));
    let _guard = TestTopic::adopt(&config);
    let q = PubsubQueue::connect(config.clone()).await.expect("connect");
    q.publish(&notes(1)).await.expect("publish");
    let got = receive_for(&q, Duration::from_secs(2)).await;
    assert_eq!(got.len(), 1);
    q.ack(&[got[0].tag.clone()]).await.expect("ack");
    // What an emulator restart does: everything is gone.
    delete(&host, &config.project, &config.topic, &config.subscription)
        .await
        .expect("delete");
    // The receiver notices, makes them again; a publish finds the topic.
    let receiving = tokio::spawn({
        let q = std::sync::Arc::new(q);
        let r = q.clone();
        async move {
            let got = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    let more = r.receive(10).await.expect("receive");
                    if !more.is_empty() {
                        return more;
                    }
                }
            })
            .await;
            (q, got)
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let publisher = PubsubQueue::connect(config.clone())
        .await
        .expect("connect again");
    publisher.publish(&notes(1)).await.expect("publish again");
    let (q, got) = receiving.await.expect("the receiver");
    let got = got.expect("a delivery after the topic came back");
    assert_eq!(got.len(), 1);
    q.ack(&[got[0].tag.clone()]).await.expect("ack");
    q.close().await;
}

/// The environment variable that makes [`receiver_child`] a receiver.
const CHILD: &str = "HERALD_PUBSUB_TEST_CHILD";

/// Not a test: the receiving process that [`killed_receiver`] starts and
/// kills. `HOST TOPIC SUBSCRIPTION MODE` in [`CHILD`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by killed_receiver as its child"]
async fn receiver_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let config = PubsubConfig {
        emulator: Some(parts[0].to_string()),
        pull: parts[3].parse().expect("a pull mode"),
        ..PubsubConfig::new("herald-test", parts[1], parts[2], Duration::from_secs(9))
    };
    let q = PubsubQueue::connect(config).await.expect("connect");
    let receiving = tokio::spawn(async move {
        loop {
            // Never answers: what a worker killed mid-run leaves.
            let _ = q.receive(100).await;
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!("receiving");
    receiving.await.expect("receiving");
}

/// The emulator keeps sending to the streaming pull of a SIGKILLed
/// process (5 of 6 new messages went there in one run): its messages come
/// back only after the ack deadline. The real service closes the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails on the emulator, which keeps a killed receiver's stream: see docs/pubsub.md"]
async fn a_killed_streaming_receiver_does_not_keep_new_messages() {
    let got = killed_receiver(PullMode::Streaming, "streaming").await;
    assert_eq!(
        got,
        Some(6),
        "messages published after a receiver died went to its dead stream"
    );
}

/// With unary pulls, a killed receiver's one waiting Pull takes at most
/// one message (the emulator serves it anyway); the rest reach the living.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_unary_receiver_keeps_at_most_its_last_pull() {
    if let Some(got) = killed_receiver(PullMode::Unary, "unary").await {
        assert!(got >= 5, "only {got} of 6 reached the living receiver");
    }
}

/// Starts a receiving child process and a receiver here, SIGKILLs the
/// child, publishes 6 messages one at a time; returns how many reached the
/// receiver here within 3 s each (`None`: no emulator).
async fn killed_receiver(pull: PullMode, name: &str) -> Option<usize> {
    use std::io::BufRead;
    let host = emulator().await?;
    let config = PubsubConfig {
        pull,
        ..fresh_config(&host, Duration::from_secs(9))
    };
    let _guard = TestTopic::adopt(&config);
    let live = std::sync::Arc::new(PubsubQueue::connect(config.clone()).await.expect("connect"));
    // One receive loop, never cancelled: a cancelled unary Pull would stay
    // waiting at the emulator and take a message too.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let receiver = tokio::spawn({
        let live = live.clone();
        async move {
            loop {
                let got = live.receive(100).await.expect("receive");
                if got.is_empty() || tx.send(got).is_err() {
                    return;
                }
            }
        }
    });
    let mut child = std::process::Command::new(std::env::current_exe().expect("this test"))
        .args(["--exact", "receiver_child", "--ignored", "--nocapture"])
        .env(
            CHILD,
            format!("{host} {} {} {name}", config.topic, config.subscription),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the receiving child");
    let out = std::io::BufReader::new(child.stdout.take().expect("its stdout"));
    for line in out.lines() {
        if line.expect("a line").contains("receiving") {
            break;
        }
    }
    // Both receive now; then one dies without a word.
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap it");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut got = 0;
    for _ in 0..6 {
        live.publish(&notes(1)).await.expect("publish");
        if let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(3), rx.recv()).await {
            got += d.len();
            let tags: Vec<_> = d.iter().map(|d| d.tag.clone()).collect();
            live.ack(&tags).await.expect("ack");
        }
    }
    live.close().await;
    receiver.await.expect("the receive loop");
    Some(got)
}
