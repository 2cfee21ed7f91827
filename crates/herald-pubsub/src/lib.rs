//! herald's distributed queue on Google Cloud Pub/Sub, the broker herald's
//! design was first written for: the store keeps the events, Pub/Sub
//! carries only notifications (a tenant and event ids), and its redelivery and deadlines do
//! the scheduling.
//!
//! - One topic and one pull subscription shared by every worker, created at
//!   start or checked: a subscription with settings herald did not choose
//!   (another ack deadline, a filter, ordering, exactly-once delivery, a
//!   dead-letter or retry policy, push delivery) is a [`QueueError::Config`]
//!   that names the setting and the `gcloud` command that fixes it
//!   ([`settings::check_subscription`]).
//! - Receiving is a streaming pull with `max_outstanding_messages` =
//!   [`PubsubConfig::max_outstanding`]: the service stops sending to a
//!   worker that holds that many unanswered messages. A run holds its
//!   message until its end is settled and acked. The receiver keeps the
//!   bound as well (`receive` waits for room), because the emulator
//!   ignores the stream's limit.
//! - Publishes, acks and deadline changes are batched: one request for up
//!   to [`settings::PUBLISH_BATCH`] messages or [`settings::ACK_BATCH`] ack
//!   ids.
//! - ack = Acknowledge; nack with a delay = ModifyAckDeadline(the delay,
//!   rounded up to seconds, at most 600 s; a longer delay bounces until
//!   due); extend = ModifyAckDeadline(the ack deadline); terminate = ack.
//! - A publish with a delay carries the [`DELAY`] attribute (ms): Pub/Sub
//!   has no scheduled delivery. A message received before it is due (its
//!   delay less its age since the service's publish time) is held back with
//!   ModifyAckDeadline for the time left, so the runtime only sees due
//!   messages.
//!
//! # The deadline and the lease are separate
//!
//! Pub/Sub's ack deadlines are whole seconds from 10 to 600; herald's lease
//! (the queue's ack wait, [`PubsubConfig::ack_wait`]) may be shorter (the
//! default is 9 s). So:
//!
//! - the **subscription's ack deadline** is the lease rounded up to seconds
//!   and at least 10 s ([`PubsubConfig::ack_deadline`]): how long the
//!   service keeps a delivery from everyone else when its receiver says
//!   nothing at all, because it died;
//! - the **ack wait** is kept by the receiving process itself: a delivery
//!   neither answered nor extended within it is handed back at once
//!   (ModifyAckDeadline 0), so a live worker's unattended deliveries come
//!   back after the lease as they do on NATS;
//! - `extend` (the heartbeat, every lease / 3) restarts both.
//!
//! A dead worker's events do not wait for the ack deadline: the store's
//! lease lapses after the lease, and the reconciler re-notifies them
//! (docs/adr/0006-rescue-by-any-worker.md). Its old notifications come
//! back after the deadline as duplicates, which the claim drops.
//!
//! Delivery is at least once, with duplicates; nothing here deduplicates
//! (the store's claim does). Credentials are Application Default
//! Credentials or a service-account key file; `PUBSUB_EMULATOR_HOST` (or
//! [`PubsubConfig::emulator`]) selects the emulator.

mod receive;
pub mod settings;
mod setup;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use gcloud_gax::grpc::Code;
use gcloud_googleapis::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest, PubsubMessage};
use gcloud_pubsub::client::Client;
use gcloud_pubsub::publisher::Publisher;
use gcloud_pubsub::subscription::{MessageStream, Subscription};
use herald::queue::{
    Delivery, DeliveryTag, MessageLimits, Publish, Queue, QueueError, QueueResult, Retention,
};
use tokio_util::sync::CancellationToken;

use receive::expiry_loop;
use settings::{hold_back_seconds, ACK_BATCH, PUBLISH_BATCH};
pub use settings::{
    PubsubConfig, PullMode, DEFAULT_MAX_OUTSTANDING, DELAY, MAX_ACK_DEADLINE, MIN_ACK_DEADLINE,
};
use setup::client;

/// How long [`PubsubQueue::connect`] keeps trying to reach a service that
/// does not answer before it gives up.
pub const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// How long one answer to deliveries (ack, deadline change) or one publish
/// may take, retries included: a worker must not wait for as long as the
/// service is away.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The pause before a streaming pull that ended is opened again.
const REOPEN_PAUSE: Duration = Duration::from_millis(500);

fn backend(what: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> QueueError {
    QueueError::backend(what, e)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// The Pub/Sub queue.
pub struct PubsubQueue {
    inner: Arc<Inner>,
    /// Hands back deliveries held past the ack wait; stopped on drop.
    expiry: tokio::task::JoinHandle<()>,
}

struct Inner {
    config: PubsubConfig,
    client: Client,
    subscription: Subscription,
    publisher: Publisher,
    warnings: Vec<String>,
    closed: CancellationToken,
    /// Deliveries this process holds, by ack id, and when their ack wait ends.
    held: Mutex<HashMap<String, Instant>>,
    /// Told when `held` shrinks: a receiver waiting for room may go on.
    room: tokio::sync::Notify,
    /// The streaming pull; in `self`, not in a `receive` future, so that a
    /// dropped `receive` loses nothing.
    stream: tokio::sync::Mutex<Option<MessageStream>>,
}

impl PubsubQueue {
    /// Connects (the emulator, or the service with the configured
    /// credentials) and creates or checks the topic and the subscription.
    ///
    /// # Errors
    ///
    /// [`QueueError::Config`] when the configuration, the credentials or
    /// the existing subscription do not suit herald;
    /// [`QueueError::Backend`] when the service did not answer within
    /// [`CONNECT_WAIT`].
    pub async fn connect(config: PubsubConfig) -> QueueResult<Self> {
        config.check()?;
        let client = client(&config).await?;
        let subscription = client.subscription(&config.subscription);
        let publisher = client.topic(&config.topic).new_publisher(None);
        let mut inner = Inner {
            config,
            client,
            subscription,
            publisher,
            warnings: Vec::new(),
            closed: CancellationToken::new(),
            held: Mutex::new(HashMap::new()),
            room: tokio::sync::Notify::new(),
            stream: tokio::sync::Mutex::new(None),
        };
        inner.warnings = inner.ensure().await?;
        for w in &inner.warnings {
            tracing::warn!("{w}");
        }
        let inner = Arc::new(inner);
        let expiry = tokio::spawn(expiry_loop(inner.clone()));
        Ok(PubsubQueue { inner, expiry })
    }

    /// The configuration in use.
    pub fn config(&self) -> &PubsubConfig {
        &self.inner.config
    }

    /// What herald found in the existing subscription, accepted, and would
    /// have set otherwise (also logged as warnings).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }

    /// The client (for tests and tools).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// How many deliveries this process holds now: received, not yet
    /// answered, within their ack wait.
    pub fn held(&self) -> usize {
        self.inner.held.lock().expect("held lock").len()
    }

    /// Publishes raw bytes, as a broken producer might.
    pub async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()> {
        self.inner
            .publish_messages(vec![PubsubMessage {
                data: payload,
                ..PubsubMessage::default()
            }])
            .await
    }
}

impl Drop for PubsubQueue {
    fn drop(&mut self) {
        self.expiry.abort();
    }
}

impl Inner {
    async fn publish_messages(&self, messages: Vec<PubsubMessage>) -> QueueResult<()> {
        for chunk in messages.chunks(PUBLISH_BATCH) {
            let mut recreated = false;
            loop {
                let sent = tokio::time::timeout(
                    ANSWER_WAIT,
                    self.publisher.publish_immediately(chunk.to_vec(), None),
                )
                .await;
                match sent {
                    Ok(Ok(_ids)) => break,
                    // The topic went away (an emulator restart): make it again, once.
                    Ok(Err(e)) if e.code() == Code::NotFound && !recreated => {
                        tracing::warn!(topic = %self.config.topic_name(), "the topic is gone; creating it again");
                        self.ensure().await?;
                        recreated = true;
                    }
                    Ok(Err(e)) => {
                        return Err(backend(
                            &format!("publish to {}", self.config.topic_name()),
                            e,
                        ))
                    }
                    Err(_) => {
                        return Err(backend(
                            &format!("publish to {}", self.config.topic_name()),
                            format!("no answer within {ANSWER_WAIT:?}"),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets the deadline of these ack ids to `seconds` from now (0: hand
    /// them back at once), in batches.
    async fn modify_deadline(&self, ack_ids: Vec<String>, seconds: i32) -> QueueResult<()> {
        let client = self.subscription.get_client();
        for chunk in ack_ids.chunks(ACK_BATCH) {
            let req = ModifyAckDeadlineRequest {
                subscription: self.config.subscription_name(),
                ack_ids: chunk.to_vec(),
                ack_deadline_seconds: seconds,
            };
            tokio::time::timeout(ANSWER_WAIT, client.modify_ack_deadline(req, None))
                .await
                .map_err(|_| {
                    backend(
                        "change ack deadlines",
                        format!("no answer within {ANSWER_WAIT:?}"),
                    )
                })?
                .map_err(|e| backend("change ack deadlines", e))?;
        }
        Ok(())
    }

    async fn acknowledge(&self, ack_ids: Vec<String>) -> QueueResult<()> {
        let client = self.subscription.get_client();
        for chunk in ack_ids.chunks(ACK_BATCH) {
            let req = AcknowledgeRequest {
                subscription: self.config.subscription_name(),
                ack_ids: chunk.to_vec(),
            };
            tokio::time::timeout(ANSWER_WAIT, client.acknowledge(req, None))
                .await
                .map_err(|_| backend("ack", format!("no answer within {ANSWER_WAIT:?}")))?
                .map_err(|e| backend("ack", e))?;
        }
        Ok(())
    }
}

#[async_trait]
impl Queue for PubsubQueue {
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
        let messages = batch
            .iter()
            .map(|p| {
                let mut attributes = HashMap::new();
                if !p.delay.is_zero() {
                    let ms = p.delay.as_millis().min(u128::from(u64::MAX)) as u64;
                    attributes.insert(DELAY.to_string(), ms.to_string());
                }
                PubsubMessage {
                    data: p.notification.encode(),
                    attributes,
                    ..PubsubMessage::default()
                }
            })
            .collect();
        self.inner.publish_messages(messages).await
    }

    async fn receive(&self, max: usize) -> QueueResult<Vec<Delivery>> {
        let max = max.max(1);
        let inner = &self.inner;
        if inner.closed.is_cancelled() {
            return Ok(Vec::new());
        }
        tokio::select! {
            _ = inner.closed.cancelled() => Ok(Vec::new()),
            got = inner.receive(max) => Ok(got),
        }
    }

    async fn ack(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        let ids: Vec<String> = tags.iter().map(|t| t.0.clone()).collect();
        self.inner.release(&ids);
        self.inner.acknowledge(ids).await
    }

    async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()> {
        self.inner.release(batch.iter().map(|(t, _)| &t.0));
        let mut by_seconds: HashMap<i32, Vec<String>> = HashMap::new();
        for (tag, delay) in batch {
            by_seconds
                .entry(hold_back_seconds(*delay))
                .or_default()
                .push(tag.0.clone());
        }
        for (seconds, ids) in by_seconds {
            self.inner.modify_deadline(ids, seconds).await?;
        }
        Ok(())
    }

    async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        let expires = Instant::now() + self.inner.config.ack_wait;
        let ids: Vec<String> = {
            let mut held = self.inner.held.lock().expect("held lock");
            // Only what is still held: a delivery past its ack wait was
            // handed back already.
            let mut ids = Vec::with_capacity(tags.len());
            for t in tags {
                if let Some(at) = held.get_mut(&t.0) {
                    *at = expires;
                    ids.push(t.0.clone());
                }
            }
            ids
        };
        if ids.is_empty() {
            return Ok(());
        }
        let seconds = self.inner.config.ack_deadline().as_secs() as i32;
        self.inner.modify_deadline(ids, seconds).await
    }

    fn max_delay(&self) -> Option<Duration> {
        Some(MAX_ACK_DEADLINE)
    }

    fn message_limits(&self) -> MessageLimits {
        self.inner.config.message_limits
    }

    fn retention(&self) -> Retention {
        Retention::Durable
    }

    async fn close(&self) {
        self.inner.closed.cancel();
        // Hand back what was received and never returned.
        if let Some(stream) = self.inner.stream.lock().await.take() {
            stream.dispose().await;
        }
    }
}
