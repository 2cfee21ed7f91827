//! The three sources of the configuration (the file, `HERALD_…` variables,
//! flags) merged into one TOML table, and where each key's value came from.

use std::collections::BTreeMap;
use std::path::Path;

use super::ConfigError;

/// What type an overridable key has, to read it from a string.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Text,
    Integer,
    Boolean,
    Float,
}

/// Keys that environment variables can set: `HERALD_` + the key in capitals
/// with dots as underscores, except the operator token (`HERALD_OPERATOR_TOKEN_SHA256`).
pub(super) const ENV_KEYS: &[(&str, &str, Kind)] = &[
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
    ("HERALD_NOTIFY_MAX_IDS", "notify_max_ids", Kind::Integer),
    ("HERALD_NOTIFY_MAX_BYTES", "notify_max_bytes", Kind::Integer),
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
    ("HERALD_PG_RUN_COMMITS", "pg_run_commits", Kind::Text),
    ("HERALD_LISTEN", "listen", Kind::Text),
    ("HERALD_NOTIFY_LINGER", "notify_linger", Kind::Text),
    ("HERALD_NOTIFY_PUBLISHES", "notify_publishes", Kind::Integer),
    ("HERALD_NOTIFY_WAIT", "notify_wait", Kind::Text),
    ("HERALD_EMIT_TIMEOUT", "emit_timeout", Kind::Text),
    (
        "HERALD_IDEMPOTENCY_WINDOW",
        "idempotency_window",
        Kind::Text,
    ),
    (
        "HERALD_GROUP_COMMIT_WRITES",
        "group_commit_writes",
        Kind::Integer,
    ),
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
    (
        "HERALD_WORKER_CLAIM_AHEAD",
        "worker.claim_ahead",
        Kind::Integer,
    ),
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
pub(super) struct Origins {
    pub(super) file: Option<String>,
    by_key: BTreeMap<String, String>,
    /// Keys written under another name in the file (`queue.pull` for
    /// `pubsub_pull`), to name them as written.
    written_as: BTreeMap<String, String>,
}

impl Origins {
    /// Records that `key`'s value came from `origin`: it is no longer the
    /// file's, so it is named as itself.
    pub(super) fn set(&mut self, key: &str, origin: String) {
        self.written_as.remove(key);
        self.by_key.insert(key.to_string(), origin);
    }

    /// Records that the file wrote `key` as `written`.
    pub(super) fn name_as(&mut self, key: &str, written: &str) {
        self.written_as.insert(key.to_string(), written.to_string());
    }

    /// `key` as its source wrote it.
    pub(super) fn name(&self, key: &str) -> String {
        self.written_as
            .get(key)
            .cloned()
            .unwrap_or_else(|| key.to_string())
    }

    /// An error about `key`, naming it and its origin as written.
    pub(super) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.of(key), self.name(key), message)
    }

    /// The origin of `key`, or of the closest enclosing key that has one.
    pub(super) fn of(&self, key: &str) -> String {
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

pub(super) fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
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
pub(super) fn set(table: &mut toml::Table, key: &str, value: toml::Value) {
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

pub(super) fn scalar(
    kind: Kind,
    value: &str,
    origin: &str,
    key: &str,
) -> Result<toml::Value, ConfigError> {
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
