//! `herald serve`'s configuration: the file `herald.toml`, overridden by
//! `HERALD_…` environment variables, overridden by flags.
//!
//! The three sources are merged into one TOML table first (`sources`),
//! then read into the file's shape once (`file`), so that every key is
//! checked by the same code whatever its source, and every error names the
//! key as written and where its value came from; then defaults are applied
//! and the rest is checked (`resolve`, and `queue` for the queue's keys).
//! Unknown keys are errors.

mod file;
mod queue;
mod resolve;
mod sources;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herald::WorkerConfig;
use herald_postgres::RunCommits;

pub use file::parse_duration;
pub use queue::{QueueConfig, DEFAULT_NATS_STREAM};
pub use resolve::parse_rate;
use sources::{read_file, scalar, set, Origins, ENV_KEYS};

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
            // Never print a password.
            StoreLocation::Postgres(url) => write!(f, "{}", herald::redact::redact_password(url)),
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

/// `herald serve`'s configuration, checked and with defaults applied.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The store.
    pub store: StoreLocation,
    /// The PostgreSQL schema herald's tables are in.
    pub pg_schema: String,
    /// The queue, with its settings; its ack wait is the worker's lease.
    pub queue: QueueConfig,
    /// Most PostgreSQL connections in the pool.
    pub pg_max_connections: u32,
    /// How long a store call waits for a free PostgreSQL connection.
    pub pg_acquire_timeout: Duration,
    /// Which of claims and settles commit with `synchronous_commit = off`
    /// (by default claims; emits always wait for their flush).
    pub pg_run_commits: RunCommits,
    /// The HTTP API's address.
    pub listen: SocketAddr,
    /// The largest payload, in bytes of JSON text.
    pub max_payload_bytes: usize,
    /// The largest request body, in bytes.
    pub max_request_bytes: usize,
    /// Most events in one batch request.
    pub max_batch: usize,
    /// How long an emit's notifications wait at most for a publish in
    /// flight, to be published with other emits' ([`herald::Client::notify_linger`]).
    pub notify_linger: Duration,
    /// How many publishes of emits' notifications may be in flight before
    /// the next emits' wait to be grouped ([`herald::Client::notify_publishes`]).
    pub notify_publishes: usize,
    /// How many store writes of emits run at once; emits that arrive
    /// while all are busy are written together ([`herald::Client::group_commit`];
    /// 0: each emit on its own).
    pub group_commit_writes: usize,
    /// How long an emit waits at most for the store before it answers 503
    /// `store_unavailable` ([`herald::Client::emit_timeout`]).
    pub emit_timeout: Duration,
    /// How long an emit whose events are stored waits at most for their
    /// notifications' publish ([`herald::Client::notify_wait`]).
    pub notify_wait: Duration,
    /// How long an idempotency key keeps naming its event, at least, after
    /// the emit and after the event finished ([`herald::backend::Reconciliation::purge_keys`],
    /// docs/semantics.md).
    pub idempotency_window: Duration,
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
    /// `[handlers.NAME]` tables, as written, for [`crate::serve::build_handlers`].
    pub handlers: BTreeMap<String, toml::Value>,
    /// `[handlers.NAME.limit]`: the concurrency limits the file declares,
    /// applied to the store at start and on SIGHUP, replacing those an
    /// earlier load took from the file ([`herald::backend::Limits::sync_limits`]).
    pub run_limits: Vec<herald::Limit>,
    /// `[[subscriptions]]`: applied to the store at start, replacing the
    /// subscriptions an earlier start took from the file
    /// ([`herald::backend::Topics::sync_subscriptions`]).
    pub subscriptions: Vec<herald::Subscription>,
    /// `[[schedules]]`, checked (docs/schedules.md): applied on start and
    /// on SIGHUP.
    pub schedules: Vec<herald::schedule::ScheduleDef>,
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
        queue::lift_table(&mut table, &mut origins)?;
    }
    for (var, key, kind) in ENV_KEYS {
        if let Some(value) = env(var).filter(|v| !v.is_empty()) {
            let origin = format!("environment variable {var}");
            set(&mut table, key, scalar(*kind, &value, &origin, key)?);
            origins.set(key, origin);
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
            origins.set(key, flag.to_string());
        }
    }
    let raw: file::FileConfig = serde_path_to_error::deserialize(toml::Value::Table(table))
        .map_err(|e| {
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
                    return origins.invalid(&key, format!("unknown key; {expected}"));
                }
            }
            let key = if path == "." {
                "(top level)".to_string()
            } else {
                path
            };
            origins.invalid(&key, message)
        })?;
    let mut config = resolve::resolve(raw, &origins)?;
    config.file = file;
    Ok(config)
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
