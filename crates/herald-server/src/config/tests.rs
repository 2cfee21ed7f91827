//! The configuration's tests: files, environment and flags together, and
//! every refusal's message.

use super::*;
use std::collections::HashMap;
use std::io::Write;

const HASH_A: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
const HASH_B: &str = "0ffe1abd1a08215353c233d6e009613e95eec4253832a761af28ff37ac5a150c";

fn load_with(
    file: Option<&str>,
    env: &[(&str, &str)],
    flags: Overrides,
) -> Result<ServeConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let mut flags = flags;
    if let Some(text) = file {
        let path = dir.path().join("herald.toml");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        flags.config = Some(path);
    }
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load(&flags, &|k| env.get(k).cloned())
}

fn nats(c: &ServeConfig) -> &herald_nats::NatsConfig {
    match &c.queue {
        QueueConfig::Nats(n) => n,
        other => panic!("not a NATS queue: {other}"),
    }
}

fn pubsub(c: &ServeConfig) -> &herald_pubsub::PubsubConfig {
    match &c.queue {
        QueueConfig::Pubsub(p) => p,
        other => panic!("not a Pub/Sub queue: {other}"),
    }
}

fn message(r: Result<ServeConfig, ConfigError>) -> String {
    r.expect_err("should be refused").to_string()
}

#[test]
fn no_configuration_means_herald_db_and_the_memory_queue_on_loopback() {
    // Run from a directory without a herald.toml.
    let c = load_with(None, &[], Overrides::default()).unwrap();
    assert_eq!(c.store, StoreLocation::Sqlite("herald.db".into()));
    assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
    assert!(c.auth.is_open());
    assert!(c.handlers.is_empty());
    assert_eq!(c.max_payload_bytes, 1 << 20);
    assert_eq!(c.shutdown_grace, DEFAULT_GRACE);
}

#[test]
fn flags_override_env_which_overrides_the_file() {
    let file = r#"
        store = "sqlite:///tmp/from-file.db"
        listen = "127.0.0.1:1"
        [worker]
        concurrency = 3
        lease = "10s"
    "#;
    let c = load_with(
        Some(file),
        &[
            ("HERALD_LISTEN", "127.0.0.1:2"),
            ("HERALD_STORE", "sqlite:///tmp/from-env.db"),
            ("HERALD_WORKER_CONCURRENCY", "7"),
        ],
        Overrides {
            store: Some("postgres://u@h/db".into()),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(c.store, StoreLocation::Postgres("postgres://u@h/db".into()));
    assert_eq!(c.listen, "127.0.0.1:2".parse().unwrap());
    assert_eq!(c.worker.concurrency, 7);
    assert_eq!(c.worker.lease, Duration::from_secs(10));
}

#[test]
fn every_section_is_read() {
    let file = format!(
        r#"
        store = "plain.db"
        pg_schema = "herald_x"
        queue = "memory"
        listen = "0.0.0.0:9000"
        max_payload_bytes = 1000
        max_request_bytes = 5000
        max_batch = 10
        [worker]
        batch = 5
        claim_ahead = 2
        sweep_every = "1s"
        sweep_quiet = "2m"
        dead_retention = "1d"
        done_retention = "1h"
        reconcile = false
        name = "w1"
        shutdown_grace = "3s"
        [worker.retry]
        base = "100ms"
        max = "10s"
        factor = 3.0
        jitter = 0.5
        [auth]
        operator_token_sha256 = "{HASH_A}"
        [auth.tenants]
        "acme/eu" = "{HASH_B}"
        [handlers.send_email]
        kind = "webhook"
        url = "http://x"
        "#
    );
    let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
    assert_eq!(c.store, StoreLocation::Sqlite("plain.db".into()));
    assert_eq!(c.pg_schema, "herald_x");
    assert_eq!(
        (c.max_payload_bytes, c.max_request_bytes, c.max_batch),
        (1000, 5000, 10)
    );
    assert_eq!(c.worker.batch, 5);
    assert_eq!(c.worker.claim_ahead, Some(2));
    assert_eq!(c.worker.sweep_quiet, Duration::from_secs(120));
    assert_eq!(c.worker.done_retention, Some(Duration::from_secs(3600)));
    assert!(!c.worker.reconcile);
    assert_eq!(c.worker.policy.retry.factor, 3.0);
    assert_eq!(c.shutdown_grace, Duration::from_secs(3));
    assert!(c.auth.operator.is_some());
    assert_eq!(c.auth.tenants[0].0, "acme/eu");
    assert_eq!(c.handlers["send_email"]["kind"].as_str(), Some("webhook"));
}

#[test]
fn unknown_keys_are_named_with_their_section() {
    let m = message(load_with(
        Some("[worker]\nconcurency = 3\n"),
        &[],
        Overrides::default(),
    ));
    assert!(
        m.contains("worker.concurency: unknown key; expected one of"),
        "{m}"
    );
    assert!(m.contains("`concurrency`"), "{m}");
    let m = message(load_with(Some("stor = \"x\"\n"), &[], Overrides::default()));
    assert!(m.contains(": stor: unknown key"), "{m}");
    assert!(m.contains("herald.toml"), "{m}");
}

#[test]
fn bad_values_name_the_key_and_the_fix() {
    let cases: &[(&str, &str)] = &[
        (
            "[worker]\nlease = \"soon\"",
            "worker.lease: \"soon\" is not a duration",
        ),
        (
            "[worker]\nlease = 30",
            "worker.lease: expected a duration as a string",
        ),
        (
            "[worker]\nconcurrency = 0",
            "worker.concurrency: 0 is not enough: it must be at least 1 (64 is the default)",
        ),
        (
            "[worker]\nconcurrency = \"many\"",
            "worker.concurrency: invalid type",
        ),
        (
            "[worker]\nlease = \"10ms\"",
            "worker.lease: 10ms is too short",
        ),
        (
            "listen = \"localhost\"",
            "listen: \"localhost\" is not an IP address and port",
        ),
        (
            "queue = \"kafka://x\"",
            "queue: \"kafka://x\" is not a queue this build has",
        ),
        (
            "store = \"mysql://x\"",
            "store: \"mysql\" is not a store this build knows",
        ),
        (
            "[auth]\noperator_token_sha256 = \"hunter2\"",
            "auth.operator_token_sha256: is 7 characters long",
        ),
        (
            "max_payload_bytes = 100\nmax_request_bytes = 50",
            "max_request_bytes: 50 is not more than max_payload_bytes",
        ),
        (
            "[worker.retry]\njitter = 2.0",
            "worker.retry.jitter: 2 is not a fraction",
        ),
    ];
    for (file, want) in cases {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(want), "{file:?}: {m}");
    }
}

#[test]
fn tenant_tokens_must_be_distinct_and_names_valid() {
    let m = message(load_with(
        Some(&format!(
            "[auth]\noperator_token_sha256 = \"{HASH_A}\"\n[auth.tenants]\nacme = \"{HASH_A}\"\n"
        )),
        &[],
        Overrides::default(),
    ));
    assert!(
        m.contains("auth.tenants.acme: is the operator token's digest"),
        "{m}"
    );
    let m = message(load_with(
        Some(&format!(
            "[auth.tenants]\na = \"{HASH_A}\"\nb = \"{HASH_A}\"\n"
        )),
        &[],
        Overrides::default(),
    ));
    assert!(
        m.contains("auth.tenants.b: is also tenant \"a\"'s digest"),
        "{m}"
    );
    let m = message(load_with(
        Some(&format!("[auth.tenants]\n\"a\\nb\" = \"{HASH_A}\"\n")),
        &[],
        Overrides::default(),
    ));
    assert!(m.contains("control character"), "{m}");
}

#[test]
fn errors_say_which_source_the_value_came_from() {
    let m = message(load_with(
        None,
        &[("HERALD_WORKER_LEASE", "forever")],
        Overrides::default(),
    ));
    assert!(
        m.starts_with("environment variable HERALD_WORKER_LEASE: worker.lease:"),
        "{m}"
    );
    let m = message(load_with(
        None,
        &[("HERALD_WORKER_CONCURRENCY", "x")],
        Overrides::default(),
    ));
    assert!(
        m.contains("HERALD_WORKER_CONCURRENCY: worker.concurrency: \"x\" is not a whole number"),
        "{m}"
    );
    let m = message(load_with(
        None,
        &[],
        Overrides {
            listen: Some("nowhere".into()),
            ..Overrides::default()
        },
    ));
    assert!(m.starts_with("--listen: listen:"), "{m}");
}

#[test]
fn without_a_token_only_loopback_is_allowed() {
    let m = message(load_with(
        Some("listen = \"0.0.0.0:7878\""),
        &[],
        Overrides::default(),
    ));
    assert!(m.contains("no API token is configured"), "{m}");
    let c = load_with(
        Some("listen = \"0.0.0.0:7878\""),
        &[("HERALD_OPERATOR_TOKEN_SHA256", HASH_A)],
        Overrides::default(),
    )
    .unwrap();
    assert!(!c.auth.is_open());
    assert!(load_with(Some("listen = \"[::1]:0\""), &[], Overrides::default()).is_ok());
}

#[test]
fn a_missing_or_broken_file_says_so() {
    let m = message(load_with(
        None,
        &[],
        Overrides {
            config: Some("/nonexistent/herald.toml".into()),
            ..Overrides::default()
        },
    ));
    assert!(
        m.contains("cannot read the config file /nonexistent/herald.toml"),
        "{m}"
    );
    let m = message(load_with(Some("store = "), &[], Overrides::default()));
    assert!(m.contains("is not valid TOML"), "{m}");
}

#[test]
fn passwords_are_not_shown() {
    let s = StoreLocation::Postgres("postgres://app:secret@db:5432/app".into());
    assert_eq!(s.to_string(), "postgres://app:***@db:5432/app");
    let lease = Duration::from_secs(9);
    let q = QueueConfig::Nats(herald_nats::NatsConfig::new(
        "nats://herald:secret@nats-1:4222",
        "herald",
        lease,
    ));
    assert_eq!(q.to_string(), "nats://herald:***@nats-1:4222");
    assert!(!format!("{q:?}").contains("secret"), "{q:?}");
    let q = QueueConfig::Nats(herald_nats::NatsConfig::new(
        "tls://secret@nats-1:4222",
        "herald",
        lease,
    ));
    assert_eq!(q.to_string(), "tls://***@nats-1:4222");
    let m = message(load_with(
        Some("queue = \"nat://herald:secret@nats-1:4222\""),
        &[],
        Overrides::default(),
    ));
    assert!(
        m.contains("\"nat://herald:***@nats-1:4222\" is not a queue"),
        "{m}"
    );
    assert!(!m.contains("secret"), "{m}");
}

#[test]
fn nats_and_pool_settings_have_defaults() {
    let c = load_with(
        None,
        &[("HERALD_QUEUE", "nats://n1:4222")],
        Overrides::default(),
    )
    .unwrap();
    let n = nats(&c);
    assert_eq!(n.replicas, 1);
    assert_eq!(n.max_ack_pending, 100_000);
    assert_eq!(n.credentials, None);
    assert_eq!(n.stream, "herald");
    assert_eq!(n.ack_wait, c.worker.lease, "the ack wait is the lease");
    assert_eq!(c.pg_max_connections, 10);
    assert_eq!(c.pg_acquire_timeout, Duration::from_secs(10));
    assert_eq!(
        c.pg_run_commits,
        RunCommits::UnflushedClaims,
        "claims skip the flush by default, settles wait for it"
    );
}

#[test]
fn nats_and_pool_settings_are_read_from_the_file_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("herald.creds");
    std::fs::write(&creds, "").unwrap();
    let file = format!(
        "queue = \"nats://n1:4222\"\nnats_replicas = 3\nnats_max_ack_pending = 250000\nnats_credentials = \"{}\"\npg_max_connections = 32\npg_acquire_timeout = \"2s\"\npg_run_commits = \"unflushed\"\n",
        creds.display()
    );
    let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
    let n = nats(&c);
    assert_eq!(n.url, "nats://n1:4222");
    assert_eq!(n.replicas, 3);
    assert_eq!(n.max_ack_pending, 250_000);
    assert_eq!(n.credentials, Some(creds.clone()));
    assert_eq!(c.pg_max_connections, 32);
    assert_eq!(c.pg_acquire_timeout, Duration::from_secs(2));
    assert_eq!(c.pg_run_commits, RunCommits::Unflushed);
    let c = load_with(
        Some(&file),
        &[
            ("HERALD_NATS_REPLICAS", "5"),
            ("HERALD_NATS_MAX_ACK_PENDING", "7"),
            ("HERALD_PG_MAX_CONNECTIONS", "4"),
            ("HERALD_PG_ACQUIRE_TIMEOUT", "500ms"),
            ("HERALD_PG_RUN_COMMITS", "flushed"),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        (
            nats(&c).replicas,
            nats(&c).max_ack_pending,
            c.pg_max_connections
        ),
        (5, 7, 4)
    );
    assert_eq!(c.pg_acquire_timeout, Duration::from_millis(500));
    assert_eq!(
        c.pg_run_commits,
        RunCommits::Flushed,
        "the environment overrides the file"
    );
    let bad = |file: Option<&str>, env: &[(&str, &str)]| {
        message(load_with(file, env, Overrides::default()))
    };
    let m = bad(Some("pg_run_commits = \"async\""), &[]);
    assert!(
        m.contains("pg_run_commits: \"async\" is not a way to commit runs: write one of \"flushed\", \"unflushed-claims\" (the default), \"unflushed\""),
        "{m}"
    );
    let c = load_with(
        None,
        &[
            ("HERALD_QUEUE", "nats://n1:4222"),
            ("HERALD_NATS_CREDENTIALS", creds.to_str().unwrap()),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(nats(&c).credentials, Some(creds));
}

#[test]
fn a_pubsub_queue_is_read_with_its_settings_from_the_file_and_the_environment() {
    let c = load_with(
        None,
        &[("HERALD_QUEUE", "pubsub://my-project/herald")],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(pubsub(&c).max_outstanding, 1_000);
    assert_eq!(pubsub(&c).credentials, None);
    assert_eq!(
        pubsub(&c).ack_wait,
        c.worker.lease,
        "the ack wait is the lease"
    );
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sa.json");
    std::fs::write(&key, "{}").unwrap();
    let file = format!(
        "queue = \"pubsub://my-project/herald?subscription=workers\"\npubsub_max_outstanding = 500\npubsub_credentials = \"{}\"\n",
        key.display()
    );
    let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
    let p = pubsub(&c);
    assert_eq!(
        (
            p.project.as_str(),
            p.topic.as_str(),
            p.subscription.as_str()
        ),
        ("my-project", "herald", "workers")
    );
    assert_eq!(
        c.queue.to_string(),
        "pubsub://my-project/herald?subscription=workers"
    );
    assert_eq!(pubsub(&c).max_outstanding, 500);
    assert_eq!(pubsub(&c).credentials, Some(key.clone()));
    let c = load_with(
        None,
        &[
            ("HERALD_QUEUE", "pubsub://my-project/events"),
            ("HERALD_PUBSUB_MAX_OUTSTANDING", "64"),
            ("HERALD_PUBSUB_CREDENTIALS", key.to_str().unwrap()),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        c.queue.to_string(),
        "pubsub://my-project/events?subscription=events-workers"
    );
    assert_eq!(pubsub(&c).max_outstanding, 64);
    assert_eq!(pubsub(&c).pull, herald_pubsub::PullMode::Streaming);
    assert_eq!(pubsub(&c).credentials, Some(key));
    let c = load_with(
        None,
        &[
            ("HERALD_QUEUE", "pubsub://my-project/events"),
            ("HERALD_PUBSUB_PULL", "unary"),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(pubsub(&c).pull, herald_pubsub::PullMode::Unary);
    assert_eq!(pubsub(&c).credentials, None);
}

#[test]
fn bad_pubsub_settings_name_the_key_and_the_fix() {
    let cases: &[(&str, &str)] = &[
        (
            "queue = \"pubsub://my-project\"",
            "queue: \"pubsub://my-project\" names no topic; write pubsub://PROJECT/TOPIC?subscription=NAME",
        ),
        (
            "queue = \"pubsub://my-project/t?subscriptions=x\"",
            "queue: \"pubsub://my-project/t?subscriptions=x\" has an unknown parameter",
        ),
        (
            "queue = \"pubsub://P/herald\"",
            "queue: \"P\" is not a Google Cloud project id",
        ),
        (
            "queue = \"pubsub://my-project/herald\"\npubsub_max_outstanding = 0",
            "pubsub_max_outstanding: 0 is not a usable number of outstanding messages: write a whole number from 1 (1000 is the default",
        ),
        (
            "queue = \"pubsub://my-project/herald\"\npubsub_credentials = \"/nonexistent/sa.json\"",
            "pubsub_credentials: cannot read /nonexistent/sa.json: No such file",
        ),
        (
            "queue = \"pubsub://my-project/herald\"\npubsub_credentials = \"/\"",
            "pubsub_credentials: / is not a file",
        ),
        (
            "queue = \"pubsub://my-project/herald\"\npubsub_pull = \"push\"",
            "pubsub_pull: \"push\" is not a way to pull: write \"streaming\" (the default) or \"unary\"",
        ),
        (
            "queue = \"pubsub://my-project/herald\"\n[worker]\nlease = \"11m\"",
            "worker.lease: 660s is too long for Pub/Sub, which holds a delivery for at most 600s",
        ),
    ];
    for (file, says) in cases {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(says), "{file}: {m}");
    }
    let c = load_with(
        Some("queue = \"pubsub://my-project/herald\"\n[worker]\nlease = \"3s\""),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        c.worker.lease,
        Duration::from_secs(3),
        "a lease under Pub/Sub's 10 s minimum deadline is fine"
    );
}

#[test]
fn a_queue_table_says_the_same_as_the_flat_keys() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sa.json");
    std::fs::write(&key, "{}").unwrap();
    let file = format!(
        "[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"herald\"\nsubscription = \"workers\"\nmax_outstanding = 500\ncredentials = \"{}\"\npull = \"unary\"\n",
        key.display()
    );
    let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
    assert_eq!(
        c.queue.to_string(),
        "pubsub://my-project/herald?subscription=workers"
    );
    let p = pubsub(&c);
    assert_eq!(p.max_outstanding, 500);
    assert_eq!(p.credentials, Some(key));
    assert_eq!(p.pull, herald_pubsub::PullMode::Unary);
    // The environment overrides a table's key as it would the flat one,
    // and HERALD_QUEUE the location only.
    let c = load_with(
        Some(&file),
        &[
            ("HERALD_PUBSUB_PULL", "streaming"),
            ("HERALD_QUEUE", "pubsub://my-project/other"),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(pubsub(&c).pull, herald_pubsub::PullMode::Streaming);
    assert_eq!(pubsub(&c).max_outstanding, 500);
    assert_eq!(pubsub(&c).topic, "other");
    let c = load_with(
        Some("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"herald\"\n"),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(pubsub(&c).subscription, "herald-workers");
    let c = load_with(
        Some("[queue]\nkind = \"nats\"\nurl = \"nats://n1:4222\"\nstream = \"events\"\nreplicas = 3\nmax_ack_pending = 500\n"),
        &[],
        Overrides::default(),
    )
    .unwrap();
    let n = nats(&c);
    assert_eq!(
        (
            n.url.as_str(),
            n.stream.as_str(),
            n.replicas,
            n.max_ack_pending
        ),
        ("nats://n1:4222", "events", 3, 500)
    );
    let c = load_with(
        Some("[queue]\nkind = \"memory\"\n"),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert!(matches!(c.queue, QueueConfig::Memory(_)));
}

#[test]
fn a_bad_queue_table_names_its_key() {
    let cases: &[(&str, &str)] = &[
        ("[queue]\nurl = \"nats://n1:4222\"", "queue.kind: is missing: a [queue] table says its kind, one of [\"memory\", \"nats\", \"pubsub\"]"),
        ("[queue]\nkind = \"kafka\"", "queue.kind: \"kafka\" is not a queue this build has"),
        ("[queue]\nkind = 3", "queue.kind: 3 is not a queue kind"),
        ("[queue]\nkind = \"nats\"", "queue.url: is missing: a NATS queue needs its server"),
        ("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"", "queue.topic: is missing"),
        ("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"events\"\nstream = \"x\"", "queue.stream: unknown key for a pubsub queue; expected kind or one of [\"project\", \"topic\", \"subscription\", \"max_outstanding\", \"credentials\", \"pull\", \"max_ids\", \"max_bytes\"]"),
        ("[queue]\nkind = \"memory\"\nurl = \"x\"", "queue.url: unknown key for a memory queue"),
        ("[queue]\nkind = \"nats\"\nurl = 4222", "queue.url: 4222 is not text"),
        ("nats_stream = \"a\"\n[queue]\nkind = \"nats\"\nurl = \"nats://n1:4222\"\nstream = \"b\"", "queue.stream: is set here and as nats_stream too: keep one"),
        // Errors found after lifting name the table's key.
        ("[queue]\nkind = \"nats\"\nurl = \"nats://n1:4222\"\nreplicas = 9", "queue.replicas: 9 is not a number of replicas"),
        ("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"events\"\npull = \"push\"", "queue.pull: \"push\" is not a way to pull"),
        ("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"events\"\nmax_outstanding = \"many\"", "queue.max_outstanding: invalid type"),
    ];
    for (file, says) in cases {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(says), "{file}: {m}");
        assert!(m.contains("herald.toml"), "{file}: {m}");
    }
    // An environment variable that overrides a table's key is named as itself.
    let m = message(load_with(
        Some("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"events\"\npull = \"unary\""),
        &[("HERALD_PUBSUB_PULL", "push")],
        Overrides::default(),
    ));
    assert!(
        m.starts_with("environment variable HERALD_PUBSUB_PULL: pubsub_pull: \"push\""),
        "{m}"
    );
}

#[test]
fn every_queue_s_keys_are_checked_whichever_queue_is_used() {
    for (file, says) in [
        (
            "nats_replicas = 9",
            "nats_replicas: 9 is not a number of replicas",
        ),
        (
            "queue = \"nats://n1:4222\"\npubsub_pull = \"push\"",
            "pubsub_pull: \"push\" is not a way to pull",
        ),
    ] {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(says), "{file}: {m}");
    }
    let c = load_with(
        Some("nats_stream = \"events\"\npubsub_pull = \"unary\""),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert!(matches!(c.queue, QueueConfig::Memory(_)), "{c:?}");
}

#[test]
fn bad_nats_and_pool_settings_name_the_key_and_the_fix() {
    let cases: &[(&str, &str)] = &[
        (
            "queue = \"nats://n1:4222\"\nnats_replicas = 0",
            "nats_replicas: 0 is not a number of replicas JetStream keeps: write 1 to 5",
        ),
        (
            "queue = \"nats://n1:4222\"\nnats_replicas = 7",
            "nats_replicas: 7 is not a number of replicas JetStream keeps",
        ),
        (
            "queue = \"nats://n1:4222\"\nnats_max_ack_pending = 0",
            "nats_max_ack_pending: 0 is not a usable MaxAckPending: write a whole number from 1",
        ),
        (
            "queue = \"nats://n1:4222\"\nnats_max_ack_pending = -1",
            "nats_max_ack_pending: -1 is not a usable MaxAckPending",
        ),
        (
            "queue = \"nats://n1:4222\"\nnats_credentials = \"/nonexistent/herald.creds\"",
            "nats_credentials: cannot read /nonexistent/herald.creds: No such file",
        ),
        (
            "queue = \"nats://n1:4222\"\nnats_credentials = \"/\"",
            "nats_credentials: / is not a file",
        ),
        (
            "pg_max_connections = 0",
            "pg_max_connections: 0 is not a pool size: write a whole number from 1 (10 is the default)",
        ),
        (
            "pg_max_connections = 5000000000",
            "pg_max_connections: 5000000000 is not a pool size",
        ),
        (
            "pg_acquire_timeout = \"0s\"",
            "pg_acquire_timeout: must be more than 0s",
        ),
        (
            "pg_acquire_timeout = \"later\"",
            "pg_acquire_timeout: \"later\" is not a duration",
        ),
    ];
    for (file, want) in cases {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(want), "{file:?}: {m}");
        assert!(m.contains("herald.toml"), "names the file: {m}");
    }
    let m = message(load_with(
        None,
        &[("HERALD_NATS_REPLICAS", "three")],
        Overrides::default(),
    ));
    assert!(
        m.starts_with("environment variable HERALD_NATS_REPLICAS: nats_replicas: \"three\" is not a whole number"),
        "{m}"
    );
    let m = message(load_with(
        None,
        &[("HERALD_PG_MAX_CONNECTIONS", "0")],
        Overrides::default(),
    ));
    assert!(
        m.starts_with("environment variable HERALD_PG_MAX_CONNECTIONS: pg_max_connections: 0 is not a pool size"),
        "{m}"
    );
}

#[test]
fn credentials_in_the_url_and_a_credentials_file_are_not_both_taken() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("herald.creds");
    std::fs::write(&creds, "").unwrap();
    let m = message(load_with(
        Some(&format!(
            "queue = \"nats://herald:secret@n1:4222\"\nnats_credentials = \"{}\"\n",
            creds.display()
        )),
        &[],
        Overrides::default(),
    ));
    assert!(
        m.contains("nats_credentials: is set, and the queue URL nats://herald:***@n1:4222 holds credentials too: use one of them"),
        "{m}"
    );
    assert!(!m.contains("secret"), "{m}");
}

#[test]
fn notification_limits_apply_to_every_queue_and_unusable_ones_are_refused() {
    let limits = |ids, bytes| herald::MessageLimits { ids, bytes };
    let c = load_with(
        Some("notify_max_ids = 8\nnotify_max_bytes = 4096\n"),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert!(
        matches!(c.queue, QueueConfig::Memory(l) if l == limits(8, 4096)),
        "{c:?}"
    );
    let c = load_with(
        Some("queue = \"nats://n1:4222\"\n"),
        &[("HERALD_NOTIFY_MAX_IDS", "1")],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(nats(&c).message_limits, limits(1, 8 << 10));
    let c = load_with(
        Some("[queue]\nkind = \"pubsub\"\nproject = \"my-project\"\ntopic = \"events\"\nmax_ids = 16\nmax_bytes = 2000\n"),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(pubsub(&c).message_limits, limits(16, 2000));
    let c = load_with(Some("notify_linger = \"0s\""), &[], Overrides::default()).unwrap();
    assert_eq!(c.notify_linger, Duration::ZERO);
    let c = load_with(None, &[], Overrides::default()).unwrap();
    assert_eq!(c.notify_publishes, herald::client::DEFAULT_NOTIFY_PUBLISHES);
    // Not the default (4), so that the file's value is what is checked.
    let c = load_with(Some("notify_publishes = 3"), &[], Overrides::default()).unwrap();
    assert_eq!(c.notify_publishes, 3);
    let c = load_with(None, &[], Overrides::default()).unwrap();
    assert_eq!(
        c.group_commit_writes,
        herald::client::DEFAULT_GROUP_COMMIT_WRITES
    );
    let c = load_with(Some("group_commit_writes = 0"), &[], Overrides::default()).unwrap();
    assert_eq!(c.group_commit_writes, 0);
    for (file, says) in [
        (
            "group_commit_writes = 1000",
            "group_commit_writes: 1000 is too many",
        ),
        (
            "notify_linger = \"2s\"",
            "notify_linger: 2s is too long",
        ),
        (
            "notify_publishes = 0",
            "notify_publishes: 0 is out of range",
        ),
        (
            "notify_max_ids = 0",
            "notify_max_ids: 0 is not a usable number of events per notification: write 1",
        ),
        (
            "notify_max_bytes = 100",
            "notify_max_bytes: 100 is not a usable notification size: write 266 (one event of the longest tenant name)",
        ),
    ] {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(says), "{file}: {m}");
    }
}

#[test]
fn emit_bounds_and_the_idempotency_window_are_read_and_checked() {
    let c = load_with(None, &[], Overrides::default()).unwrap();
    assert_eq!(c.emit_timeout, herald::client::DEFAULT_EMIT_TIMEOUT);
    assert_eq!(c.notify_wait, herald::client::DEFAULT_NOTIFY_WAIT);
    assert_eq!(c.idempotency_window, herald::DEFAULT_IDEMPOTENCY_WINDOW);
    let c = load_with(
        Some("emit_timeout = \"2s\"\nnotify_wait = \"0s\"\nidempotency_window = \"7d\""),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.emit_timeout, Duration::from_secs(2));
    assert_eq!(c.notify_wait, Duration::ZERO);
    assert_eq!(c.idempotency_window, Duration::from_secs(7 * 86400));
    let c = load_with(
        None,
        &[
            ("HERALD_IDEMPOTENCY_WINDOW", "1h"),
            ("HERALD_EMIT_TIMEOUT", "3s"),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.idempotency_window, Duration::from_secs(3600));
    assert_eq!(c.emit_timeout, Duration::from_secs(3));
    for (file, says) in [
        ("emit_timeout = \"0s\"", "emit_timeout: 0ns is out of range"),
        ("notify_wait = \"1m\"", "notify_wait: 60s is too long"),
        (
            "idempotency_window = \"0s\"",
            "idempotency_window: must be more than 0s",
        ),
    ] {
        let m = message(load_with(Some(file), &[], Overrides::default()));
        assert!(m.contains(says), "{file}: {m}");
    }
}

#[test]
fn subscriptions_are_read_and_their_names_checked() {
    let c = load_with(
        Some(
            r#"
[[subscriptions]]
topic = "user.signup"
handler = "send_welcome"
[[subscriptions]]
topic = "user.signup"
handler = "crm"
tenant = "acme"
"#,
        ),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        c.subscriptions,
        vec![
            herald::Subscription::every_tenant("user.signup", "send_welcome"),
            herald::Subscription::for_tenant("acme", "user.signup", "crm"),
        ]
    );
    let m = message(load_with(
        Some("[[subscriptions]]\ntopic = \"\"\nhandler = \"h\"\n"),
        &[],
        Overrides::default(),
    ));
    assert!(m.contains("subscriptions[0]") && m.contains("topic"), "{m}");
    let m = message(load_with(
        Some("[[subscriptions]]\ntopic = \"t\"\nhandler = \"h\"\nkind = \"x\"\n"),
        &[],
        Overrides::default(),
    ));
    assert!(m.contains("kind"), "{m}");
}

#[test]
fn schedules_are_read_checked_and_default_to_utc_and_once() {
    let c = load_with(
        Some(
            r#"
[[schedules]]
tenant = "acme"
name = "nightly"
handler = "report"
cron = "0 30 2 * * *"
timezone = "Europe/Paris"
payload = { kind = "daily", n = 3 }
max_attempts = 5
missed = "each"
missed_cap = 10

[[schedules]]
tenant = "acme"
name = "tick"
handler = "report"
every = "30s"
"#,
        ),
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.schedules.len(), 2);
    let n = &c.schedules[0];
    assert_eq!(n.cron.as_deref(), Some("0 30 2 * * *"));
    assert_eq!(n.payload.as_deref(), Some(r#"{"kind":"daily","n":3}"#));
    assert_eq!(n.max_attempts, Some(5));
    assert_eq!(n.source, herald::schedule::ScheduleSource::Config);
    let t = c.schedules[1].build(herald::Millis(0), 0).unwrap();
    assert_eq!(
        t.cadence,
        herald::schedule::Cadence::Every(Duration::from_secs(30))
    );
    assert_eq!(t.timezone, herald::schedule::Tz::UTC);
    assert_eq!(t.missed, herald::schedule::Missed::Once);
}

#[test]
fn a_bad_schedule_is_refused_naming_its_key() {
    let base = "[[schedules]]\ntenant = \"acme\"\nname = \"n\"\nhandler = \"h\"\n";
    let cases = [
        ("cron = \"61 * * * *\"", "schedules[0].cron"),
        ("every = \"0s\"", "schedules[0].every"),
        ("every = \"soon\"", "schedules[0].every"),
        (
            "cron = \"* * * * *\"\ntimezone = \"Mars/Base\"",
            "schedules[0].timezone",
        ),
        (
            "cron = \"* * * * *\"\nmissed = \"twice\"",
            "schedules[0].missed",
        ),
        (
            "cron = \"* * * * *\"\nmissed = \"each\"",
            "schedules[0].missed_cap",
        ),
        (
            "cron = \"* * * * *\"\nmax_attempts = 0",
            "schedules[0].max_attempts",
        ),
        (
            "cron = \"* * * * *\"\ncolour = \"red\"",
            "schedules[0].colour",
        ),
        ("", "schedules[0].cron"),
    ];
    for (extra, key) in cases {
        let m = message(load_with(
            Some(&format!("{base}{extra}\n")),
            &[],
            Overrides::default(),
        ));
        assert!(m.contains(&format!(": {key}: ")), "{key}: {m}");
    }
    let twice = format!("{base}every = \"1m\"\n{base}every = \"2m\"\n");
    let m = message(load_with(Some(&twice), &[], Overrides::default()));
    assert!(m.contains("schedules[1].name: "), "{m}");
}

#[test]
fn a_handler_s_limits_are_read_and_checked() {
    let c = load_with(
        Some(
            r#"
[handlers.sync]
kind = "command"
command = ["true"]
[handlers.sync.limit]
running = 20
per_tenant = 5
per_key = 1
"#,
        ),
        &[],
        Overrides::default(),
    )
    .unwrap();
    let limit = |scope, running| herald::Limit::running("sync", scope, running);
    assert_eq!(
        c.run_limits,
        vec![
            limit(herald::LimitScope::Handler, 20),
            limit(herald::LimitScope::Tenant { tenant: None }, 5),
            limit(herald::LimitScope::Key { key: None }, 1),
        ]
    );
    assert!(
        c.handlers["sync"].get("limit").is_none(),
        "the handler's own table no longer holds its limit"
    );
    for (text, words) in [
        ("per_key = 0", vec!["handlers.sync.limit.per_key", "pause"]),
        ("per_host = 1", vec!["handlers.sync.limit", "per_host"]),
        ("running = \"ten\"", vec!["handlers.sync.limit", "\"ten\""]),
    ] {
        let m = message(load_with(
            Some(&format!(
                "[handlers.sync]\nkind = \"command\"\ncommand = [\"true\"]\n[handlers.sync.limit]\n{text}\n"
            )),
            &[],
            Overrides::default(),
        ));
        for w in words {
            assert!(m.contains(w), "{w:?} in {m}");
        }
    }
}
