//! The queue's configuration: `queue = "LOCATION"` with its flat
//! `nats_…`/`pubsub_…` keys, or a `[queue]` table that says the same
//! thing in one place, checked into the queue crate's own config.

use std::path::PathBuf;
use std::time::Duration;

use herald::redact::redact_credentials;

use super::sources::Origins;
use super::ConfigError;

/// The default NATS stream name (and subject prefix).
pub const DEFAULT_NATS_STREAM: &str = "herald";

/// Where notifications travel, and how: the queue crate's own settings,
/// with the ack wait set to the worker's lease.
#[derive(Clone, Debug)]
pub enum QueueConfig {
    /// The in-process queue (one process), with the notifications' limits.
    Memory(herald::MessageLimits),
    /// NATS JetStream (many worker processes). Its URL may hold
    /// credentials; `Display` and `Debug` hide them.
    Nats(herald_nats::NatsConfig),
    /// Google Cloud Pub/Sub, or its emulator by `PUBSUB_EMULATOR_HOST`.
    Pubsub(herald_pubsub::PubsubConfig),
}

impl std::fmt::Display for QueueConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueConfig::Memory(_) => write!(f, "memory"),
            QueueConfig::Nats(c) => write!(f, "{}", redact_credentials(&c.url)),
            QueueConfig::Pubsub(c) => write!(
                f,
                "pubsub://{}/{}?subscription={}",
                c.project, c.topic, c.subscription
            ),
        }
    }
}

/// The queue's keys as written (flat, or lifted from `[queue]`).
#[derive(Debug, Default)]
pub(super) struct QueueKeys {
    pub(super) queue: Option<String>,
    pub(super) nats_stream: Option<String>,
    pub(super) nats_replicas: Option<u64>,
    pub(super) nats_max_ack_pending: Option<i64>,
    pub(super) nats_credentials: Option<String>,
    pub(super) pubsub_max_outstanding: Option<u64>,
    pub(super) pubsub_credentials: Option<String>,
    pub(super) pubsub_pull: Option<String>,
    pub(super) notify_max_ids: Option<u64>,
    pub(super) notify_max_bytes: Option<u64>,
}

/// A `[queue]` table's keys per kind, and the flat key each one stands for.
/// `url` (NATS) and `project`/`topic`/`subscription` (Pub/Sub) make the
/// location, the flat `queue`.
const TABLE_KEYS: &[(&str, &[(&str, &str)])] = &[
    (
        "memory",
        &[
            ("max_ids", "notify_max_ids"),
            ("max_bytes", "notify_max_bytes"),
        ],
    ),
    (
        "nats",
        &[
            ("url", "queue"),
            ("stream", "nats_stream"),
            ("replicas", "nats_replicas"),
            ("max_ack_pending", "nats_max_ack_pending"),
            ("credentials", "nats_credentials"),
            ("max_ids", "notify_max_ids"),
            ("max_bytes", "notify_max_bytes"),
        ],
    ),
    (
        "pubsub",
        &[
            ("project", "queue"),
            ("topic", "queue"),
            ("subscription", "queue"),
            ("max_outstanding", "pubsub_max_outstanding"),
            ("credentials", "pubsub_credentials"),
            ("pull", "pubsub_pull"),
            ("max_ids", "notify_max_ids"),
            ("max_bytes", "notify_max_bytes"),
        ],
    ),
];

/// Turns a `[queue]` table of the file into the flat keys it stands for,
/// before the environment and flags apply (so `HERALD_QUEUE` replaces the
/// location and `HERALD_PUBSUB_PULL` the table's `pull`, as they would the
/// flat keys). Errors name the table's keys (`queue.pull`), and so do
/// later errors about the flat keys it set.
pub(super) fn lift_table(
    table: &mut toml::Table,
    origins: &mut Origins,
) -> Result<(), ConfigError> {
    let Some(toml::Value::Table(q)) = table.get("queue") else {
        return Ok(());
    };
    let q = q.clone();
    let origin = origins.of("queue");
    let bad = |key: &str, message: String| ConfigError::invalid(&origin, key, message);
    let kinds: Vec<&str> = TABLE_KEYS.iter().map(|(k, _)| *k).collect();
    let kind = match q.get("kind") {
        Some(toml::Value::String(k)) => k.as_str(),
        Some(other) => {
            return Err(bad(
                "queue.kind",
                format!("{other} is not a queue kind: write one of {kinds:?}"),
            ))
        }
        None => {
            return Err(bad(
                "queue.kind",
                format!("is missing: a [queue] table says its kind, one of {kinds:?}"),
            ))
        }
    };
    let Some((_, keys)) = TABLE_KEYS.iter().find(|(k, _)| *k == kind) else {
        return Err(bad(
            "queue.kind",
            format!("{kind:?} is not a queue this build has: write one of {kinds:?}"),
        ));
    };
    let text = |key: &str| -> Result<Option<String>, ConfigError> {
        match q.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(bad(
                &format!("queue.{key}"),
                format!("{other} is not text: write it in double quotes"),
            )),
        }
    };
    let location = match kind {
        "memory" => "memory".to_string(),
        "nats" => text("url")?.ok_or_else(|| {
            bad(
                "queue.url",
                "is missing: a NATS queue needs its server, like \"nats://127.0.0.1:4222\"".into(),
            )
        })?,
        _ => {
            let need = |key: &str| {
                text(key)?.ok_or_else(|| {
                    bad(
                        &format!("queue.{key}"),
                        "is missing: a Pub/Sub queue names its project and topic (and may name its subscription, TOPIC-workers by default)".to_string(),
                    )
                })
            };
            let mut l = format!("pubsub://{}/{}", need("project")?, need("topic")?);
            if let Some(s) = text("subscription")? {
                l.push_str(&format!("?subscription={s}"));
            }
            l
        }
    };
    let mut lifted = vec![("queue".to_string(), toml::Value::String(location))];
    for (key, value) in &q {
        if key == "kind" {
            continue;
        }
        let Some((_, flat)) = keys.iter().find(|(k, _)| k == key) else {
            let known: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
            return Err(bad(
                &format!("queue.{key}"),
                format!("unknown key for a {kind} queue; expected kind or one of {known:?}"),
            ));
        };
        if *flat == "queue" {
            continue;
        }
        if table.contains_key(*flat) {
            return Err(bad(
                &format!("queue.{key}"),
                format!("is set here and as {flat} too: keep one"),
            ));
        }
        lifted.push((flat.to_string(), value.clone()));
        origins.name_as(flat, &format!("queue.{key}"));
    }
    for (key, value) in lifted {
        table.insert(key, value);
    }
    Ok(())
}

/// Reads the queue's keys into the queue crate's config, with the ack wait
/// `lease`. `err` makes an error about a flat key.
pub(super) fn resolve_queue(
    mut keys: QueueKeys,
    lease: Duration,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<QueueConfig, ConfigError> {
    let location = keys.queue.take().unwrap_or_else(|| "memory".to_string());
    // Every queue's keys are checked, whichever queue is in use (a file
    // can keep them while it switches queues).
    let nats_keys = nats_settings(&mut keys, err)?;
    let pubsub_keys = pubsub_settings(&mut keys, err)?;
    let limits = message_limits(&keys, err)?;
    match location.as_str() {
        "memory" => Ok(QueueConfig::Memory(limits)),
        url if url.starts_with("nats://") || url.starts_with("tls://") => {
            nats(url, nats_keys, lease, err).map(|c| {
                QueueConfig::Nats(herald_nats::NatsConfig {
                    message_limits: limits,
                    ..c
                })
            })
        }
        url if url.starts_with("pubsub://") => pubsub(url, pubsub_keys, lease, err).map(|c| {
            QueueConfig::Pubsub(herald_pubsub::PubsubConfig {
                message_limits: limits,
                ..c
            })
        }),
        other => Err(err(
            "queue",
            format!("{:?} is not a queue this build has; write \"memory\" (the in-process queue), a NATS URL like \"nats://127.0.0.1:4222\", or a Pub/Sub location like \"pubsub://PROJECT/TOPIC?subscription=NAME\"", redact_credentials(other)),
        )),
    }
}

/// The smallest `notify_max_bytes`: a notification of one event of the
/// longest tenant name fits.
fn least_message_bytes() -> usize {
    herald::Notification::encoded_len(&"t".repeat(herald::client::MAX_NAME_LEN), 1)
}

/// `notify_max_ids` and `notify_max_bytes`, checked: how large a
/// notification publishers make, on any queue.
fn message_limits(
    keys: &QueueKeys,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<herald::MessageLimits, ConfigError> {
    let default = herald::MessageLimits::default();
    let ids = match keys.notify_max_ids {
        None => default.ids,
        Some(n @ 1..=100_000) => n as usize,
        Some(n) => {
            return Err(err(
                "notify_max_ids",
                format!("{n} is not a usable number of events per notification: write 1 (one event per message) to 100000 ({} is the default)", default.ids),
            ))
        }
    };
    let least = least_message_bytes();
    let bytes = match keys.notify_max_bytes {
        None => default.bytes,
        Some(n) if n >= least as u64 && n <= 10_000_000 => n as usize,
        Some(n) => {
            return Err(err(
                "notify_max_bytes",
                format!("{n} is not a usable notification size: write {least} (one event of the longest tenant name) to 10000000, Pub/Sub's largest message ({} is the default)", default.bytes),
            ))
        }
    };
    Ok(herald::MessageLimits { ids, bytes })
}

/// The NATS keys, checked.
struct NatsKeys {
    stream: String,
    replicas: usize,
    max_ack_pending: i64,
    credentials: Option<PathBuf>,
}

fn nats_settings(
    keys: &mut QueueKeys,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<NatsKeys, ConfigError> {
    let stream = keys
        .nats_stream
        .take()
        .unwrap_or_else(|| DEFAULT_NATS_STREAM.to_string());
    if stream.is_empty()
        || !stream
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(err(
            "nats_stream",
            format!("{stream:?} is not a usable stream name; use letters, digits, '_' and '-'"),
        ));
    }
    let replicas = match keys.nats_replicas {
        None => 1,
        Some(n @ 1..=5) => n as usize,
        Some(n) => {
            return Err(err(
                "nats_replicas",
                format!("{n} is not a number of replicas JetStream keeps: write 1 to 5 (3 for a 3-node cluster; 1 is the default)"),
            ))
        }
    };
    let max_ack_pending = match keys.nats_max_ack_pending {
        None => herald_nats::DEFAULT_MAX_ACK_PENDING,
        Some(n) if n >= 1 => n,
        Some(n) => {
            return Err(err(
                "nats_max_ack_pending",
                format!("{n} is not a usable MaxAckPending: write a whole number from 1 ({} is the default; for unlimited, create the consumer yourself with --max-pending=-1)", herald_nats::DEFAULT_MAX_ACK_PENDING),
            ))
        }
    };
    let credentials = match keys.nats_credentials.take() {
        None => None,
        Some(path) => Some(existing_file(
            path,
            "a NATS .creds file",
            "nats_credentials",
            err,
        )?),
    };
    Ok(NatsKeys {
        stream,
        replicas,
        max_ack_pending,
        credentials,
    })
}

fn nats(
    url: &str,
    keys: NatsKeys,
    lease: Duration,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<herald_nats::NatsConfig, ConfigError> {
    // The redacted form differs exactly when the URL holds credentials.
    if keys.credentials.is_some() && redact_credentials(url) != url {
        return Err(err(
            "nats_credentials",
            format!(
                "is set, and the queue URL {} holds credentials too: use one of them",
                redact_credentials(url)
            ),
        ));
    }
    // AckWait = the lease: an unanswered notification comes back when its
    // run's lease would have lapsed.
    let mut c = herald_nats::NatsConfig::new(url, &keys.stream, lease);
    c.replicas = keys.replicas;
    c.max_ack_pending = keys.max_ack_pending;
    c.credentials = keys.credentials;
    Ok(c)
}

/// The Pub/Sub keys, checked.
struct PubsubKeys {
    max_outstanding: usize,
    credentials: Option<PathBuf>,
    pull: herald_pubsub::PullMode,
}

fn pubsub_settings(
    keys: &mut QueueKeys,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<PubsubKeys, ConfigError> {
    let max_outstanding = match keys.pubsub_max_outstanding {
        None => herald_pubsub::DEFAULT_MAX_OUTSTANDING,
        Some(n) if n >= 1 && n <= i64::MAX as u64 => n as usize,
        Some(n) => {
            return Err(err(
                "pubsub_max_outstanding",
                format!("{n} is not a usable number of outstanding messages: write a whole number from 1 ({} is the default; it must cover the worker's concurrency and claim_ahead)", herald_pubsub::DEFAULT_MAX_OUTSTANDING),
            ))
        }
    };
    let credentials = match keys.pubsub_credentials.take() {
        None => None,
        Some(path) => Some(existing_file(
            path,
            "a service-account key file (JSON), or leave it out for Application Default Credentials",
            "pubsub_credentials",
            err,
        )?),
    };
    let pull = match keys.pubsub_pull.take() {
        None => herald_pubsub::PullMode::default(),
        Some(text) => text.parse().map_err(|m| err("pubsub_pull", m))?,
    };
    Ok(PubsubKeys {
        max_outstanding,
        credentials,
        pull,
    })
}

fn pubsub(
    url: &str,
    keys: PubsubKeys,
    lease: Duration,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<herald_pubsub::PubsubConfig, ConfigError> {
    if lease > herald_pubsub::MAX_ACK_DEADLINE {
        return Err(err(
            "worker.lease",
            format!(
                "{lease:?} is too long for Pub/Sub, which holds a delivery for at most {:?}: use a lease up to 600s",
                herald_pubsub::MAX_ACK_DEADLINE
            ),
        ));
    }
    // The ack wait is the lease, kept by this process; the subscription's
    // ack deadline is the lease rounded up to 10-600 s (herald_pubsub's
    // docs: the deadline and the lease are separate).
    let mut c = herald_pubsub::PubsubConfig::from_url(url, lease).map_err(|e| match e {
        herald::QueueError::Config(m) => err("queue", m),
        other => err("queue", other.to_string()),
    })?;
    c.max_outstanding = keys.max_outstanding;
    c.credentials = keys.credentials;
    c.pull = keys.pull;
    Ok(c)
}

/// `path`, if it names a readable file; `what` says what it should be.
fn existing_file(
    path: String,
    what: &str,
    key: &str,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<PathBuf, ConfigError> {
    let path = PathBuf::from(path);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err(err(
            key,
            format!("{} is not a file; give the path of {what}", path.display()),
        )),
        Err(e) => Err(err(key, format!("cannot read {}: {e}", path.display()))),
    }
}
