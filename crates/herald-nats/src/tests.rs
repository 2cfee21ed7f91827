//! Unit tests of the URL's credentials, the config's checks and the
//! consumer's check.

use super::*;
use crate::auth::percent_decode;

#[test]
fn urls_are_shown_without_their_secrets() {
    let cases = [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        (
            "nats://herald:s3cret@nats-1:4222",
            "nats://herald:***@nats-1:4222",
        ),
        ("tls://tok3n@nats-1:4222", "tls://***@nats-1:4222"),
        // An `@` in the password, not encoded: the last `@` ends it.
        ("nats://u:p@ss@h:4222/x", "nats://u:***@h:4222/x"),
        ("u:pw@h:4222", "u:***@h:4222"),
        ("nats://h:4222/a@b", "nats://h:4222/a@b"),
    ];
    for (url, shown) in cases {
        assert_eq!(redact_credentials(url), shown, "{url}");
    }
}

#[test]
fn credentials_are_split_off_the_url_and_decoded() {
    let (url, auth) = split_auth("nats://herald:p%40ss%3Aw@h:4222");
    assert_eq!(url, "nats://h:4222");
    assert!(matches!(auth, UrlAuth::UserPassword(u, p) if u == "herald" && p == "p@ss:w"),);
    let (url, auth) = split_auth("tls://t0k%2F@h");
    assert_eq!(url, "tls://h");
    assert!(matches!(auth, UrlAuth::Token(t) if t == "t0k/"));
    let (url, auth) = split_auth("nats://h:4222");
    assert_eq!(url, "nats://h:4222");
    assert!(matches!(auth, UrlAuth::None));
    assert_eq!(percent_decode("a%zz%4"), "a%zz%4");
}

#[test]
fn the_minimum_duplicate_window_covers_every_try_of_a_publish() {
    let pauses: Duration = (1..PUBLISH_TRIES).map(|n| PUBLISH_PAUSE * n).sum();
    let span = PUBLISH_TIMEOUT * (PUBLISH_TRIES - 1) + pauses;
    assert_eq!(span, Duration::from_millis(10_600));
    assert!(MIN_DUPLICATE_WINDOW > span);
    assert!(DEFAULT_DUPLICATE_WINDOW >= MIN_DUPLICATE_WINDOW);
}

#[test]
fn settings_the_server_or_herald_would_refuse_are_refused_first() {
    let ok = NatsConfig::new("nats://h", "herald", Duration::from_secs(30));
    assert!(ok.check().is_ok());
    let refused = |c: NatsConfig| match c.check() {
        Err(QueueError::Config(m)) => m,
        other => panic!("accepted: {other:?}"),
    };
    let m = refused(NatsConfig {
        replicas: 6,
        ..ok.clone()
    });
    assert!(m.contains("replicas is 6: JetStream keeps 1 to 5"), "{m}");
    let m = refused(NatsConfig {
        max_ack_pending: 0,
        ..ok.clone()
    });
    assert!(m.contains("max_ack_pending is 0"), "{m}");
    let m = refused(NatsConfig {
        duplicate_window: Duration::from_secs(1),
        ..ok.clone()
    });
    assert!(m.contains("at least 15s"), "{m}");
    let m = refused(NatsConfig {
        url: "nats://u:secret@h".into(),
        credentials: Some("/etc/herald.creds".into()),
        ..ok.clone()
    });
    assert!(m.contains("nats://u:***@h holds credentials"), "{m}");
    assert!(!m.contains("secret"), "{m}");
}

#[test]
fn a_consumer_with_replicas_of_its_own_unlike_its_streams_is_kept_with_a_warning() {
    let config = NatsConfig::new("nats://h", "herald", Duration::from_secs(30));
    let consumer = consumer::Config {
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        max_ack_pending: -1,
        num_replicas: 1,
        ..Default::default()
    };
    assert_eq!(
        check_consumer(&config, &consumer, 3).unwrap(),
        ["consumer herald_workers: num_replicas is 1, its stream has 3; herald does not change an existing consumer"]
    );
    assert!(check_consumer(&config, &consumer, 1).unwrap().is_empty());
    let following = consumer::Config {
        num_replicas: 0,
        ..consumer
    };
    assert!(check_consumer(&config, &following, 3).unwrap().is_empty());
}

#[test]
fn the_debug_form_hides_the_password() {
    let c = NatsConfig::new("nats://u:secret@h", "herald", Duration::from_secs(30));
    let shown = format!("{c:?}");
    assert!(shown.contains("nats://u:***@h"), "{shown}");
    assert!(!shown.contains("secret"), "{shown}");
}

#[test]
fn a_delay_is_waited_once_from_the_servers_publish_time() {
    let published = 1_000_000;
    let first = Some((1, published));
    // Pulled at once: the whole delay; after 400 ms in the stream: the rest.
    assert_eq!(
        first_delivery_wait(Some(3000), first, published),
        Some(Duration::from_millis(3000))
    );
    assert_eq!(
        first_delivery_wait(Some(3000), first, published + 400),
        Some(Duration::from_millis(2600))
    );
    // This process's clock 5 minutes behind the server's: not longer than
    // the delay (it used to be the publisher's clock against this one).
    assert_eq!(
        first_delivery_wait(Some(3000), first, published - 300_000),
        Some(Duration::from_millis(3000))
    );
    // 5 minutes ahead: delivered (early; the store puts it back for the
    // time left by its clock).
    assert_eq!(
        first_delivery_wait(Some(3000), first, published + 300_000),
        None
    );
    // A redelivery, no delay, or no metadata: delivered.
    assert_eq!(
        first_delivery_wait(Some(3000), Some((2, published)), published),
        None
    );
    assert_eq!(first_delivery_wait(None, first, published), None);
    assert_eq!(first_delivery_wait(Some(0), first, published), None);
    assert_eq!(first_delivery_wait(Some(3000), None, published), None);
}
