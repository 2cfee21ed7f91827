//! herald's distributed queue on NATS JetStream 2.9+.
//!
//! - A work-queue stream (`WorkQueue` retention, file storage) on one
//!   subject, and one durable pull consumer shared by every worker: explicit
//!   ack, `AckWait` = the worker's lease, `MaxDeliver` unlimited, no
//!   `BackOff` (it would replace `AckWait` and break the lease),
//!   `MaxAckPending` high. Both are created at start with
//!   [`NatsConfig::replicas`], or checked: a mismatched existing
//!   configuration is a [`QueueError::Config`] naming the field; a different
//!   number of replicas is only a warning ([`NatsQueue::warnings`]).
//! - Publish sets `Nats-Msg-Id` to `tenant:event:generation`, where the
//!   generation is the publish time in ms and a per-process counter: a retry
//!   of the same publish is deduplicated by the stream's duplicate window
//!   (at least [`MIN_DUPLICATE_WINDOW`]), a real re-notify is not.
//! - A delay is a header ([`DELAY`], ms): NATS 2.9 has no scheduled publish.
//!   `receive` naks a message's first delivery with the delay less the time
//!   it spent in the stream, so the runtime only sees due messages, and no
//!   publisher's clock moves the due time.
//! - ack = confirmed (double) ack; nack = nak with delay; extend = `+WPI`;
//!   terminate = `+TERM`.
//! - Credentials: `user:password@` or `token@` in the URL, or a `.creds`
//!   file ([`NatsConfig::credentials`]). They are passed to the client
//!   apart from the URL, and [`herald::redact::redact_credentials`] hides them in every message.
//!
//! [`Queue::max_delay`] is `None`: the not-before header holds any delay; a
//! long one is naked until due (each time with the whole time left).
//!
//! `receive` is cancel-safe in herald's sense: a message already pulled when
//! the future is dropped is not lost but comes back after `AckWait`.
//! After a server restart the client reconnects and `receive` keeps trying.

mod auth;
mod config;
mod setup;
#[cfg(feature = "testing")]
pub mod testing;

use auth::{refused, split_auth, UrlAuth};
use setup::{check_consumer, check_stream};

pub use config::{
    NatsConfig, CONNECT_WAIT, DEFAULT_DUPLICATE_WINDOW, DEFAULT_MAX_ACK_PENDING, MAX_REPLICAS,
    MIN_DUPLICATE_WINDOW,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::{ConnectErrorKind, HeaderMap};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use herald::escape::escaped;
use herald::queue::{
    Delivery, DeliveryTag, MessageLimits, Publish, Queue, QueueError, QueueResult, Retention,
};
use herald::redact::redact_credentials;
use tokio_util::sync::CancellationToken;

/// The header that holds a delayed message's delay, in ms: a duration, not
/// a time, so that the publisher's clock plays no part. The receiver naks
/// the first delivery for the delay less the time the message spent in the
/// stream (from the server's publish timestamp); later deliveries are due
/// (the store judges `run_at` by its own clock and a worker puts back an
/// event that is not due for the time left).
pub const DELAY: &str = "Herald-Delay";

/// How long one pull request waits for a message before asking again, at
/// most; never more than a third of `AckWait` (see [`NatsQueue::pull_wait`]).
const PULL_WAIT: Duration = Duration::from_secs(5);

/// How long a pull may go without a message or its end before it is given
/// up. A waiting pull ends by itself after `PULL_WAIT`, when the server
/// says so; one whose request or end was lost (the server restarted in
/// between) would otherwise never end.
const PULL_STALL: Duration = Duration::from_secs(10);

/// How long an answer to deliveries (ack, nak, in progress, term) may wait
/// for the server. async-nats holds a flush, and a request, until it has
/// reconnected: without a bound, a worker's answers would wait for as long
/// as the server is down.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How many times one publish is tried, with the same `Nats-Msg-Id`.
const PUBLISH_TRIES: u32 = 3;
/// The pause before the n-th retry of a publish is n times this.
const PUBLISH_PAUSE: Duration = Duration::from_millis(200);
/// How long a publish waits for the server's ack (the JetStream context's
/// request timeout).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The JetStream queue.
pub struct NatsQueue {
    client: async_nats::Client,
    js: jetstream::Context,
    consumer: consumer::Consumer<consumer::pull::Config>,
    config: NatsConfig,
    warnings: Vec<String>,
    closed: CancellationToken,
    generation: AtomicU64,
    pull: tokio::sync::Mutex<PullState>,
}

fn backend(what: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> QueueError {
    QueueError::backend(what, e)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// How long to put a delivery back before it is due: on its first delivery
/// (`first`: the delivery count and the server's publish time, unix ms), the
/// delay of its [`DELAY`] header less the time it has spent in the stream
/// (by this process's clock against the server's, at least zero); `None` to
/// deliver it. A clock ahead of the server's can only shorten the wait, and
/// a delivery that comes early costs one claim that the store answers with
/// the time left by its own clock; a clock behind adds nothing, since the
/// age is never counted below zero. A redelivery is always delivered: the
/// server already held it back, for this wait or for a worker's nack.
fn first_delivery_wait(
    delay: Option<u64>,
    first: Option<(i64, u64)>,
    now: u64,
) -> Option<Duration> {
    let delay = delay.filter(|d| *d > 0)?;
    let (delivered, published) = first?;
    if delivered > 1 {
        return None;
    }
    let left = delay.saturating_sub(now.saturating_sub(published));
    (left > 0).then(|| Duration::from_millis(left))
}

impl NatsQueue {
    /// Connects with the URL's credentials and the credentials file, and
    /// creates or checks the stream and the consumer.
    ///
    /// A server that does not answer is tried again for [`CONNECT_WAIT`];
    /// once connected, the client reconnects by itself for ever.
    ///
    /// # Errors
    ///
    /// [`QueueError::Config`] when the server refuses the credentials, the
    /// credentials file can't be read, or the stream or consumer do not
    /// suit herald; [`QueueError::Backend`] when no server answered.
    pub async fn connect(config: NatsConfig) -> QueueResult<Self> {
        config.check()?;
        let shown = redact_credentials(&config.url);
        let (url, auth) = split_auth(&config.url);
        let creds = match &config.credentials {
            Some(path) => Some(tokio::fs::read_to_string(path).await.map_err(|e| {
                QueueError::Config(format!(
                    "cannot read the credentials file {}: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        let deadline = Instant::now() + CONNECT_WAIT;
        let mut waiting = false;
        let client = loop {
            let mut options =
                async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5));
            options = match &auth {
                UrlAuth::None => options,
                UrlAuth::UserPassword(user, pass) => {
                    options.user_and_password(user.clone(), pass.clone())
                }
                UrlAuth::Token(token) => options.token(token.clone()),
            };
            if let (Some(text), Some(path)) = (&creds, &config.credentials) {
                options = options.credentials(text).map_err(|e| {
                    QueueError::Config(format!(
                        "the credentials file {} is not a NATS .creds file: {e}",
                        path.display()
                    ))
                })?;
            }
            match options.connect(url.as_str()).await {
                Ok(client) => break client,
                Err(e)
                    if matches!(
                        e.kind(),
                        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication
                    ) =>
                {
                    return Err(QueueError::Config(format!(
                        "connect to {shown}: {} ({})",
                        refused(&auth, config.credentials.as_deref()),
                        e.kind()
                    )));
                }
                Err(e) if matches!(e.kind(), ConnectErrorKind::ServerParse) => {
                    return Err(QueueError::Config(format!(
                        "connect to {shown}: {e}: write the URL like nats://host:4222"
                    )));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(backend(
                        &format!("connect to {shown}"),
                        format!("{e} (tried for {CONNECT_WAIT:?})"),
                    ));
                }
                Err(e) => {
                    if !waiting {
                        tracing::warn!(
                            "cannot connect to {shown} yet: {e}; trying again for up to {CONNECT_WAIT:?}",
                            e = escaped(&e)
                        );
                        waiting = true;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        Self::with_client(client, config).await
    }

    /// [`NatsQueue::connect`] on a client of the caller's (`config.url` and
    /// `config.credentials` are then not used).
    pub async fn with_client(client: async_nats::Client, config: NatsConfig) -> QueueResult<Self> {
        config.check()?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(PUBLISH_TIMEOUT);
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: config.stream.clone(),
                subjects: vec![config.subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: config.duplicate_window,
                num_replicas: config.replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| backend(&format!("create stream {}", config.stream), e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| backend(&format!("stream {} info", config.stream), e))?;
        let mut warnings = check_stream(&config, &info.config)?;
        let stream_replicas = info.config.num_replicas;
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
                    // 0: as many as the stream, whoever created it, and
                    // still after `nats stream edit --replicas`.
                    num_replicas: 0,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| backend(&format!("create consumer {}", config.consumer), e))?;
        warnings.extend(check_consumer(
            &config,
            &consumer.cached_info().config,
            stream_replicas,
        )?);
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(NatsQueue {
            client,
            js,
            consumer,
            config,
            warnings,
            closed: CancellationToken::new(),
            generation: AtomicU64::new(0),
            pull: tokio::sync::Mutex::new(PullState::default()),
        })
    }

    /// What herald found in the existing stream and consumer, accepted, and
    /// would have set otherwise (also logged as warnings): a number of
    /// replicas other than [`NatsConfig::replicas`].
    pub fn warnings(&self) -> &[String] {
        &self.warnings
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
            let ms = delay.as_millis().min(u128::from(u64::MAX)) as u64;
            h.insert(DELAY, ms.to_string().as_str());
        }
        h
    }

    /// How long a waiting pull lasts: [`PULL_WAIT`], or a third of
    /// `AckWait` if that is shorter. A worker killed with a pull waiting
    /// leaves it at the server until it expires, and the server may hand
    /// it a redelivered message, which then waits another `AckWait`. The
    /// killed worker's own deliveries come back no sooner than two thirds
    /// of `AckWait` after the kill (the heartbeat's in-progress acks), so
    /// by then its pulls have expired.
    fn pull_wait(&self) -> Duration {
        PULL_WAIT
            .min(self.config.ack_wait / 3)
            .max(Duration::from_millis(50))
    }

    /// Publishes one message; see [`NatsQueue::publish_all`].
    async fn publish_one(&self, payload: Vec<u8>, delay: Duration, id: String) -> QueueResult<()> {
        self.publish_all(vec![(payload, delay, id)]).await
    }

    /// Publishes messages `(payload, delay, Nats-Msg-Id)`, pipelined: every
    /// message is sent before any acknowledgement is awaited, and the
    /// acknowledgements are awaited together, so a batch costs about one
    /// round trip, not one per message. What did not land is sent again,
    /// [`PUBLISH_TRIES`] tries in all, with the same id, so one that landed
    /// after all is dropped by the stream's duplicate window. A batch
    /// therefore takes at most [`PUBLISH_TRIES`] acknowledgement timeouts,
    /// however large it is and however long the server is away.
    async fn publish_all(&self, messages: Vec<(Vec<u8>, Duration, String)>) -> QueueResult<()> {
        let mut left: Vec<usize> = (0..messages.len()).collect();
        type Cause = Box<dyn std::error::Error + Send + Sync>;
        let mut last: Option<Cause> = None;
        for attempt in 0..PUBLISH_TRIES {
            if attempt > 0 {
                tokio::time::sleep(PUBLISH_PAUSE * attempt).await;
            }
            let mut sent = Vec::with_capacity(left.len());
            for &i in &left {
                let (payload, delay, id) = &messages[i];
                let ack = self
                    .js
                    .publish_with_headers(
                        self.config.subject.clone(),
                        self.headers(id, *delay),
                        payload.clone().into(),
                    )
                    .await;
                sent.push((i, ack));
            }
            // Together: each acknowledgement's timeout starts when it is
            // awaited, so awaiting them in turn would add up the timeouts.
            let landed = futures::future::join_all(sent.into_iter().map(|(i, ack)| async move {
                let landed = match ack {
                    Ok(ack) => ack.await.map(|_| ()).map_err(Cause::from),
                    Err(e) => Err(Cause::from(e)),
                };
                (i, landed)
            }))
            .await;
            let mut failed = Vec::new();
            for (i, landed) in landed {
                if let Err(e) = landed {
                    last = Some(e);
                    failed.push(i);
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            left = failed;
        }
        Err(QueueError::backend(
            format!(
                "publish to {}: {} of {} messages not acknowledged after {PUBLISH_TRIES} tries",
                self.config.subject,
                left.len(),
                messages.len()
            ),
            last.unwrap_or_else(|| "no try was made".into()),
        ))
    }

    /// Sends unconfirmed answers (nak, in-progress, term), then one flush,
    /// all within [`ANSWER_WAIT`]. Answers that did not go out are
    /// harmless: the server redelivers after `AckWait`.
    async fn answer(&self, answers: Vec<(&DeliveryTag, AckKind)>) -> QueueResult<()> {
        let send = async {
            for (tag, kind) in answers {
                let payload: bytes::Bytes = kind.into();
                self.client
                    .publish(tag.0.clone(), payload)
                    .await
                    .map_err(|e| backend("answer a delivery", e))?;
            }
            self.client
                .flush()
                .await
                .map_err(|e| backend("flush answers", e))
        };
        tokio::time::timeout(ANSWER_WAIT, send)
            .await
            .map_err(|_| backend("flush answers", format!("no answer within {ANSWER_WAIT:?}")))?
    }

    /// Splits pulled messages into due deliveries; naks the rest with the time left.
    async fn sort(&self, messages: Vec<jetstream::Message>, out: &mut Vec<Delivery>) {
        let now = unix_ms(SystemTime::now());
        for m in messages {
            let Some(reply) = m.reply.clone() else {
                continue;
            };
            let delay = m
                .headers
                .as_ref()
                .and_then(|h| h.get(DELAY))
                .and_then(|v| v.as_str().parse::<u64>().ok());
            let first = m.info().ok().map(|i| {
                let published = i.published.unix_timestamp_nanos() / 1_000_000;
                (i.delivered, published.clamp(0, i128::from(u64::MAX)) as u64)
            });
            if let Some(left) = first_delivery_wait(delay, first, now) {
                if let Err(e) = m.ack_with(AckKind::Nak(Some(left))).await {
                    tracing::warn!("cannot nak a message that is not due: {}", escaped(&e));
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
            // With deliveries in hand, only what the pull has already
            // brought is added, without waiting.
            let waiting = state.ready.is_empty();
            if !waiting && (state.ready.len() >= max || state.batch.is_none()) {
                return state.take(max);
            }
            if state.batch.is_none() {
                // One waiting pull for what the worker can take now, kept
                // open across calls until it has brought that many or
                // expires: a message arriving meanwhile is delivered at
                // once, without a request per message. It never asks for
                // more than the free claims, since only its own deliveries
                // take claims until it ends.
                let opened = self
                    .consumer
                    .batch()
                    .max_messages(max)
                    .expires(self.pull_wait())
                    .messages()
                    .await;
                match opened {
                    Ok(b) => state.batch = Some(b),
                    Err(e) => {
                        tracing::warn!(
                            "pull from {} failed: {}",
                            self.config.consumer,
                            escaped(&e)
                        );
                        drop(state);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        state = self.pull.lock().await;
                        continue;
                    }
                }
            }
            let batch = state.batch.as_mut().expect("opened");
            let next = if waiting {
                let Ok(next) = tokio::time::timeout(PULL_STALL, batch.next()).await else {
                    // Its messages, if any were sent, come back after AckWait.
                    tracing::warn!(
                        "pull from {} got no answer within {PULL_STALL:?}; pulling again",
                        self.config.consumer
                    );
                    state.batch = None;
                    continue;
                };
                next
            } else {
                match batch.next().now_or_never() {
                    Some(next) => next,
                    None => return state.take(max),
                }
            };
            match next {
                Some(Ok(m)) => {
                    let mut out = Vec::new();
                    self.sort(vec![m], &mut out).await;
                    state.ready.extend(out);
                }
                Some(Err(e)) => {
                    state.batch = None;
                    tracing::warn!("pull from {} failed: {}", self.config.consumer, escaped(&e));
                    if waiting {
                        drop(state);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        state = self.pull.lock().await;
                    }
                }
                // It brought all it asked for, or expired: pull again.
                None => state.batch = None,
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
}

impl PullState {
    /// Up to `max` of the deliveries in hand, oldest first.
    fn take(&mut self, max: usize) -> Vec<Delivery> {
        let take = self.ready.len().min(max);
        self.ready.drain(..take).collect()
    }
}

#[async_trait]
impl Queue for NatsQueue {
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
        let ms = unix_ms(SystemTime::now());
        let messages: Vec<(Vec<u8>, Duration, String)> = batch
            .iter()
            .map(|p| {
                let n = self.generation.fetch_add(1, Ordering::Relaxed);
                // The first event names the message; the rest are counted.
                let ids = &p.notification.event_ids;
                let first = ids.first().map(ToString::to_string).unwrap_or_default();
                let id = format!(
                    "{}:{first}+{}:{ms}-{n}",
                    p.notification.tenant,
                    ids.len().saturating_sub(1)
                );
                (p.notification.encode(), p.delay, id)
            })
            .collect();
        self.publish_all(messages).await
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
        // Confirmed acks, all in flight at once: a batch waits about one
        // round trip for its confirmations.
        let confirm = |tag: &DeliveryTag| {
            let request = self.client.request(tag.0.clone(), "+ACK".into());
            async move {
                let reply = tokio::time::timeout(ANSWER_WAIT, request)
                    .await
                    .map_err(|_| {
                        backend(
                            "confirm an ack",
                            format!("no answer within {ANSWER_WAIT:?}"),
                        )
                    })?
                    .map_err(|e| backend("confirm an ack", e))?;
                match reply.status {
                    Some(status) if !status.is_success() => Err(backend(
                        "confirm an ack",
                        format!("the server answered {status}"),
                    )),
                    _ => Ok(()),
                }
            }
        };
        futures::future::try_join_all(tags.iter().map(confirm)).await?;
        Ok(())
    }

    async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()> {
        let naks = batch
            .iter()
            .map(|(tag, delay)| {
                let kind = if delay.is_zero() {
                    AckKind::Nak(None)
                } else {
                    AckKind::Nak(Some(*delay))
                };
                (tag, kind)
            })
            .collect();
        self.answer(naks).await
    }

    async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        self.answer(tags.iter().map(|t| (t, AckKind::Progress)).collect())
            .await
    }

    async fn terminate(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        self.answer(tags.iter().map(|t| (t, AckKind::Term)).collect())
            .await
    }

    fn max_delay(&self) -> Option<Duration> {
        None
    }

    fn message_limits(&self) -> MessageLimits {
        self.config.message_limits
    }

    fn retention(&self) -> Retention {
        Retention::Durable
    }

    async fn close(&self) {
        self.closed.cancel();
    }
}

#[cfg(test)]
mod tests;
