//! The configuration's shape as written: every key optional, unknown keys
//! refused, durations as text.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// The file's shape. Every key is optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) store: Option<String>,
    pub(super) pg_schema: Option<String>,
    /// A location; a `[queue]` table is lifted into this and the flat
    /// keys below before the file is read (queue.rs).
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
    pub(super) pg_max_connections: Option<u64>,
    pub(super) pg_acquire_timeout: Option<Dur>,
    pub(super) pg_run_commits: Option<String>,
    pub(super) notify_linger: Option<Dur>,
    pub(super) notify_publishes: Option<u64>,
    pub(super) group_commit_writes: Option<u64>,
    pub(super) emit_timeout: Option<Dur>,
    pub(super) notify_wait: Option<Dur>,
    pub(super) idempotency_window: Option<Dur>,
    pub(super) listen: Option<String>,
    pub(super) max_payload_bytes: Option<u64>,
    pub(super) max_request_bytes: Option<u64>,
    pub(super) max_batch: Option<u64>,
    #[serde(default)]
    pub(super) worker: WorkerSection,
    #[serde(default)]
    pub(super) auth: AuthSection,
    #[serde(default)]
    pub(super) handlers: BTreeMap<String, toml::Value>,
    /// `[[subscriptions]]`: handlers subscribed to topics.
    #[serde(default)]
    pub(super) subscriptions: Vec<SubscriptionSection>,
    /// `[[schedules]]`: events emitted on a cadence.
    #[serde(default)]
    pub(super) schedules: Vec<ScheduleSection>,
}

/// One `[[subscriptions]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubscriptionSection {
    pub(super) topic: String,
    pub(super) handler: String,
    /// Left out: every tenant.
    pub(super) tenant: Option<String>,
}

/// One `[[schedules]]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleSection {
    pub(super) tenant: String,
    pub(super) name: String,
    pub(super) handler: String,
    pub(super) cron: Option<String>,
    pub(super) every: Option<Dur>,
    pub(super) timezone: Option<String>,
    /// Any TOML value, stored as its JSON.
    pub(super) payload: Option<toml::Value>,
    pub(super) max_attempts: Option<u64>,
    pub(super) missed: Option<String>,
    pub(super) missed_cap: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WorkerSection {
    pub(super) concurrency: Option<u64>,
    pub(super) batch: Option<u64>,
    pub(super) claim_ahead: Option<u64>,
    pub(super) lease: Option<Dur>,
    pub(super) sweep_every: Option<Dur>,
    pub(super) sweep_quiet: Option<Dur>,
    pub(super) dead_retention: Option<Dur>,
    pub(super) done_retention: Option<Dur>,
    pub(super) reconcile: Option<bool>,
    pub(super) schedules: Option<bool>,
    pub(super) schedule_every: Option<Dur>,
    pub(super) schedule_grace: Option<Dur>,
    pub(super) name: Option<String>,
    pub(super) shutdown_grace: Option<Dur>,
    #[serde(default)]
    pub(super) retry: RetrySection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetrySection {
    pub(super) base: Option<Dur>,
    pub(super) max: Option<Dur>,
    pub(super) factor: Option<f64>,
    pub(super) jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuthSection {
    pub(super) operator_token_sha256: Option<String>,
    #[serde(default)]
    pub(super) tenants: BTreeMap<String, String>,
}

/// A duration written as text: `"30s"`, `"5m"`, `"1h 30m"`, `"7d"`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dur(pub(super) Duration);

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

impl FileConfig {
    /// Takes the queue's keys out.
    pub(super) fn take_queue(&mut self) -> super::queue::QueueKeys {
        super::queue::QueueKeys {
            queue: self.queue.take(),
            nats_stream: self.nats_stream.take(),
            nats_replicas: self.nats_replicas.take(),
            nats_max_ack_pending: self.nats_max_ack_pending.take(),
            nats_credentials: self.nats_credentials.take(),
            pubsub_max_outstanding: self.pubsub_max_outstanding.take(),
            pubsub_credentials: self.pubsub_credentials.take(),
            pubsub_pull: self.pubsub_pull.take(),
            notify_max_ids: self.notify_max_ids.take(),
            notify_max_bytes: self.notify_max_bytes.take(),
        }
    }
}
