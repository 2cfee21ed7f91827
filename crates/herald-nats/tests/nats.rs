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
        notification: Notification::one("t", EventId::new()),
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
    let s = js.create_stream(work_queue(&config)).await.unwrap();
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
            retention: stream::RetentionPolicy::Limits,
            ..work_queue(&config)
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
    assert_eq!(q.retention(), herald::queue::Retention::Durable);
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
/// terminate, ack) return within a few seconds instead of waiting for the
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
        // An unconfirmed answer may still "succeed" if it was written to
        // the socket before the client noticed the server had gone; only
        // the confirmed ack must fail.
        if what == "ack" {
            assert!(
                answer.is_err(),
                "ack was confirmed while the server was down"
            );
        }
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
    let note = Notification::one("acme", EventId::new());
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

// ---- Configurable replicas, MaxAckPending, storage, duplicate window and
// credentials.

/// The consumer herald created, as the server reports it.
async fn consumer_config(client: &async_nats::Client, config: &NatsConfig) -> consumer::Config {
    jetstream::new(client.clone())
        .get_stream(&config.stream)
        .await
        .unwrap()
        .consumer_info(&config.consumer)
        .await
        .unwrap()
        .config
        .clone()
}

#[tokio::test]
async fn the_stream_and_consumer_are_created_with_the_configured_replicas_and_max_ack_pending() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig {
        replicas: 1,
        max_ack_pending: 1234,
        ..NatsConfig::new(nats_url(), &prefix, ACK_WAIT)
    };
    let q = NatsQueue::with_client(client.clone(), config.clone())
        .await
        .unwrap();
    assert!(q.warnings().is_empty(), "{:?}", q.warnings());
    let stream = jetstream::new(client.clone())
        .get_stream(&config.stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    assert_eq!(stream.num_replicas, 1);
    assert_eq!(stream.storage, stream::StorageType::File);
    assert_eq!(
        stream.duplicate_window,
        herald_nats::DEFAULT_DUPLICATE_WINDOW
    );
    let consumer = consumer_config(&client, &config).await;
    assert_eq!(consumer.max_ack_pending, 1234);
    // 0: as many as its stream, also after the stream's are changed.
    assert_eq!(consumer.num_replicas, 0);
    // A worker configured for fewer is content; one for more is refused,
    // with the fix.
    let fewer = NatsConfig {
        max_ack_pending: 1000,
        ..config.clone()
    };
    NatsQueue::with_client(client.clone(), fewer).await.unwrap();
    let more = NatsConfig {
        max_ack_pending: 5000,
        ..config.clone()
    };
    let m = config_error(NatsQueue::with_client(client, more).await);
    assert_eq!(
        m,
        format!(
            "consumer {0}_workers: max_ack_pending is 1234, herald needs at least 5000 or unlimited (-1): raise it with `nats consumer edit {0} {0}_workers --max-pending 5000`, or configure herald for 1234 or less",
            prefix
        )
    );
}

/// Operators raise replicas with `nats stream edit`: a worker whose
/// setting differs keeps running, and says so.
#[tokio::test]
async fn other_replicas_are_kept_with_a_warning() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    NatsQueue::with_client(client.clone(), config.clone())
        .await
        .unwrap();
    let three = NatsConfig {
        replicas: 3,
        ..config
    };
    let q = NatsQueue::with_client(client, three).await.unwrap();
    assert_eq!(
        q.warnings(),
        [format!(
            "stream {prefix}: num_replicas is 1, herald is configured for 3; herald does not change an existing stream (`nats stream edit {prefix} --replicas 3` does)"
        )]
    );
}

/// On a server that is not in a cluster, 3 replicas can't be created: the
/// server's reason reaches the caller.
#[tokio::test]
async fn replicas_a_lone_server_cannot_keep_are_refused_by_the_server() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let three = NatsConfig {
        replicas: 3,
        ..NatsConfig::new(nats_url(), &prefix, ACK_WAIT)
    };
    let Err(e) = NatsQueue::with_client(client, three).await else {
        panic!("a lone server kept 3 replicas");
    };
    let m = e.to_string();
    assert!(m.contains(&format!("create stream {prefix}")), "{m}");
    assert!(m.contains("replicas > 1 not supported"), "{m}");
}

#[tokio::test]
async fn a_memory_stream_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    jetstream::new(client.clone())
        .create_stream(stream::Config {
            storage: stream::StorageType::Memory,
            ..work_queue(&config)
        })
        .await
        .unwrap();
    let m = config_error(NatsQueue::with_client(client, config).await);
    assert!(
        m.starts_with(&format!(
            "stream {prefix}: storage is Memory, herald needs File: a memory stream loses its notifications"
        )),
        "{m}"
    );
}

/// A consumer whose state is kept in memory is lost when its server
/// restarts, and every pull fails until it is created again.
#[tokio::test]
async fn a_memory_consumer_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    jetstream::new(client.clone())
        .create_stream(work_queue(&config))
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some(config.consumer.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_deliver: -1,
            max_ack_pending: -1,
            filter_subject: config.subject.clone(),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let m = config_error(NatsQueue::with_client(client, config).await);
    assert_eq!(
        m,
        format!(
            "consumer {prefix}_workers: mem_storage is true, herald needs false (fix or delete it)"
        )
    );
}

#[tokio::test]
async fn a_duplicate_window_shorter_than_the_publish_retries_is_refused() {
    let Some((client, prefix, _guard)) = setup().await else {
        return;
    };
    let config = NatsConfig::new(nats_url(), &prefix, ACK_WAIT);
    jetstream::new(client.clone())
        .create_stream(stream::Config {
            duplicate_window: Duration::from_secs(1),
            ..work_queue(&config)
        })
        .await
        .unwrap();
    let m = config_error(NatsQueue::with_client(client, config).await);
    assert!(
        m.starts_with(&format!(
            "stream {prefix}: duplicate_window is 1s, herald needs at least 15s"
        )),
        "{m}"
    );
}

/// The stream herald would create for `config`, as a test creates it
/// beforehand (override fields to make it differ).
fn work_queue(config: &NatsConfig) -> stream::Config {
    stream::Config {
        name: config.stream.clone(),
        subjects: vec![config.subject.clone()],
        retention: stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    }
}

/// A nats-server of this test's own with `args`; `None` after the
/// SKIPPED line (or the CI failure) when it can't run.
async fn own_server(test: &str, port: Option<u16>, args: &[&str]) -> Option<OwnServer> {
    let started = match port {
        Some(port) => OwnServer::start_on(port, args).await,
        None => OwnServer::start_with(args).await,
    };
    match started {
        Ok(s) => Some(s),
        Err(e) => {
            unreachable(test, "a nats-server of its own", &e);
            None
        }
    }
}

/// Connects to `url`; the error's text, or `None` when it connected (and
/// a notification went through).
async fn try_url(url: &str) -> Option<String> {
    match NatsQueue::connect(NatsConfig::new(url, "auth", ACK_WAIT)).await {
        Ok(q) => {
            q.publish(&[note()]).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(10), q.receive(1))
                .await
                .expect("a delivery")
                .unwrap();
            q.ack(&[got[0].tag.clone()]).await.unwrap();
            None
        }
        Err(e) => Some(e.to_string()),
    }
}

#[tokio::test]
async fn a_user_and_password_in_the_url_are_used_and_never_shown() {
    let password = "pa:ss@w/rd";
    let Some(server) = own_server(
        &test_name(),
        None,
        &["--user", "herald", "--pass", password],
    )
    .await
    else {
        return;
    };
    let port = server.port();
    let encoded = "pa%3Ass%40w%2Frd";
    assert_eq!(
        try_url(&format!("nats://herald:{encoded}@127.0.0.1:{port}")).await,
        None
    );

    let start = std::time::Instant::now();
    let m = try_url(&format!("nats://herald:wrong-pw@127.0.0.1:{port}"))
        .await
        .expect("a wrong password is refused");
    assert_eq!(
        m,
        format!("queue is misconfigured: connect to nats://herald:***@127.0.0.1:{port}: the server refused user \"herald\" with the password in the URL (authorization violation)")
    );
    // Refused credentials are not tried again for CONNECT_WAIT.
    assert!(
        start.elapsed() < herald_nats::CONNECT_WAIT,
        "{:?}",
        start.elapsed()
    );

    let m = try_url(&format!("nats://127.0.0.1:{port}"))
        .await
        .expect("no credentials are refused");
    assert!(m.contains("the server wants credentials"), "{m}");
}

#[tokio::test]
async fn a_token_in_the_url_is_used_and_never_shown() {
    let Some(server) = own_server(&test_name(), None, &["--auth", "t0ken"]).await else {
        return;
    };
    let port = server.port();
    assert_eq!(
        try_url(&format!("nats://t0ken@127.0.0.1:{port}")).await,
        None
    );
    let m = try_url(&format!("nats://n0pe@127.0.0.1:{port}"))
        .await
        .expect("a wrong token is refused");
    assert_eq!(
        m,
        format!("queue is misconfigured: connect to nats://***@127.0.0.1:{port}: the server refused the token in the URL (authorization violation)")
    );
}

#[tokio::test]
async fn an_unreadable_or_malformed_credentials_file_is_named() {
    let dir = tempfile_dir();
    let missing = dir.join("missing.creds");
    let config = |path: &std::path::Path| NatsConfig {
        credentials: Some(path.to_path_buf()),
        ..NatsConfig::new("nats://127.0.0.1:1", "creds", ACK_WAIT)
    };
    let m = config_error(NatsQueue::connect(config(&missing)).await);
    assert!(
        m.starts_with(&format!(
            "cannot read the credentials file {}",
            missing.display()
        )),
        "{m}"
    );
    let garbage = dir.join("garbage.creds");
    std::fs::write(&garbage, "not a creds file").unwrap();
    let m = config_error(NatsQueue::connect(config(&garbage)).await);
    assert!(
        m.starts_with(&format!(
            "the credentials file {} is not a NATS .creds file",
            garbage.display()
        )),
        "{m}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A NATS operator-mode setup, made once for these tests with Ed25519 keys
/// encoded as NKeys (what `nsc` does): operator `herald-test` signs the
/// accounts `HERALD` (JetStream without limits) and `SYS`; `HERALD` signs
/// the user `herald`. `STRANGER_*` is a user signed by an account the
/// server does not know. The seeds are test keys, used nowhere else.
mod operator_mode {
    /// The operator's JWT.
    pub const OPERATOR: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJpc3MiOiJPQkJOWk5WS05VRk1BTjVTQU1PMzJVTVBPNlcyNTRWQlhJSzJLU1ZBNU9VUlIzQkxEWVNaQUpVUyIsInN1YiI6Ik9CQk5aTlZLTlVGTUFONVNBTU8zMlVNUE82VzI1NFZCWElLMktTVkE1T1VSUjNCTERZU1pBSlVTIiwibmFtZSI6ImhlcmFsZC10ZXN0IiwibmF0cyI6eyJzeXN0ZW1fYWNjb3VudCI6IkFETVpMRkhQUjRTWjJQUTNDVEFVVzVMSjRFTU42VFYyNjZFSDU1Q09DVlZYRkpPSkNFR0gzV0hGIiwidHlwZSI6Im9wZXJhdG9yIiwidmVyc2lvbiI6Mn0sImlhdCI6MTcwMDAwMDAwMCwianRpIjoiVFVQVFNRRklDNTRNTVVQTjJWTTVUR0lTVU5FSk5HT1lUVUtKRVRRVzdQWEZIR1dCNTRQQSJ9.j63Tu8zdZyixcxh-6jfDy9RN2l3-I0iJBvLBgal1tgH9eI7hwz1otRu2EIzOBz8QdTz2OFMr7g1WIRcgf6JLDg";
    /// Account `HERALD`'s public key.
    pub const ACCOUNT_PUB: &str = "ACEIVBMW4JYJENUOPYD5SGS2NMQOKVX2BADQZAZGISKOPZ2DIOKVWMPG";
    /// Account `HERALD`'s JWT.
    pub const ACCOUNT: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJpc3MiOiJPQkJOWk5WS05VRk1BTjVTQU1PMzJVTVBPNlcyNTRWQlhJSzJLU1ZBNU9VUlIzQkxEWVNaQUpVUyIsInN1YiI6IkFDRUlWQk1XNEpZSkVOVU9QWUQ1U0dTMk5NUU9LVlgyQkFEUVpBWkdJU0tPUFoyRElPS1ZXTVBHIiwibmFtZSI6IkhFUkFMRCIsIm5hdHMiOnsibGltaXRzIjp7InN1YnMiOi0xLCJkYXRhIjotMSwicGF5bG9hZCI6LTEsImltcG9ydHMiOi0xLCJleHBvcnRzIjotMSwid2lsZGNhcmRzIjp0cnVlLCJjb25uIjotMSwibGVhZiI6LTEsIm1lbV9zdG9yYWdlIjotMSwiZGlza19zdG9yYWdlIjotMSwic3RyZWFtcyI6LTEsImNvbnN1bWVyIjotMX0sImRlZmF1bHRfcGVybWlzc2lvbnMiOnsicHViIjp7fSwic3ViIjp7fX0sInR5cGUiOiJhY2NvdW50IiwidmVyc2lvbiI6Mn0sImlhdCI6MTcwMDAwMDAwMCwianRpIjoiNkJKSTRGR1Q0R1NLSFVBV0NVM0lYV1hNUUNSNkk2UFNRQzc1QlpXR1ZDNUw1QVhVSUlKQSJ9.zY9OC8gZ1h8wYToYdNynHHFq533orNvCrPNjQcLHJk4wMey8IKcdOnyOIHS1Dyg3A_I52GeqU0wgiWqefu2RBw";
    /// Account `SYS`'s public key.
    pub const SYS_PUB: &str = "ADMZLFHPR4SZ2PQ3CTAUW5LJ4EMN6TV266EH55COCVVXFJOJCEGH3WHF";
    /// Account `SYS`'s JWT.
    pub const SYS: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJpc3MiOiJPQkJOWk5WS05VRk1BTjVTQU1PMzJVTVBPNlcyNTRWQlhJSzJLU1ZBNU9VUlIzQkxEWVNaQUpVUyIsInN1YiI6IkFETVpMRkhQUjRTWjJQUTNDVEFVVzVMSjRFTU42VFYyNjZFSDU1Q09DVlZYRkpPSkNFR0gzV0hGIiwibmFtZSI6IlNZUyIsIm5hdHMiOnsibGltaXRzIjp7InN1YnMiOi0xLCJkYXRhIjotMSwicGF5bG9hZCI6LTEsImltcG9ydHMiOi0xLCJleHBvcnRzIjotMSwid2lsZGNhcmRzIjp0cnVlLCJjb25uIjotMSwibGVhZiI6LTF9LCJkZWZhdWx0X3Blcm1pc3Npb25zIjp7InB1YiI6e30sInN1YiI6e319LCJ0eXBlIjoiYWNjb3VudCIsInZlcnNpb24iOjJ9LCJpYXQiOjE3MDAwMDAwMDAsImp0aSI6IjZMT1lVWUJGSEhLS1Q1T09URFVVRVRLWEVZS0hIT0FKVEdZRDJPVE9BUFdDVUtUT1VRU1EifQ.yunURlB23wMY5G1SjI2fWqiPLvfCjc1Gcj7QkZEkegIGMhWLMEmUByn-ZN82NQFBKkRs4qN3WhEalPKS5MIeAA";
    /// User `herald`'s JWT.
    pub const USER_JWT: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJpc3MiOiJBQ0VJVkJNVzRKWUpFTlVPUFlENVNHUzJOTVFPS1ZYMkJBRFFaQVpHSVNLT1BaMkRJT0tWV01QRyIsInN1YiI6IlVBRVkyVVJIQUJOS1NVRFlKWk1RWkpHWFhCSFlCR09XUkVMVDUyWUtQUTJKV1NTM1JKMlJPQUxWIiwibmFtZSI6ImhlcmFsZCIsIm5hdHMiOnsicHViIjp7fSwic3ViIjp7fSwic3VicyI6LTEsImRhdGEiOi0xLCJwYXlsb2FkIjotMSwidHlwZSI6InVzZXIiLCJ2ZXJzaW9uIjoyfSwiaWF0IjoxNzAwMDAwMDAwLCJqdGkiOiJLWEJUTENJSjVFNDZPSDdSVFdZV1czSk1UUkxQUVdOUllSTVFMWkVUTVQyNjREVVJMRk1BIn0.hu5Y_PX3wCk35Kd1oL1BuP0JsSsb7d1u9Af-s7oVORsCuecUsNo3j1iRVmYyB_ikyOqO7nHONUfU63lXk21VAA";
    /// User `herald`'s NKey seed.
    pub const USER_SEED: &str = "SUAARCVEANY6THVHFTXKMT547II23HBPJO52W644UEHZAQQ7KOGGFKKCKY";
    /// A user of an unknown account: its JWT.
    pub const STRANGER_JWT: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJpc3MiOiJBRFZKM0FPSlFHUTJFS0VJQzJYNFpCTUZFRkhDQUJURUVUNkVRRlVaTUFDS1ZPMktaWFZDREY3UiIsInN1YiI6IlVEM0FBT1NGSFVWV1hOVlRVVzQ3TE81NkVXSE5TSkZRWFBOUjZFRUhKR0QyRU5FR0lDUkJCVUdPIiwibmFtZSI6InN0cmFuZ2VyIiwibmF0cyI6eyJwdWIiOnt9LCJzdWIiOnt9LCJzdWJzIjotMSwiZGF0YSI6LTEsInBheWxvYWQiOi0xLCJ0eXBlIjoidXNlciIsInZlcnNpb24iOjJ9LCJpYXQiOjE3MDAwMDAwMDAsImp0aSI6IkJXU1pURTJHQ0FIT0dJMlBGVTRVSU1WVE5TTFFFR09FUDVCT1lSWElPRlFYQUpOS0xLR1EifQ.cT6FFigTkuI5q-uhlx9bPSzBo3sFcggv7R154C4PPUlMD2nfxqiseIUtN38Ujm9o7Duiv4zR30fPzhzWCMr-Cw";
    /// A user of an unknown account: its NKey seed.
    pub const STRANGER_SEED: &str = "SUACHVCL3TJ5UI3W5P6SMZ6M37R454LWWTJYCDLW4Y2FI7L4PWVOF22M6U";
}

/// A `.creds` file's text, as `nsc` writes it.
fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// A credentials file lets herald into a server in operator mode (JWT
/// accounts); a user of an account the server does not know is refused,
/// and the message names the file; no credentials at all, too.
#[tokio::test]
async fn a_credentials_file_is_used() {
    use operator_mode::*;
    let test = test_name();
    let dir = tempfile_dir();
    let conf = dir.join("server.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: {OPERATOR}\nsystem_account: {SYS_PUB}\nresolver: MEMORY\nresolver_preload: {{\n  {ACCOUNT_PUB}: {ACCOUNT}\n  {SYS_PUB}: {SYS}\n}}\n"
        ),
    )
    .unwrap();
    let Some(server) = own_server(&test, None, &["-c", conf.to_str().unwrap()]).await else {
        return;
    };
    let url = format!("nats://127.0.0.1:{}", server.port());
    let herald_creds = dir.join("herald.creds");
    std::fs::write(&herald_creds, creds_file(USER_JWT, USER_SEED)).unwrap();
    let stranger_creds = dir.join("stranger.creds");
    std::fs::write(&stranger_creds, creds_file(STRANGER_JWT, STRANGER_SEED)).unwrap();
    let with = |path: Option<&std::path::Path>| NatsConfig {
        credentials: path.map(|p| p.to_path_buf()),
        ..NatsConfig::new(&url, "creds", ACK_WAIT)
    };

    let q = NatsQueue::connect(with(Some(&herald_creds))).await.unwrap();
    q.publish(&[note()]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), q.receive(1))
        .await
        .expect("a delivery")
        .unwrap();
    q.ack(&[got[0].tag.clone()]).await.unwrap();

    let m = config_error(NatsQueue::connect(with(Some(&stranger_creds))).await);
    assert_eq!(
        m,
        format!(
            "connect to {url}: the server refused the credentials file {} (authorization violation)",
            stranger_creds.display()
        )
    );
    let m = config_error(NatsQueue::connect(with(None)).await);
    assert!(m.contains("the server wants credentials"), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A new directory under the system's temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("herald-creds-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A worker that starts before its NATS server waits for it (up to
/// `CONNECT_WAIT`), instead of failing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_waits_for_a_server_that_starts_late() {
    let test = test_name();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let connecting = tokio::spawn(NatsQueue::connect(NatsConfig::new(url, "late", ACK_WAIT)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Some(_server) = own_server(&test, Some(port), &[]).await else {
        connecting.abort();
        return;
    };
    let q = connecting
        .await
        .unwrap()
        .expect("connected once the server is up");
    q.publish(&[note()]).await.unwrap();
}
