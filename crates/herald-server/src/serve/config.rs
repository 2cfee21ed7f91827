//! `herald serve`'s configuration: the file `herald.toml`, overridden by
//! `HERALD_…` environment variables, overridden by flags.
//!
//! The three sources are merged into one TOML table first, then read into
//! [`FileConfig`] once, so that every key is checked by the same code
//! whatever its source, and every error names the key and where its value
//! came from. Unknown keys are errors.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use herald::{RetryPolicy, WorkerConfig};
use serde::Deserialize;

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The default config file, used when it exists and `--config` is not given.
pub const DEFAULT_FILE: &str = "herald.toml";
/// The default store: this file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://herald.db";
/// Most events in one batch request, by default.
pub const DEFAULT_MAX_BATCH: usize = 1000;
/// The smallest request body limit, whatever the payload limit.
pub const MIN_REQUEST_BYTES: usize = 16 << 20;
/// How long shutdown waits for running handlers by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// PostgreSQL connections per process by default: sqlx's default. Every
/// store call is one short statement or transaction, and handlers hold no
/// connection, so 10 serve a worker's claims, renewals, reconciler and API.
pub const DEFAULT_PG_MAX_CONNECTIONS: u32 = 10;
/// How long a store call waits for a free PostgreSQL connection by default.
pub const DEFAULT_PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A configuration error: which key, from where, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read the config file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The config file is not TOML.
    #[error("{path} is not valid TOML: {reason}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message, with the line.
        reason: String,
    },
    /// A key has a value herald refuses.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        /// Where the value came from: the file, an environment variable, a flag.
        origin: String,
        /// The key, dotted (`worker.lease`, `handlers.send_email`).
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    /// An error about `key` from `origin`.
    pub fn invalid(
        origin: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            origin: origin.into(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// The flags of `herald serve` that override configuration keys.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--config`: the file to read; `None` reads `./herald.toml` if present.
    pub config: Option<PathBuf>,
    /// `--store`.
    pub store: Option<String>,
    /// `--schema`.
    pub pg_schema: Option<String>,
    /// `--queue`.
    pub queue: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
}

/// Where events are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL.
    Postgres(String),
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            StoreLocation::Postgres(url) => {
                // Never print a password.
                match url.split_once('@') {
                    Some((head, tail)) if head.contains(':') && head.matches(':').count() > 1 => {
                        let scheme_user = head.rsplit_once(':').map(|(a, _)| a).unwrap_or(head);
                        write!(f, "{scheme_user}:***@{tail}")
                    }
                    _ => write!(f, "{url}"),
                }
            }
        }
    }
}

/// The SHA-256 digests of the tokens the API accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// The operator's token: every tenant, and the only one that may block.
    pub operator: Option<[u8; 32]>,
    /// Tenant tokens, each for its own tenant only.
    pub tenants: Vec<(String, [u8; 32])>,
}

impl AuthConfig {
    /// True when no token is configured: the API is open to whoever can
    /// reach it, so it listens on loopback only.
    pub fn is_open(&self) -> bool {
        self.operator.is_none() && self.tenants.is_empty()
    }
}

/// Where notifications travel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueLocation {
    /// The in-process queue (one process).
    Memory,
    /// NATS JetStream at this URL (many worker processes). It may hold
    /// credentials; its `Display` hides them.
    Nats(String),
    /// Google Cloud Pub/Sub (or its emulator, by `PUBSUB_EMULATOR_HOST`):
    /// `pubsub://PROJECT/TOPIC?subscription=NAME`.
    Pubsub {
        /// The Google Cloud project.
        project: String,
        /// The topic's id.
        topic: String,
        /// The pull subscription's id.
        subscription: String,
    },
}

impl std::fmt::Display for QueueLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueLocation::Memory => write!(f, "memory"),
            QueueLocation::Nats(url) => write!(f, "{}", herald_nats::redact_url(url)),
            QueueLocation::Pubsub {
                project,
                topic,
                subscription,
            } => write!(f, "pubsub://{project}/{topic}?subscription={subscription}"),
        }
    }
}

/// The default NATS stream name.
pub const DEFAULT_NATS_STREAM: &str = "herald";

/// `herald serve`'s configuration, checked and with defaults applied.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The store.
    pub store: StoreLocation,
    /// The PostgreSQL schema herald's tables are in.
    pub pg_schema: String,
    /// The queue.
    pub queue: QueueLocation,
    /// The NATS stream (and subject prefix) of the notifications.
    pub nats_stream: String,
    /// Replicas of the NATS stream (and its consumer) when herald creates it.
    pub nats_replicas: usize,
    /// `MaxAckPending` of the NATS consumer when herald creates it; an
    /// existing one must allow at least this many, or be unlimited.
    pub nats_max_ack_pending: i64,
    /// A NATS credentials file (`.creds`).
    pub nats_credentials: Option<PathBuf>,
    /// Pub/Sub: the most messages one worker holds unanswered (the
    /// streaming pull's `max_outstanding_messages`).
    pub pubsub_max_outstanding: usize,
    /// Pub/Sub: a service-account key file; `None` for Application Default
    /// Credentials.
    pub pubsub_credentials: Option<PathBuf>,
    /// Pub/Sub: a streaming pull (default) or unary Pull requests.
    pub pubsub_pull: herald_pubsub::PullMode,
    /// Most PostgreSQL connections in the pool.
    pub pg_max_connections: u32,
    /// How long a store call waits for a free PostgreSQL connection.
    pub pg_acquire_timeout: Duration,
    /// The HTTP API's address.
    pub listen: SocketAddr,
    /// The largest payload, in bytes of JSON text.
    pub max_payload_bytes: usize,
    /// The largest request body, in bytes.
    pub max_request_bytes: usize,
    /// Most events in one batch request.
    pub max_batch: usize,
    /// The worker's settings.
    pub worker: WorkerConfig,
    /// Whether `worker.name` was set; if not, the server names its worker
    /// `HOST@ADDRESS` once it has bound its address, a name that survives a
    /// restart (see [`WorkerConfig::name`]).
    pub worker_named: bool,
    /// How long shutdown waits for running handlers before cancelling them.
    pub shutdown_grace: Duration,
    /// API tokens.
    pub auth: AuthConfig,
    /// `[handlers.NAME]` tables, as written, for [`super::build_handlers`].
    pub handlers: BTreeMap<String, toml::Value>,
    /// The file the configuration was read from, if any.
    pub file: Option<PathBuf>,
}

impl ServeConfig {
    /// Where keys that only the file can set came from, for error messages.
    pub fn origin(&self) -> String {
        self.file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "configuration".to_string())
    }
}

/// The file's shape. Every key is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    store: Option<String>,
    pg_schema: Option<String>,
    queue: Option<String>,
    nats_stream: Option<String>,
    nats_replicas: Option<u64>,
    nats_max_ack_pending: Option<i64>,
    nats_credentials: Option<String>,
    pubsub_max_outstanding: Option<u64>,
    pubsub_credentials: Option<String>,
    pubsub_pull: Option<String>,
    pg_max_connections: Option<u64>,
    pg_acquire_timeout: Option<Dur>,
    listen: Option<String>,
    max_payload_bytes: Option<u64>,
    max_request_bytes: Option<u64>,
    max_batch: Option<u64>,
    #[serde(default)]
    worker: WorkerSection,
    #[serde(default)]
    auth: AuthSection,
    #[serde(default)]
    handlers: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerSection {
    concurrency: Option<u64>,
    batch: Option<u64>,
    lease: Option<Dur>,
    sweep_every: Option<Dur>,
    sweep_quiet: Option<Dur>,
    dead_retention: Option<Dur>,
    done_retention: Option<Dur>,
    reconcile: Option<bool>,
    name: Option<String>,
    shutdown_grace: Option<Dur>,
    #[serde(default)]
    retry: RetrySection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrySection {
    base: Option<Dur>,
    max: Option<Dur>,
    factor: Option<f64>,
    jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthSection {
    operator_token_sha256: Option<String>,
    #[serde(default)]
    tenants: BTreeMap<String, String>,
}

/// A duration written as text: `"30s"`, `"5m"`, `"1h 30m"`, `"7d"`.
#[derive(Clone, Copy, Debug)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a duration as a string, like \"30s\", \"5m\" or \"1h 30m\"",
            )
        })?;
        parse_duration(&text)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses a duration like `"30s"` or `"1h 30m"`, with a message that says
/// how to write one.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("{text:?} is not a duration ({e}); write it like \"30s\", \"500ms\", \"5m\" or \"1h 30m\"")
    })
}

/// What type an overridable key has, to read it from a string.
#[derive(Clone, Copy)]
enum Kind {
    Text,
    Integer,
    Boolean,
    Float,
}

/// Keys that environment variables can set: `HERALD_` + the key in capitals
/// with dots as underscores, except the operator token (`HERALD_OPERATOR_TOKEN_SHA256`).
const ENV_KEYS: &[(&str, &str, Kind)] = &[
    ("HERALD_STORE", "store", Kind::Text),
    ("HERALD_PG_SCHEMA", "pg_schema", Kind::Text),
    ("HERALD_QUEUE", "queue", Kind::Text),
    ("HERALD_NATS_STREAM", "nats_stream", Kind::Text),
    ("HERALD_NATS_REPLICAS", "nats_replicas", Kind::Integer),
    (
        "HERALD_NATS_MAX_ACK_PENDING",
        "nats_max_ack_pending",
        Kind::Integer,
    ),
    ("HERALD_NATS_CREDENTIALS", "nats_credentials", Kind::Text),
    (
        "HERALD_PUBSUB_MAX_OUTSTANDING",
        "pubsub_max_outstanding",
        Kind::Integer,
    ),
    (
        "HERALD_PUBSUB_CREDENTIALS",
        "pubsub_credentials",
        Kind::Text,
    ),
    ("HERALD_PUBSUB_PULL", "pubsub_pull", Kind::Text),
    (
        "HERALD_PG_MAX_CONNECTIONS",
        "pg_max_connections",
        Kind::Integer,
    ),
    (
        "HERALD_PG_ACQUIRE_TIMEOUT",
        "pg_acquire_timeout",
        Kind::Text,
    ),
    ("HERALD_LISTEN", "listen", Kind::Text),
    (
        "HERALD_MAX_PAYLOAD_BYTES",
        "max_payload_bytes",
        Kind::Integer,
    ),
    (
        "HERALD_MAX_REQUEST_BYTES",
        "max_request_bytes",
        Kind::Integer,
    ),
    ("HERALD_MAX_BATCH", "max_batch", Kind::Integer),
    (
        "HERALD_OPERATOR_TOKEN_SHA256",
        "auth.operator_token_sha256",
        Kind::Text,
    ),
    (
        "HERALD_WORKER_CONCURRENCY",
        "worker.concurrency",
        Kind::Integer,
    ),
    ("HERALD_WORKER_BATCH", "worker.batch", Kind::Integer),
    ("HERALD_WORKER_LEASE", "worker.lease", Kind::Text),
    (
        "HERALD_WORKER_SWEEP_EVERY",
        "worker.sweep_every",
        Kind::Text,
    ),
    (
        "HERALD_WORKER_SWEEP_QUIET",
        "worker.sweep_quiet",
        Kind::Text,
    ),
    (
        "HERALD_WORKER_DEAD_RETENTION",
        "worker.dead_retention",
        Kind::Text,
    ),
    (
        "HERALD_WORKER_DONE_RETENTION",
        "worker.done_retention",
        Kind::Text,
    ),
    ("HERALD_WORKER_RECONCILE", "worker.reconcile", Kind::Boolean),
    ("HERALD_WORKER_NAME", "worker.name", Kind::Text),
    (
        "HERALD_WORKER_SHUTDOWN_GRACE",
        "worker.shutdown_grace",
        Kind::Text,
    ),
    ("HERALD_WORKER_RETRY_BASE", "worker.retry.base", Kind::Text),
    ("HERALD_WORKER_RETRY_MAX", "worker.retry.max", Kind::Text),
    (
        "HERALD_WORKER_RETRY_FACTOR",
        "worker.retry.factor",
        Kind::Float,
    ),
    (
        "HERALD_WORKER_RETRY_JITTER",
        "worker.retry.jitter",
        Kind::Float,
    ),
];

/// Where each key's value came from.
#[derive(Default)]
struct Origins {
    file: Option<String>,
    by_key: BTreeMap<String, String>,
}

impl Origins {
    /// The origin of `key`, or of the closest enclosing key that has one.
    fn of(&self, key: &str) -> String {
        let mut k = key;
        loop {
            if let Some(o) = self.by_key.get(k) {
                return o.clone();
            }
            match k.rsplit_once('.') {
                Some((parent, _)) => k = parent,
                None => break,
            }
        }
        self.file
            .clone()
            .unwrap_or_else(|| "configuration".to_string())
    }
}

/// Loads the configuration: the file, then the environment (`env`), then
/// the flags.
pub fn load(
    flags: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeConfig, ConfigError> {
    let mut origins = Origins::default();
    let mut table = toml::Table::new();
    let file = match &flags.config {
        Some(path) => Some(path.clone()),
        None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.exists()),
    };
    if let Some(path) = &file {
        table = read_file(path)?;
        origins.file = Some(path.display().to_string());
    }
    for (var, key, kind) in ENV_KEYS {
        if let Some(value) = env(var).filter(|v| !v.is_empty()) {
            let origin = format!("environment variable {var}");
            set(&mut table, key, scalar(*kind, &value, &origin, key)?);
            origins.by_key.insert(key.to_string(), origin);
        }
    }
    let flag_keys = [
        ("--store", "store", &flags.store),
        ("--schema", "pg_schema", &flags.pg_schema),
        ("--queue", "queue", &flags.queue),
        ("--listen", "listen", &flags.listen),
    ];
    for (flag, key, value) in flag_keys {
        if let Some(v) = value {
            set(&mut table, key, toml::Value::String(v.clone()));
            origins.by_key.insert(key.to_string(), flag.to_string());
        }
    }
    let raw: FileConfig =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let path = e.path().to_string();
            // toml appends "in `section`" on a line of its own: the path says it.
            let message = e.inner().to_string();
            let message = message.lines().next().unwrap_or_default().to_string();
            // serde names an unknown key in its message, at its parent's path.
            if let Some(rest) = message.strip_prefix("unknown field `") {
                if let Some((field, expected)) = rest.split_once('`') {
                    let key = if path == "." {
                        field.to_string()
                    } else if path == field || path.ends_with(&format!(".{field}")) {
                        path.clone()
                    } else {
                        format!("{path}.{field}")
                    };
                    let expected = expected.trim_start_matches(", ");
                    return ConfigError::invalid(
                        origins.of(&key),
                        key,
                        format!("unknown key; {expected}"),
                    );
                }
            }
            let key = if path == "." {
                "(top level)".to_string()
            } else {
                path
            };
            ConfigError::invalid(origins.of(&key), key, message)
        })?;
    let mut config = resolve(raw, &origins)?;
    config.file = file;
    Ok(config)
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            path: shown,
            reason: e.to_string().trim_end().to_string(),
        })
}

/// Sets a dotted key in a table, creating the tables on the way.
fn set(table: &mut toml::Table, key: &str, value: toml::Value) {
    let mut t = table;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            t.insert(part.to_string(), value);
            return;
        }
        let entry = t
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        t = entry.as_table_mut().expect("just made a table");
    }
}

fn scalar(kind: Kind, value: &str, origin: &str, key: &str) -> Result<toml::Value, ConfigError> {
    let bad = |what: &str| ConfigError::invalid(origin, key, format!("{value:?} is not {what}"));
    Ok(match kind {
        Kind::Text => toml::Value::String(value.to_string()),
        Kind::Integer => {
            toml::Value::Integer(value.trim().parse().map_err(|_| bad("a whole number"))?)
        }
        Kind::Boolean => match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => toml::Value::Boolean(true),
            "false" | "0" | "no" => toml::Value::Boolean(false),
            _ => return Err(bad("true or false")),
        },
        Kind::Float => toml::Value::Float(value.trim().parse().map_err(|_| bad("a number"))?),
    })
}

/// Applies defaults and checks what serde can't.
fn resolve(raw: FileConfig, origins: &Origins) -> Result<ServeConfig, ConfigError> {
    let err = |key: &str, message: String| ConfigError::invalid(origins.of(key), key, message);

    let store =
        parse_store(raw.store.as_deref().unwrap_or(DEFAULT_STORE)).map_err(|m| err("store", m))?;
    let pg_schema = raw
        .pg_schema
        .unwrap_or_else(|| herald_postgres::DEFAULT_SCHEMA.to_string());
    let queue = match raw.queue.as_deref().unwrap_or("memory") {
        "memory" => QueueLocation::Memory,
        url if url.starts_with("nats://") || url.starts_with("tls://") => {
            QueueLocation::Nats(url.to_string())
        }
        url if url.starts_with("pubsub://") => {
            // The lease is checked against Pub/Sub's limits below.
            let c = herald_pubsub::PubsubConfig::from_url(url, Duration::from_secs(1))
                .map_err(|e| match e {
                    herald::QueueError::Config(m) => err("queue", m),
                    other => err("queue", other.to_string()),
                })?;
            QueueLocation::Pubsub {
                project: c.project,
                topic: c.topic,
                subscription: c.subscription,
            }
        }
        other => {
            return Err(err(
                "queue",
                format!("{:?} is not a queue this build has; write \"memory\" (the in-process queue), a NATS URL like \"nats://127.0.0.1:4222\", or a Pub/Sub location like \"pubsub://PROJECT/TOPIC?subscription=NAME\"", herald_nats::redact_url(other)),
            ))
        }
    };
    let nats_stream = raw
        .nats_stream
        .unwrap_or_else(|| DEFAULT_NATS_STREAM.to_string());
    if nats_stream.is_empty()
        || !nats_stream
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(err(
            "nats_stream",
            format!(
                "{nats_stream:?} is not a usable stream name; use letters, digits, '_' and '-'"
            ),
        ));
    }
    let nats_replicas = match raw.nats_replicas {
        None => 1,
        Some(n @ 1..=5) => n as usize,
        Some(n) => {
            return Err(err(
                "nats_replicas",
                format!("{n} is not a number of replicas JetStream keeps: write 1 to 5 (3 for a 3-node cluster; 1 is the default)"),
            ))
        }
    };
    let nats_max_ack_pending = match raw.nats_max_ack_pending {
        None => herald_nats::DEFAULT_MAX_ACK_PENDING,
        Some(n) if n >= 1 => n,
        Some(n) => {
            return Err(err(
                "nats_max_ack_pending",
                format!("{n} is not a usable MaxAckPending: write a whole number from 1 ({} is the default; for unlimited, create the consumer yourself with --max-pending=-1)", herald_nats::DEFAULT_MAX_ACK_PENDING),
            ))
        }
    };
    let nats_credentials = match raw.nats_credentials {
        None => None,
        Some(path) => {
            let key = "nats_credentials";
            let path = PathBuf::from(path);
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(err(
                        key,
                        format!(
                            "{} is not a file; give the path of a NATS .creds file",
                            path.display()
                        ),
                    ))
                }
                Err(e) => return Err(err(key, format!("cannot read {}: {e}", path.display()))),
            }
            if let QueueLocation::Nats(url) = &queue {
                // The redacted form differs exactly when the URL holds credentials.
                if herald_nats::redact_url(url) != *url {
                    return Err(err(
                        key,
                        format!(
                            "is set, and the queue URL {} holds credentials too: use one of them",
                            queue
                        ),
                    ));
                }
            }
            Some(path)
        }
    };
    let pubsub_max_outstanding = match raw.pubsub_max_outstanding {
        None => herald_pubsub::DEFAULT_MAX_OUTSTANDING,
        Some(n) if n >= 1 && n <= i64::MAX as u64 => n as usize,
        Some(n) => {
            return Err(err(
                "pubsub_max_outstanding",
                format!("{n} is not a usable number of outstanding messages: write a whole number from 1 ({} is the default; it must cover the worker's concurrency and batch)", herald_pubsub::DEFAULT_MAX_OUTSTANDING),
            ))
        }
    };
    let pubsub_credentials = match raw.pubsub_credentials {
        None => None,
        Some(path) => {
            let path = PathBuf::from(path);
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => Some(path),
                Ok(_) => {
                    return Err(err(
                        "pubsub_credentials",
                        format!(
                            "{} is not a file; give the path of a service-account key file (JSON), or leave it out for Application Default Credentials",
                            path.display()
                        ),
                    ))
                }
                Err(e) => {
                    return Err(err(
                        "pubsub_credentials",
                        format!("cannot read {}: {e}", path.display()),
                    ))
                }
            }
        }
    };
    let pubsub_pull = match raw.pubsub_pull.as_deref() {
        None => herald_pubsub::PullMode::default(),
        Some(text) => text.parse().map_err(|m| err("pubsub_pull", m))?,
    };
    let pg_max_connections = match raw.pg_max_connections {
        None => DEFAULT_PG_MAX_CONNECTIONS,
        Some(n) => match u32::try_from(n) {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(err(
                    "pg_max_connections",
                    format!("{n} is not a pool size: write a whole number from 1 ({DEFAULT_PG_MAX_CONNECTIONS} is the default)"),
                ))
            }
        },
    };
    let pg_acquire_timeout = match raw.pg_acquire_timeout {
        None => DEFAULT_PG_ACQUIRE_TIMEOUT,
        Some(Dur(d)) if d.is_zero() => {
            return Err(err(
                "pg_acquire_timeout",
                "must be more than 0s (10s is the default)".into(),
            ))
        }
        Some(Dur(d)) => d,
    };
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.trim().parse().map_err(|_| {
        err(
            "listen",
            format!("{listen_text:?} is not an IP address and port; write it like \"127.0.0.1:7878\", \"[::1]:7878\" or \"0.0.0.0:7878\""),
        )
    })?;

    let max_payload_bytes = positive(
        raw.max_payload_bytes,
        herald::client::DEFAULT_MAX_PAYLOAD as u64,
    )
    .map_err(|m| err("max_payload_bytes", m))?;
    let max_request_bytes = positive(
        raw.max_request_bytes,
        (max_payload_bytes as u64 + (64 << 10)).max(MIN_REQUEST_BYTES as u64),
    )
    .map_err(|m| err("max_request_bytes", m))?;
    if max_request_bytes <= max_payload_bytes {
        return Err(err(
            "max_request_bytes",
            format!("{max_request_bytes} is not more than max_payload_bytes ({max_payload_bytes}): a request must hold a whole payload and its fields"),
        ));
    }
    let max_batch =
        positive(raw.max_batch, DEFAULT_MAX_BATCH as u64).map_err(|m| err("max_batch", m))?;

    let w = raw.worker;
    let mut worker = WorkerConfig::default();
    if let Some(n) = w.concurrency {
        worker.concurrency = positive(Some(n), 1).map_err(|m| err("worker.concurrency", m))?;
    }
    if let Some(n) = w.batch {
        worker.batch = positive(Some(n), 1).map_err(|m| err("worker.batch", m))?;
    }
    if let Some(Dur(d)) = w.lease {
        if d < Duration::from_millis(300) {
            return Err(err(
                "worker.lease",
                format!("{d:?} is too short: a lease is renewed every third of itself, so it must be at least 300ms ({:?} is the default)", WorkerConfig::default().lease),
            ));
        }
        worker.lease = d;
    }
    if matches!(queue, QueueLocation::Pubsub { .. })
        && worker.lease > herald_pubsub::MAX_ACK_DEADLINE
    {
        return Err(err(
            "worker.lease",
            format!(
                "{:?} is too long for Pub/Sub, which holds a delivery for at most {:?}: use a lease up to 600s",
                worker.lease,
                herald_pubsub::MAX_ACK_DEADLINE
            ),
        ));
    }
    if let Some(Dur(d)) = w.sweep_every {
        if d.is_zero() {
            return Err(err(
                "worker.sweep_every",
                format!(
                    "must be more than 0s ({:?} is the default)",
                    WorkerConfig::default().sweep_every
                ),
            ));
        }
        worker.sweep_every = d;
    }
    if let Some(Dur(d)) = w.sweep_quiet {
        worker.sweep_quiet = d;
    }
    if let Some(Dur(d)) = w.dead_retention {
        worker.dead_retention = d;
    }
    worker.done_retention = w.done_retention.map(|Dur(d)| d);
    if let Some(r) = w.reconcile {
        worker.reconcile = r;
    }
    let worker_named = w.name.is_some();
    if let Some(name) = w.name {
        herald::client::check_name("worker.name", &name)
            .map_err(|e| err("worker.name", e.to_string()))?;
        worker.name = name;
    }
    let shutdown_grace = w.shutdown_grace.map(|Dur(d)| d).unwrap_or(DEFAULT_GRACE);
    let mut retry = RetryPolicy::default();
    if let Some(Dur(d)) = w.retry.base {
        retry.base = d;
    }
    if let Some(Dur(d)) = w.retry.max {
        retry.max = d;
    }
    if let Some(f) = w.retry.factor {
        if !(f.is_finite() && f >= 1.0) {
            return Err(err(
                "worker.retry.factor",
                format!("{f} is not a growth factor: it must be at least 1 (2 is the default)"),
            ));
        }
        retry.factor = f;
    }
    if let Some(j) = w.retry.jitter {
        if !(0.0..=1.0).contains(&j) {
            return Err(err(
                "worker.retry.jitter",
                format!("{j} is not a fraction from 0 to 1 (0.2 is the default)"),
            ));
        }
        retry.jitter = j;
    }
    worker.policy.retry = retry;

    let auth = resolve_auth(raw.auth, origins)?;
    if auth.is_open() && !listen.ip().is_loopback() {
        return Err(err(
            "listen",
            format!("{listen} is not a loopback address, and no API token is configured: without a token herald serve only listens on loopback (127.0.0.1 or [::1]). Set auth.operator_token_sha256 (or HERALD_OPERATOR_TOKEN_SHA256) to the SHA-256 of a token, or listen on 127.0.0.1"),
        ));
    }
    for name in raw.handlers.keys() {
        herald::client::check_name("handler", name)
            .map_err(|e| err(&format!("handlers.{name}"), e.to_string()))?;
    }
    Ok(ServeConfig {
        store,
        pg_schema,
        queue,
        nats_stream,
        nats_replicas,
        nats_max_ack_pending,
        nats_credentials,
        pubsub_max_outstanding,
        pubsub_credentials,
        pubsub_pull,
        pg_max_connections,
        pg_acquire_timeout,
        listen,
        max_payload_bytes,
        max_request_bytes,
        max_batch,
        worker,
        worker_named,
        shutdown_grace,
        auth,
        handlers: raw.handlers,
        file: None,
    })
}

fn positive(value: Option<u64>, default: u64) -> Result<usize, String> {
    match value {
        None => Ok(default as usize),
        Some(0) => Err("must be at least 1".to_string()),
        Some(n) => usize::try_from(n).map_err(|_| format!("{n} is too large")),
    }
}

fn parse_store(text: &str) -> Result<StoreLocation, String> {
    let text = text.trim();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return Ok(StoreLocation::Postgres(text.to_string()));
    }
    if let Some(path) = text.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err("\"sqlite://\" names no file; write it like \"sqlite://herald.db\" or \"sqlite:///var/lib/herald/herald.db\"".into());
        }
        return Ok(StoreLocation::Sqlite(PathBuf::from(path)));
    }
    if let Some((scheme, _)) = text.split_once("://") {
        return Err(format!(
            "{scheme:?} is not a store this build knows; use \"sqlite://PATH\" or \"postgres://USER@HOST/DB\""
        ));
    }
    if text.is_empty() {
        return Err("is empty; use \"sqlite://PATH\" or \"postgres://USER@HOST/DB\"".into());
    }
    Ok(StoreLocation::Sqlite(PathBuf::from(text)))
}

fn resolve_auth(raw: AuthSection, origins: &Origins) -> Result<AuthConfig, ConfigError> {
    let mut auth = AuthConfig::default();
    if let Some(hex) = raw.operator_token_sha256 {
        let key = "auth.operator_token_sha256";
        auth.operator =
            Some(digest(&hex).map_err(|m| ConfigError::invalid(origins.of(key), key, m))?);
    }
    for (tenant, hex) in raw.tenants {
        let key = format!("auth.tenants.{tenant}");
        let bad = |m: String| ConfigError::invalid(origins.of(&key), &key, m);
        herald::client::check_name("tenant", &tenant).map_err(|e| bad(e.to_string()))?;
        let d = digest(&hex).map_err(bad)?;
        if auth.operator == Some(d) {
            return Err(bad(
                "is the operator token's digest: give the tenant a token of its own".into(),
            ));
        }
        if let Some((other, _)) = auth.tenants.iter().find(|(_, t)| *t == d) {
            return Err(bad(format!(
                "is also tenant {other:?}'s digest: every tenant needs a token of its own"
            )));
        }
        auth.tenants.push((tenant, d));
    }
    Ok(auth)
}

/// Reads a SHA-256 digest written as 64 hex digits.
fn digest(hex_text: &str) -> Result<[u8; 32], String> {
    let t = hex_text.trim();
    let how = "write the token's SHA-256 as 64 hex digits, e.g. the output of `printf %s \"$TOKEN\" | sha256sum`, not the token itself";
    if t.len() != 64 {
        return Err(format!("is {} characters long; {how}", t.len()));
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(t, &mut out).map_err(|_| format!("is not hexadecimal; {how}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
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
                "worker.concurrency: must be at least 1",
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
            Some(&format!("[auth]\noperator_token_sha256 = \"{HASH_A}\"\n[auth.tenants]\nacme = \"{HASH_A}\"\n")),
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
            m.contains(
                "HERALD_WORKER_CONCURRENCY: worker.concurrency: \"x\" is not a whole number"
            ),
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
        let q = QueueLocation::Nats("nats://herald:secret@nats-1:4222".into());
        assert_eq!(q.to_string(), "nats://herald:***@nats-1:4222");
        let q = QueueLocation::Nats("tls://secret@nats-1:4222".into());
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
        let c = load_with(None, &[], Overrides::default()).unwrap();
        assert_eq!(c.nats_replicas, 1);
        assert_eq!(c.nats_max_ack_pending, 100_000);
        assert_eq!(c.nats_credentials, None);
        assert_eq!(c.pg_max_connections, 10);
        assert_eq!(c.pg_acquire_timeout, Duration::from_secs(10));
    }

    #[test]
    fn nats_and_pool_settings_are_read_from_the_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("herald.creds");
        std::fs::write(&creds, "").unwrap();
        let file = format!(
            "queue = \"nats://n1:4222\"\nnats_replicas = 3\nnats_max_ack_pending = 250000\nnats_credentials = \"{}\"\npg_max_connections = 32\npg_acquire_timeout = \"2s\"\n",
            creds.display()
        );
        let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
        assert_eq!(c.queue, QueueLocation::Nats("nats://n1:4222".into()));
        assert_eq!(c.nats_replicas, 3);
        assert_eq!(c.nats_max_ack_pending, 250_000);
        assert_eq!(c.nats_credentials, Some(creds.clone()));
        assert_eq!(c.pg_max_connections, 32);
        assert_eq!(c.pg_acquire_timeout, Duration::from_secs(2));
        let c = load_with(
            Some(&file),
            &[
                ("HERALD_NATS_REPLICAS", "5"),
                ("HERALD_NATS_MAX_ACK_PENDING", "7"),
                ("HERALD_PG_MAX_CONNECTIONS", "4"),
                ("HERALD_PG_ACQUIRE_TIMEOUT", "500ms"),
            ],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            (
                c.nats_replicas,
                c.nats_max_ack_pending,
                c.pg_max_connections
            ),
            (5, 7, 4)
        );
        assert_eq!(c.pg_acquire_timeout, Duration::from_millis(500));
        let c = load_with(
            None,
            &[("HERALD_NATS_CREDENTIALS", creds.to_str().unwrap())],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.nats_credentials, Some(creds));
    }

    #[test]
    fn a_pubsub_queue_is_read_with_its_settings_from_the_file_and_the_environment() {
        let c = load_with(None, &[], Overrides::default()).unwrap();
        assert_eq!(c.pubsub_max_outstanding, 1_000);
        assert_eq!(c.pubsub_credentials, None);
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("sa.json");
        std::fs::write(&key, "{}").unwrap();
        let file = format!(
            "queue = \"pubsub://my-project/herald?subscription=workers\"\npubsub_max_outstanding = 500\npubsub_credentials = \"{}\"\n",
            key.display()
        );
        let c = load_with(Some(&file), &[], Overrides::default()).unwrap();
        assert_eq!(
            c.queue,
            QueueLocation::Pubsub {
                project: "my-project".into(),
                topic: "herald".into(),
                subscription: "workers".into(),
            }
        );
        assert_eq!(
            c.queue.to_string(),
            "pubsub://my-project/herald?subscription=workers"
        );
        assert_eq!(c.pubsub_max_outstanding, 500);
        assert_eq!(c.pubsub_credentials, Some(key.clone()));
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
        assert_eq!(c.pubsub_max_outstanding, 64);
        assert_eq!(c.pubsub_pull, herald_pubsub::PullMode::Streaming);
        assert_eq!(c.pubsub_credentials, Some(key));
        let c = load_with(
            None,
            &[("HERALD_PUBSUB_PULL", "unary")],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.pubsub_pull, herald_pubsub::PullMode::Unary);
        assert_eq!(c.pubsub_credentials, None);
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
                "pubsub_max_outstanding = 0",
                "pubsub_max_outstanding: 0 is not a usable number of outstanding messages: write a whole number from 1 (1000 is the default",
            ),
            (
                "pubsub_credentials = \"/nonexistent/sa.json\"",
                "pubsub_credentials: cannot read /nonexistent/sa.json: No such file",
            ),
            (
                "pubsub_credentials = \"/\"",
                "pubsub_credentials: / is not a file",
            ),
            (
                "pubsub_pull = \"push\"",
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
    fn bad_nats_and_pool_settings_name_the_key_and_the_fix() {
        let cases: &[(&str, &str)] = &[
            (
                "nats_replicas = 0",
                "nats_replicas: 0 is not a number of replicas JetStream keeps: write 1 to 5",
            ),
            (
                "nats_replicas = 7",
                "nats_replicas: 7 is not a number of replicas JetStream keeps",
            ),
            (
                "nats_max_ack_pending = 0",
                "nats_max_ack_pending: 0 is not a usable MaxAckPending: write a whole number from 1",
            ),
            (
                "nats_max_ack_pending = -1",
                "nats_max_ack_pending: -1 is not a usable MaxAckPending",
            ),
            (
                "nats_credentials = \"/nonexistent/herald.creds\"",
                "nats_credentials: cannot read /nonexistent/herald.creds: No such file",
            ),
            (
                "nats_credentials = \"/\"",
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
}
