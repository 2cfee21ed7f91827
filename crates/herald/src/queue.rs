//! The `Queue` trait: what carries notifications. At-least-once, possibly
//! duplicated, possibly late; it holds no event data, only
//! `{tenant, event_id}` as bytes.

use std::time::Duration;

use async_trait::async_trait;

use crate::model::Notification;
use crate::store::Scheduled;

/// Errors from a queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The broker could not be reached or refused the request.
    #[error("queue failed: {context}: {source}")]
    Backend {
        /// What failed, and on what: the operation (`publish to …`, `ack`,
        /// …) and the stream, subject or subscription.
        context: String,
        /// The cause: the client's error, or what was wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The queue's existing configuration does not match what herald needs.
    #[error("queue is misconfigured: {0}")]
    Config(String),
    /// The queue has been closed.
    #[error("the queue is closed")]
    Closed,
}

impl QueueError {
    /// A [`QueueError::Backend`]: `context` says what failed and on what,
    /// `source` why (an error, or a message).
    pub fn backend(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        QueueError::Backend {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Shorthand for queue results.
pub type QueueResult<T> = Result<T, QueueError>;

/// Identifies one delivery of a message, for ack, nack and extend. Opaque:
/// each backend puts in it what its broker needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeliveryTag(pub String);

/// A message as received: the raw bytes (which may be garbage) and its tag.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The message body; normally [`Notification::encode`]'s output.
    pub payload: Vec<u8>,
    /// How to answer for it.
    pub tag: DeliveryTag,
}

/// A notification to publish after a delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// What to say.
    pub notification: Notification,
    /// When to deliver it, from now. Queues cap it at [`Queue::max_delay`].
    pub delay: Duration,
}

impl From<Scheduled> for Publish {
    fn from(s: Scheduled) -> Self {
        Publish {
            notification: s.notification,
            delay: s.delay,
        }
    }
}

/// A message queue with delays, acks and deadlines.
///
/// A delivered message stays in flight until it is acked, nacked, or its
/// deadline passes (then it is delivered again). `extend` pushes the
/// deadline out by the queue's ack wait.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Publishes notifications.
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()>;

    /// Waits for at least one message and returns up to `max`. Returns an
    /// empty batch once the queue is closed. Must be cancel-safe: dropping
    /// the future loses no message.
    async fn receive(&self, max: usize) -> QueueResult<Vec<Delivery>>;

    /// Done with these deliveries.
    async fn ack(&self, tags: &[DeliveryTag]) -> QueueResult<()>;

    /// Deliver these again after their delays.
    async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()>;

    /// Push the deliveries' deadlines out by the ack wait: they are being worked on.
    async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()>;

    /// Removes messages that can never be processed (garbage), so they are
    /// not redelivered. Defaults to an ack.
    async fn terminate(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        self.ack(tags).await
    }

    /// The longest delay the queue can hold a message for; `None` for no limit.
    fn max_delay(&self) -> Option<Duration>;

    /// Whether messages survive a restart of this process. When they don't,
    /// the reconciler notifies every due event once at start.
    fn durable(&self) -> bool;

    /// Stops deliveries: pending and future `receive` calls return empty.
    async fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_error_says_what_failed_and_keeps_its_cause() {
        let e = QueueError::backend("publish to herald.events", std::io::Error::other("reset"));
        assert_eq!(
            e.to_string(),
            "queue failed: publish to herald.events: reset"
        );
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }
}
