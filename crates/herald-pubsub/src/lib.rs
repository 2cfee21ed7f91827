//! herald's distributed queue on Google Cloud Pub/Sub, the broker herald's
//! design was first written for: the store keeps the events, Pub/Sub
//! carries only `{tenant, event_id}`, and its redelivery and deadlines do
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
//! - A publish with a delay carries the [`NOT_BEFORE`] attribute (unix ms):
//!   Pub/Sub has no scheduled delivery. A message received before it is
//!   due is held back with ModifyAckDeadline for the time left, so the
//!   runtime only sees due messages.
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

pub mod settings;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use gcloud_gax::conn::{ConnectionOptions, Environment};
use gcloud_gax::grpc::{Code, Status};
use gcloud_googleapis::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest, PubsubMessage};
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::Publisher;
use gcloud_pubsub::subscriber::{ReceivedMessage, SubscriberConfig};
use gcloud_pubsub::subscription::{MessageStream, SubscribeConfig, Subscription};
use herald::queue::{Delivery, DeliveryTag, Publish, Queue, QueueError, QueueResult};
use tokio_util::sync::CancellationToken;

use settings::{hold_back_seconds, time_left, ACK_BATCH, PUBLISH_BATCH};
pub use settings::{
    PubsubConfig, PullMode, DEFAULT_MAX_OUTSTANDING, MAX_ACK_DEADLINE, MIN_ACK_DEADLINE, NOT_BEFORE,
};

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

/// A client for the emulator or the service, tried for [`CONNECT_WAIT`].
async fn client(config: &PubsubConfig) -> QueueResult<Client> {
    let emulator = config
        .emulator
        .clone()
        .or_else(|| std::env::var("PUBSUB_EMULATOR_HOST").ok())
        .filter(|h| !h.is_empty());
    let deadline = Instant::now() + CONNECT_WAIT;
    let mut waiting = false;
    loop {
        let options = ConnectionOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            // A server that went away is noticed within seconds, not when
            // the kernel gives up on the connection.
            http2_keep_alive_interval: Some(Duration::from_secs(10)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
            keep_alive_while_idle: Some(true),
            timeout: None,
        };
        let mut cc = ClientConfig {
            project_id: Some(config.project.clone()),
            connection_option: options,
            ..ClientConfig::default()
        };
        let where_ = match &emulator {
            Some(host) => {
                cc.environment = Environment::Emulator(host.clone());
                format!("the Pub/Sub emulator at {host}")
            }
            None => {
                cc = match &config.credentials {
                    Some(path) => {
                        let file = gcloud_pubsub::client::google_cloud_auth::credentials::CredentialsFile::new_from_file(
                            path.display().to_string(),
                        )
                        .await
                        .map_err(|e| {
                            QueueError::Config(format!(
                                "cannot read the credentials file {}: {e}",
                                path.display()
                            ))
                        })?;
                        cc.with_credentials(file).await
                    }
                    None => cc.with_auth().await,
                }
                .map_err(|e| {
                    QueueError::Config(format!(
                        "no Google Cloud credentials: {e} (set GOOGLE_APPLICATION_CREDENTIALS or pubsub_credentials to a service-account key file, run on Google Cloud, or set PUBSUB_EMULATOR_HOST for the emulator)"
                    ))
                })?;
                // The configured project, not the credentials'.
                cc.project_id = Some(config.project.clone());
                "Pub/Sub".to_string()
            }
        };
        match Client::new(cc).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(backend(&format!("connect to {where_}"), e));
                }
                if !waiting {
                    tracing::warn!(
                        "cannot connect to {where_} yet: {e}; trying again for up to {CONNECT_WAIT:?}"
                    );
                    waiting = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

impl Inner {
    /// Creates the topic and the subscription when missing; checks the
    /// subscription when present. Returns the warnings.
    async fn ensure(&self) -> QueueResult<Vec<String>> {
        let config = &self.config;
        let topic = self.client.topic(&config.topic);
        let exists = topic
            .exists(None)
            .await
            .map_err(|e| backend(&format!("look up topic {}", config.topic_name()), e))?;
        if !exists {
            match topic.create(None, None).await {
                Ok(()) => tracing::info!(topic = %config.topic_name(), "created the topic"),
                // Another worker was first.
                Err(e) if e.code() == Code::AlreadyExists => {}
                Err(e) => return Err(backend(&format!("create topic {}", config.topic_name()), e)),
            }
        }
        let wanted = settings::wanted_subscription(config);
        let found = match self.subscription.config(None).await {
            Ok(found) => Some(found),
            Err(e) if e.code() == Code::NotFound => None,
            Err(e) => {
                return Err(backend(
                    &format!("look up subscription {}", config.subscription_name()),
                    e,
                ))
            }
        };
        let (topic_name, got) = match found {
            Some(found) => found,
            None => {
                match self
                    .subscription
                    .create(&config.topic_name(), wanted.clone(), None)
                    .await
                {
                    Ok(()) => {
                        tracing::info!(subscription = %config.subscription_name(), ack_deadline = ?config.ack_deadline(), "created the subscription");
                    }
                    Err(e) if e.code() == Code::AlreadyExists => {}
                    Err(e) => {
                        return Err(backend(
                            &format!("create subscription {}", config.subscription_name()),
                            e,
                        ))
                    }
                }
                self.subscription.config(None).await.map_err(|e| {
                    backend(
                        &format!("look up subscription {}", config.subscription_name()),
                        e,
                    )
                })?
            }
        };
        settings::check_subscription(config, &topic_name, &got)
    }

    async fn subscribe(&self) -> Result<MessageStream, Status> {
        let secs = self.config.ack_deadline().as_secs() as i32;
        let sc = SubscriberConfig {
            stream_ack_deadline_seconds: secs,
            max_outstanding_messages: self.config.max_outstanding as i64,
            // Bytes are never the limit: a notification is under 100 bytes.
            max_outstanding_bytes: 0,
            ..SubscriberConfig::default()
        };
        self.subscription
            .subscribe(Some(
                SubscribeConfig::default()
                    .with_subscriber_config(sc)
                    .with_channel_capacity(self.config.max_outstanding),
            ))
            .await
    }

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

    /// Forgets these deliveries: they are answered.
    fn release(&self, ack_ids: impl IntoIterator<Item = impl AsRef<str>>) {
        {
            let mut held = self.held.lock().expect("held lock");
            for id in ack_ids {
                held.remove(id.as_ref());
            }
        }
        self.room.notify_waiters();
    }

    /// How many more deliveries this process may take into work:
    /// `max_outstanding` less what it holds.
    fn budget(&self) -> usize {
        let held = self.held.lock().expect("held lock").len();
        self.config.max_outstanding.saturating_sub(held)
    }

    /// Waits until this process holds fewer than `max_outstanding` deliveries.
    async fn wait_for_room(&self) -> usize {
        loop {
            let notified = self.room.notified();
            let budget = self.budget();
            if budget > 0 {
                return budget;
            }
            notified.await;
        }
    }

    /// Splits received messages into due deliveries, which are now held
    /// for the ack wait, and messages not yet due, which are held back
    /// for the time left.
    async fn sort(&self, messages: Vec<ReceivedMessage>) -> Vec<Delivery> {
        let now = unix_ms(SystemTime::now());
        let expires = Instant::now() + self.config.ack_wait;
        let mut due = Vec::with_capacity(messages.len());
        let mut later: HashMap<i32, Vec<String>> = HashMap::new();
        {
            let mut held = self.held.lock().expect("held lock");
            for m in messages {
                let not_before = m.message.attributes.get(NOT_BEFORE).map(String::as_str);
                if let Some(left) = time_left(not_before, now) {
                    later
                        .entry(hold_back_seconds(left))
                        .or_default()
                        .push(m.ack_id);
                    continue;
                }
                held.insert(m.ack_id.clone(), expires);
                due.push(Delivery {
                    payload: m.message.data,
                    tag: DeliveryTag(m.ack_id),
                });
            }
        }
        tracing::debug!(
            received = due.len() + later.values().map(Vec::len).sum::<usize>(),
            due = due.len(),
            "messages from the streaming pull"
        );
        for (seconds, ids) in later {
            // If this fails the message comes back after the stream's
            // deadline and is held back again then.
            if let Err(e) = self.modify_deadline(ids, seconds).await {
                tracing::warn!(error = %e, "cannot hold back a message that is not due");
            }
        }
        due
    }

    async fn receive(&self, max: usize) -> Vec<Delivery> {
        if self.config.pull == PullMode::Unary {
            return self.pull_unary(max).await;
        }
        let mut stream = self.stream.lock().await;
        loop {
            // The bound is kept here too: the service stops sending at
            // `max_outstanding_messages`, the emulator does not. What it
            // sends beyond stays unread and comes back after its deadline.
            let max = max.min(self.wait_for_room().await);
            if stream.is_none() {
                match self.subscribe().await {
                    Ok(s) => *stream = Some(s),
                    Err(e) => {
                        tracing::warn!(subscription = %self.config.subscription_name(), error = %e, "cannot open the streaming pull");
                        tokio::time::sleep(REOPEN_PAUSE).await;
                        continue;
                    }
                }
            }
            let open = stream.as_mut().expect("opened");
            let Some(first) = open.next().await else {
                // The pull ended for good (the subscription went away, as
                // in an emulator restart): check, make it again, reopen.
                tracing::warn!(subscription = %self.config.subscription_name(), "the streaming pull ended; opening it again");
                if let Some(old) = stream.take() {
                    old.dispose().await;
                }
                if let Err(e) = self.ensure().await {
                    tracing::warn!(error = %e, "cannot check the subscription");
                }
                tokio::time::sleep(REOPEN_PAUSE).await;
                continue;
            };
            let mut got = vec![first];
            while got.len() < max {
                match open.next().now_or_never() {
                    Some(Some(m)) => got.push(m),
                    _ => break,
                }
            }
            let due = self.sort(got).await;
            if !due.is_empty() {
                return due;
            }
        }
    }

    /// [`PullMode::Unary`]: Pull requests for the room left, until one
    /// brings a due message. A dropped call loses nothing: what its
    /// answer brought comes back after the ack deadline.
    async fn pull_unary(&self, max: usize) -> Vec<Delivery> {
        loop {
            let room = max.min(self.wait_for_room().await);
            match self.subscription.pull(room as i32, None).await {
                Ok(got) if got.is_empty() => {}
                Ok(got) => {
                    let due = self.sort(got).await;
                    if !due.is_empty() {
                        return due;
                    }
                }
                Err(e) if e.code() == Code::NotFound => {
                    tracing::warn!(subscription = %self.config.subscription_name(), "the subscription is gone; creating it again");
                    if let Err(e) = self.ensure().await {
                        tracing::warn!(error = %e, "cannot check the subscription");
                    }
                    tokio::time::sleep(REOPEN_PAUSE).await;
                }
                Err(e) => {
                    tracing::warn!(subscription = %self.config.subscription_name(), error = %e, "pull failed");
                    tokio::time::sleep(REOPEN_PAUSE).await;
                }
            }
        }
    }

    /// Hands back the deliveries whose ack wait has passed.
    async fn expire(&self) {
        let now = Instant::now();
        let lapsed: Vec<String> = {
            let mut held = self.held.lock().expect("held lock");
            let lapsed: Vec<String> = held
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &lapsed {
                held.remove(id);
            }
            lapsed
        };
        if lapsed.is_empty() {
            return;
        }
        self.room.notify_waiters();
        tracing::debug!(
            count = lapsed.len(),
            "deliveries past their ack wait: handing them back"
        );
        if let Err(e) = self.modify_deadline(lapsed, 0).await {
            // They come back after the subscription's deadline instead.
            tracing::warn!(error = %e, "cannot hand back deliveries past their ack wait");
        }
    }
}

/// Every quarter of the ack wait (50 ms to 1 s), hands back what lapsed.
async fn expiry_loop(inner: Arc<Inner>) {
    let every =
        (inner.config.ack_wait / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        inner.expire().await;
    }
}

#[async_trait]
impl Queue for PubsubQueue {
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
        let now = SystemTime::now();
        let messages = batch
            .iter()
            .map(|p| {
                let mut attributes = HashMap::new();
                if !p.delay.is_zero() {
                    let due = now.checked_add(p.delay).map_or(u64::MAX, unix_ms);
                    attributes.insert(NOT_BEFORE.to_string(), due.to_string());
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

    fn durable(&self) -> bool {
        true
    }

    async fn close(&self) {
        self.inner.closed.cancel();
        // Hand back what was received and never returned.
        if let Some(stream) = self.inner.stream.lock().await.take() {
            stream.dispose().await;
        }
    }
}
