//! The `Queue` trait: what carries notifications. At-least-once, possibly
//! duplicated, possibly late; it holds no event data, only a
//! [`Notification`] (a tenant and event ids) as bytes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::Scheduled;
use crate::model::Notification;

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

/// How large one published notification may be: at most `ids` events and
/// `bytes` bytes of its wire form ([`Notification::encode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageLimits {
    /// Most events per notification, at least 1. Default 64: a message
    /// runs on one worker, so a batch emit of 128 still spreads over two,
    /// and the broker sees 1/64 of the messages.
    pub ids: usize,
    /// Most bytes per notification. Default 8 KiB: 64 ids of a tenant name
    /// of the longest (200 bytes) take about 2.7 KB; NATS takes up to 1 MB
    /// per message by default, Pub/Sub 10 MB, and Pub/Sub bills at least
    /// 1 KB per request.
    pub bytes: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            ids: 64,
            bytes: 8 << 10,
        }
    }
}

impl Publish {
    /// Groups events to notify into as few notifications as `limits`
    /// allow: the events of one tenant with the same delay share one, in
    /// the order given. A limit of one id publishes one event per message.
    pub fn group(
        events: impl IntoIterator<Item = Scheduled>,
        limits: MessageLimits,
    ) -> Vec<Publish> {
        let mut out: Vec<Publish> = Vec::new();
        // The open notification of each (tenant, delay): its index in `out`.
        let mut open: HashMap<(String, Duration), usize> = HashMap::new();
        for s in events {
            let key = (s.tenant, s.delay);
            if let Some(&i) = open.get(&key) {
                let ids = &mut out[i].notification.event_ids;
                if ids.len() < limits.ids
                    && Notification::encoded_len(&key.0, ids.len() + 1) <= limits.bytes
                {
                    ids.push(s.event_id);
                    continue;
                }
            }
            open.insert(key.clone(), out.len());
            out.push(Publish {
                notification: Notification::one(key.0, s.event_id),
                delay: key.1,
            });
        }
        out
    }
}

impl From<Scheduled> for Publish {
    fn from(s: Scheduled) -> Self {
        Publish {
            notification: Notification::one(s.tenant, s.event_id),
            delay: s.delay,
        }
    }
}

/// What a queue keeps of the messages published to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Messages survive a restart of this process (a broker holds them).
    Durable,
    /// Messages live in this process: the queue holds every message
    /// published to it since `since` (its creation), and a restarted
    /// process starts with an empty one.
    Process {
        /// When the queue was created.
        since: Instant,
    },
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

    /// How large a notification publishers make for this queue (see
    /// [`Publish::group`]). Defaults to [`MessageLimits::default`].
    fn message_limits(&self) -> MessageLimits {
        MessageLimits::default()
    }

    /// What the queue keeps across a restart of this process. For one that
    /// keeps nothing, the reconciler's first sweep notifies every due event
    /// last notified before the queue began.
    fn retention(&self) -> Retention;

    /// Stops deliveries: pending and future `receive` calls return empty.
    async fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EventId;

    fn scheduled(tenant: &str, delay_ms: u64) -> Scheduled {
        Scheduled {
            tenant: tenant.into(),
            event_id: EventId::new(),
            delay: Duration::from_millis(delay_ms),
        }
    }

    #[test]
    fn events_are_grouped_per_tenant_and_delay_within_the_limits() {
        let events = vec![
            scheduled("a", 0),
            scheduled("b", 0),
            scheduled("a", 0),
            scheduled("a", 5),
            scheduled("a", 0),
        ];
        let ids: Vec<EventId> = events.iter().map(|s| s.event_id).collect();
        let got = Publish::group(events.clone(), MessageLimits::default());
        let shape: Vec<(&str, Vec<EventId>, u64)> = got
            .iter()
            .map(|p| {
                let n = &p.notification;
                (
                    n.tenant.as_str(),
                    n.event_ids.clone(),
                    p.delay.as_millis() as u64,
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("a", vec![ids[0], ids[2], ids[4]], 0),
                ("b", vec![ids[1]], 0),
                ("a", vec![ids[3]], 5),
            ]
        );
        let one = MessageLimits {
            ids: 1,
            ..MessageLimits::default()
        };
        assert_eq!(Publish::group(events, one).len(), 5, "one id per message");
    }

    #[test]
    fn a_group_is_split_at_its_id_and_byte_limits() {
        let events: Vec<Scheduled> = (0..10).map(|_| scheduled("acme", 0)).collect();
        let by_ids = Publish::group(
            events.clone(),
            MessageLimits {
                ids: 4,
                bytes: 1 << 20,
            },
        );
        let sizes: Vec<usize> = by_ids
            .iter()
            .map(|p| p.notification.event_ids.len())
            .collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        let bytes = Notification::encoded_len("acme", 3);
        let by_bytes = Publish::group(events, MessageLimits { ids: 100, bytes });
        let sizes: Vec<usize> = by_bytes
            .iter()
            .map(|p| p.notification.event_ids.len())
            .collect();
        assert_eq!(sizes, vec![3, 3, 3, 1]);
        assert!(by_bytes
            .iter()
            .all(|p| p.notification.encode().len() <= bytes));
    }

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
