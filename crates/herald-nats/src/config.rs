//! How a [`NatsQueue`](crate::NatsQueue) names and configures its stream and consumer, and
//! the settings refused before the server is asked.

use std::path::PathBuf;
use std::time::Duration;

use herald::queue::{MessageLimits, QueueError, QueueResult};
use herald::redact::{redact_credentials, userinfo};

/// The shortest duplicate window herald accepts on an existing stream.
///
/// The tries of one publish reuse its `Nats-Msg-Id`, so the server must
/// still remember the first when the last arrives. They span at most
/// 10.6 s: two unanswered tries of `PUBLISH_TIMEOUT` (5 s) each, and
/// pauses of 200 ms and 400 ms. 15 s leaves room for a slow network.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(15);

/// The duplicate window of a stream herald creates.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// `MaxAckPending` of a consumer herald creates, by default.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 100_000;

/// The most replicas JetStream keeps of a stream.
pub const MAX_REPLICAS: usize = 5;

/// How long [`NatsQueue::connect`](crate::NatsQueue::connect) keeps trying to reach a server that
/// does not answer (refused connections, timeouts) before it gives up.
/// Refused credentials end it at once.
pub const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// How a [`NatsQueue`](crate::NatsQueue) names and configures its stream and consumer.
#[derive(Clone)]
pub struct NatsConfig {
    /// The server, e.g. `nats://127.0.0.1:4222`. It may hold credentials:
    /// `nats://user:password@host:4222` or `nats://token@host:4222`
    /// (percent-encode `@`, `:` and `/` in them).
    pub url: String,
    /// A NATS credentials file (`.creds`: a user JWT and its NKey seed), as
    /// made by `nsc`; `None` for none.
    pub credentials: Option<PathBuf>,
    /// The stream's name.
    pub stream: String,
    /// The subject notifications are published on.
    pub subject: String,
    /// The durable pull consumer's name, shared by all workers.
    pub consumer: String,
    /// `AckWait`: a delivery comes back when it is not answered or extended
    /// within it. Give it the worker's lease.
    pub ack_wait: Duration,
    /// `MaxAckPending` of a consumer herald creates: deliveries in flight
    /// (including naked, delayed ones). An existing consumer must allow at
    /// least this many, or be unlimited. At least 1.
    pub max_ack_pending: i64,
    /// The duplicate window of a stream herald creates. An existing stream
    /// must have at least [`MIN_DUPLICATE_WINDOW`].
    pub duplicate_window: Duration,
    /// Replicas of a stream herald creates, 1 to [`MAX_REPLICAS`]. The
    /// consumer herald creates follows its stream's (replicas 0). An
    /// existing stream with another number, or a consumer with a number of
    /// its own that differs from its stream's, is kept, with a warning.
    pub replicas: usize,
    /// How large a notification publishers make: events per message and
    /// bytes (NATS's own limit is the server's `max_payload`, 1 MB by
    /// default).
    pub message_limits: MessageLimits,
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("NatsConfig")
            .field("url", &redact_credentials(&self.url))
            .field("credentials", &self.credentials)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("consumer", &self.consumer)
            .field("ack_wait", &self.ack_wait)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("duplicate_window", &self.duplicate_window)
            .field("replicas", &self.replicas)
            .field("message_limits", &self.message_limits)
            .finish()
    }
}

impl NatsConfig {
    /// Names derived from `prefix` (letters, digits, `-` and `_`): stream
    /// `prefix`, subject `prefix.notify`, consumer `prefix_workers`; one
    /// replica, `MaxAckPending` [`DEFAULT_MAX_ACK_PENDING`], no credentials
    /// file.
    pub fn new(url: impl Into<String>, prefix: &str, ack_wait: Duration) -> Self {
        NatsConfig {
            url: url.into(),
            credentials: None,
            stream: prefix.to_string(),
            subject: format!("{prefix}.notify"),
            consumer: format!("{prefix}_workers"),
            ack_wait,
            max_ack_pending: DEFAULT_MAX_ACK_PENDING,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            replicas: 1,
            message_limits: MessageLimits::default(),
        }
    }

    /// Refuses settings the server would refuse later, or that break herald.
    pub(crate) fn check(&self) -> QueueResult<()> {
        let bad = |m: String| Err(QueueError::Config(m));
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return bad(format!(
                "replicas is {}: JetStream keeps 1 to {MAX_REPLICAS}",
                self.replicas
            ));
        }
        if self.max_ack_pending < 1 {
            return bad(format!(
                "max_ack_pending is {}: it must be at least 1",
                self.max_ack_pending
            ));
        }
        if self.credentials.is_some() && userinfo(&self.url).is_some() {
            return bad(format!(
                "{} holds credentials and a credentials file is given too: use one",
                redact_credentials(&self.url)
            ));
        }
        if self.duplicate_window < MIN_DUPLICATE_WINDOW {
            return bad(format!(
                "duplicate_window is {:?}: it must be at least {MIN_DUPLICATE_WINDOW:?}, the span of herald's retries of one publish",
                self.duplicate_window
            ));
        }
        Ok(())
    }
}
