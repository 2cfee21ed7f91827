//! herald's distributed queue on NATS JetStream 2.9+.
//!
//! - A work-queue stream (`WorkQueue` retention) on one subject, and one
//!   durable pull consumer shared by every worker: explicit ack, `AckWait` =
//!   the worker's lease, `MaxDeliver` unlimited, no `BackOff` (it would
//!   replace `AckWait` and break the lease), `MaxAckPending` high. Both are
//!   created at start, or checked: a mismatched existing configuration is a
//!   [`QueueError::Config`] naming the field.
//! - Publish sets `Nats-Msg-Id` to `tenant:event:generation`, where the
//!   generation is the publish time in ms and a per-process counter: a retry
//!   of the same publish is deduplicated by the stream's duplicate window, a
//!   real re-notify is not.
//! - A delay is a not-before header ([`NOT_BEFORE`], unix ms): NATS 2.9 has no
//!   scheduled publish. `receive` naks a message that is not yet due with the
//!   time left, so the runtime only sees due messages.
//! - ack = confirmed (double) ack; nack = nak with delay; extend = `+WPI`;
//!   terminate = `+TERM`.
//!
//! [`Queue::max_delay`] is `None`: the not-before header holds any delay; a
//! long one is naked until due (each time with the whole time left).
//!
//! `receive` is cancel-safe in herald's sense: a message already pulled when
//! the future is dropped is not lost but comes back after `AckWait`.
//! After a server restart the client reconnects and `receive` keeps trying.

#[cfg(feature = "testing")]
pub mod testing;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::HeaderMap;
use async_trait::async_trait;
use futures::StreamExt;
use herald::queue::{Delivery, DeliveryTag, Publish, Queue, QueueError, QueueResult};
use tokio_util::sync::CancellationToken;

/// The header that holds a delayed message's due time, in unix ms.
pub const NOT_BEFORE: &str = "Herald-Not-Before";

/// How long one pull request waits for a message before asking again.
const PULL_WAIT: Duration = Duration::from_secs(5);

/// Confirmed acks awaiting the server's answer at once, per `ack` call.
const ACKS_IN_FLIGHT: usize = 256;

/// How a [`NatsQueue`] names and configures its stream and consumer.
#[derive(Clone, Debug)]
pub struct NatsConfig {
    /// The server, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The stream's name.
    pub stream: String,
    /// The subject notifications are published on.
    pub subject: String,
    /// The durable pull consumer's name, shared by all workers.
    pub consumer: String,
    /// `AckWait`: a delivery comes back when it is not answered or extended
    /// within it. Give it the worker's lease.
    pub ack_wait: Duration,
    /// `MaxAckPending`: deliveries in flight (including naked, delayed ones).
    pub max_ack_pending: i64,
    /// The stream's duplicate window (for new streams; checked only to be non-zero).
    pub duplicate_window: Duration,
}

impl NatsConfig {
    /// Names derived from `prefix` (letters, digits, `-` and `_`): stream
    /// `prefix`, subject `prefix.notify`, consumer `prefix_workers`.
    pub fn new(url: impl Into<String>, prefix: &str, ack_wait: Duration) -> Self {
        NatsConfig {
            url: url.into(),
            stream: prefix.to_string(),
            subject: format!("{prefix}.notify"),
            consumer: format!("{prefix}_workers"),
            ack_wait,
            max_ack_pending: 100_000,
            duplicate_window: Duration::from_secs(120),
        }
    }
}

/// The JetStream queue.
pub struct NatsQueue {
    client: async_nats::Client,
    js: jetstream::Context,
    consumer: consumer::Consumer<consumer::pull::Config>,
    config: NatsConfig,
    closed: CancellationToken,
    generation: AtomicU64,
    pull: tokio::sync::Mutex<PullState>,
}

fn backend(what: &str, e: impl std::fmt::Display) -> QueueError {
    QueueError::Backend(format!("{what}: {e}"))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

impl NatsQueue {
    /// Connects, and creates or checks the stream and the consumer.
    pub async fn connect(config: NatsConfig) -> QueueResult<Self> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(&config.url)
            .await
            .map_err(|e| backend(&format!("connect to {}", config.url), e))?;
        Self::with_client(client, config).await
    }

    /// [`NatsQueue::connect`] on a client of the caller's.
    pub async fn with_client(client: async_nats::Client, config: NatsConfig) -> QueueResult<Self> {
        let js = jetstream::new(client.clone());
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: config.stream.clone(),
                subjects: vec![config.subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: config.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| backend(&format!("create stream {}", config.stream), e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| backend(&format!("stream {} info", config.stream), e))?;
        check_stream(&config, &info.config)?;
        let consumer: consumer::Consumer<consumer::pull::Config> = stream
            .get_or_create_consumer(
                &config.consumer,
                consumer::pull::Config {
                    durable_name: Some(config.consumer.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: -1,
                    max_ack_pending: config.max_ack_pending,
                    filter_subject: config.subject.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| backend(&format!("create consumer {}", config.consumer), e))?;
        check_consumer(&config, &consumer.cached_info().config)?;
        Ok(NatsQueue {
            client,
            js,
            consumer,
            config,
            closed: CancellationToken::new(),
            generation: AtomicU64::new(0),
            pull: tokio::sync::Mutex::new(PullState::default()),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// The JetStream context (for tests and tools).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// Publishes with an explicit `Nats-Msg-Id`: a second publish with the
    /// same id within the duplicate window is dropped by the server.
    pub async fn publish_with_id(&self, p: &Publish, id: &str) -> QueueResult<()> {
        self.publish_one(p.notification.encode(), p.delay, id.to_string())
            .await
    }

    /// Publishes raw bytes, as a broken producer might.
    pub async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()> {
        let id = uuid::Uuid::new_v4().to_string();
        self.publish_one(payload, Duration::ZERO, id).await
    }

    fn headers(&self, id: &str, delay: Duration) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", id);
        if !delay.is_zero() {
            let due = SystemTime::now()
                .checked_add(delay)
                .map_or(u64::MAX, unix_ms);
            h.insert(NOT_BEFORE, due.to_string().as_str());
        }
        h
    }

    /// Publishes one message, retrying with the same id (so a retry of a
    /// publish that did land is deduplicated).
    async fn publish_one(&self, payload: Vec<u8>, delay: Duration, id: String) -> QueueResult<()> {
        let headers = self.headers(&id, delay);
        let mut last = None;
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            let sent = self
                .js
                .publish_with_headers(
                    self.config.subject.clone(),
                    headers.clone(),
                    payload.clone().into(),
                )
                .await;
            match sent {
                Ok(ack) => match ack.await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = Some(e.to_string()),
                },
                Err(e) => last = Some(e.to_string()),
            }
        }
        Err(QueueError::Backend(format!(
            "publish to {}: {}",
            self.config.subject,
            last.unwrap_or_default()
        )))
    }

    async fn answer(&self, tags: &[DeliveryTag], kind: impl Fn() -> AckKind) -> QueueResult<()> {
        for tag in tags {
            let payload: bytes::Bytes = kind().into();
            self.client
                .publish(tag.0.clone(), payload)
                .await
                .map_err(|e| backend("answer a delivery", e))?;
        }
        self.client
            .flush()
            .await
            .map_err(|e| backend("flush answers", e))
    }

    /// One confirmed ack: `+ACK` as a request, answered by the server once
    /// it has processed it.
    async fn ack_one(&self, tag: &DeliveryTag) -> QueueResult<()> {
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            self.client.request(tag.0.clone(), "+ACK".into()),
        )
        .await
        .map_err(|_| backend("confirm an ack", "no answer within 5 s"))?
        .map_err(|e| backend("confirm an ack", e))?;
        if let Some(status) = reply.status {
            if !status.is_success() {
                return Err(backend("confirm an ack", status));
            }
        }
        Ok(())
    }

    /// Splits pulled messages into due deliveries; naks the rest with the time left.
    async fn sort(&self, messages: Vec<jetstream::Message>, out: &mut Vec<Delivery>) {
        let now = unix_ms(SystemTime::now());
        for m in messages {
            let Some(reply) = m.reply.clone() else {
                continue;
            };
            let due = m
                .headers
                .as_ref()
                .and_then(|h| h.get(NOT_BEFORE))
                .and_then(|v| v.as_str().parse::<u64>().ok());
            if let Some(due) = due.filter(|d| *d > now) {
                let left = Duration::from_millis(due - now);
                if let Err(e) = m.ack_with(AckKind::Nak(Some(left))).await {
                    tracing::warn!("cannot nak a message that is not due: {e}");
                }
                continue;
            }
            out.push(Delivery {
                payload: m.payload.to_vec(),
                tag: DeliveryTag(reply.to_string()),
            });
        }
    }

    async fn receive_inner(&self, max: usize) -> Vec<Delivery> {
        // The pull in progress and what it brought live in `self`, not in
        // this future: a dropped `receive` leaves them for the next one.
        let mut state = self.pull.lock().await;
        loop {
            if state.ready.len() >= max || (!state.ready.is_empty() && state.batch.is_none()) {
                let take = state.ready.len().min(max);
                return state.ready.drain(..take).collect();
            }
            if state.batch.is_none() {
                let opened = if state.wait_next {
                    self.consumer
                        .batch()
                        .max_messages(1)
                        .expires(PULL_WAIT)
                        .messages()
                        .await
                } else {
                    self.consumer
                        .fetch()
                        .max_messages(max - state.ready.len())
                        .messages()
                        .await
                };
                match opened {
                    Ok(b) => state.batch = Some(b),
                    Err(e) => {
                        tracing::warn!("pull from {} failed: {e}", self.config.consumer);
                        drop(state);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        state = self.pull.lock().await;
                        continue;
                    }
                }
            }
            let next = state.batch.as_mut().expect("opened").next().await;
            match next {
                Some(Ok(m)) => {
                    let mut out = Vec::new();
                    self.sort(vec![m], &mut out).await;
                    state.ready.extend(out);
                    state.wait_next = false;
                }
                Some(Err(e)) => {
                    state.batch = None;
                    tracing::warn!("pull from {} failed: {e}", self.config.consumer);
                    drop(state);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    state = self.pull.lock().await;
                }
                None => {
                    state.batch = None;
                    // An empty no-wait fetch: wait for one next time.
                    state.wait_next = state.ready.is_empty() && !state.wait_next;
                }
            }
        }
    }
}

/// A pull in progress and the due deliveries it brought that no `receive`
/// has returned yet.
#[derive(Default)]
struct PullState {
    batch: Option<consumer::pull::Batch>,
    ready: Vec<Delivery>,
    wait_next: bool,
}

fn mismatch(
    what: &str,
    field: &str,
    want: impl std::fmt::Debug,
    got: impl std::fmt::Debug,
) -> QueueError {
    QueueError::Config(format!(
        "{what}: {field} is {got:?}, herald needs {want:?} (fix or delete it)"
    ))
}

fn check_stream(config: &NatsConfig, got: &stream::Config) -> QueueResult<()> {
    let what = format!("stream {}", config.stream);
    if got.retention != stream::RetentionPolicy::WorkQueue {
        return Err(mismatch(
            &what,
            "retention",
            stream::RetentionPolicy::WorkQueue,
            got.retention,
        ));
    }
    if !got.subjects.contains(&config.subject) {
        return Err(mismatch(
            &what,
            "subjects",
            [&config.subject],
            &got.subjects,
        ));
    }
    if got.duplicate_window.is_zero() {
        return Err(mismatch(
            &what,
            "duplicate_window",
            config.duplicate_window,
            got.duplicate_window,
        ));
    }
    Ok(())
}

fn check_consumer(config: &NatsConfig, got: &consumer::Config) -> QueueResult<()> {
    let what = format!("consumer {}", config.consumer);
    if got.ack_policy != consumer::AckPolicy::Explicit {
        return Err(mismatch(
            &what,
            "ack_policy",
            consumer::AckPolicy::Explicit,
            got.ack_policy,
        ));
    }
    // First: the server sets AckWait to the BackOff's first step.
    if !got.backoff.is_empty() {
        return Err(mismatch(
            &what,
            "backoff",
            Vec::<Duration>::new(),
            &got.backoff,
        ));
    }
    if got.ack_wait != config.ack_wait {
        return Err(mismatch(&what, "ack_wait", config.ack_wait, got.ack_wait));
    }
    if got.max_deliver > 0 {
        return Err(mismatch(&what, "max_deliver", -1, got.max_deliver));
    }
    if got.deliver_subject.is_some() {
        return Err(mismatch(
            &what,
            "deliver_subject",
            None::<String>,
            &got.deliver_subject,
        ));
    }
    if got.max_ack_pending > 0 && got.max_ack_pending < config.max_ack_pending {
        return Err(mismatch(
            &what,
            "max_ack_pending",
            config.max_ack_pending,
            got.max_ack_pending,
        ));
    }
    Ok(())
}

#[async_trait]
impl Queue for NatsQueue {
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
        let ms = unix_ms(SystemTime::now());
        for p in batch {
            let n = self.generation.fetch_add(1, Ordering::Relaxed);
            let id = format!(
                "{}:{}:{ms}-{n}",
                p.notification.tenant, p.notification.event_id
            );
            self.publish_one(p.notification.encode(), p.delay, id)
                .await?;
        }
        Ok(())
    }

    async fn receive(&self, max: usize) -> QueueResult<Vec<Delivery>> {
        let max = max.max(1);
        if self.closed.is_cancelled() {
            return Ok(Vec::new());
        }
        tokio::select! {
            _ = self.closed.cancelled() => Ok(Vec::new()),
            got = self.receive_inner(max) => Ok(got),
        }
    }

    async fn ack(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        // Many at once: one after the other, each waiting for its answer,
        // they capped a worker at about 6,000 events/s on a local server
        // (bench/src/fleet_drain.rs; 22,000 with this).
        let mut tags = tags.iter();
        let mut in_flight = futures::stream::FuturesUnordered::new();
        loop {
            while in_flight.len() < ACKS_IN_FLIGHT {
                let Some(tag) = tags.next() else { break };
                in_flight.push(self.ack_one(tag));
            }
            match in_flight.next().await {
                Some(answer) => answer?,
                None => return Ok(()),
            }
        }
    }

    async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()> {
        for (tag, delay) in batch {
            let kind = if delay.is_zero() {
                AckKind::Nak(None)
            } else {
                AckKind::Nak(Some(*delay))
            };
            self.answer(std::slice::from_ref(tag), || kind).await?;
        }
        Ok(())
    }

    async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        self.answer(tags, || AckKind::Progress).await
    }

    async fn terminate(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        self.answer(tags, || AckKind::Term).await
    }

    fn max_delay(&self) -> Option<Duration> {
        None
    }

    fn durable(&self) -> bool {
        true
    }

    async fn close(&self) {
        self.closed.cancel();
    }
}
