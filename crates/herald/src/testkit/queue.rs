//! Queue scenarios: what every [`Queue`] backend must do, through the trait
//! alone (plus a [`QueueBackdoor`] for what the trait can't say: raw bytes,
//! and a publish with an explicit dedup id). Real time: each scenario takes
//! a few seconds, with the ack wait at [`ACK_WAIT`].

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::memory_queue::MemoryQueue;
use crate::model::{EventId, Notification};
use crate::queue::{Delivery, Publish, Queue, QueueResult};

/// The ack wait every queue fixture must configure.
pub const ACK_WAIT: Duration = Duration::from_secs(2);

/// Timing slack: brokers round, clocks tick.
const SLACK: Duration = Duration::from_millis(100);

/// What a test needs besides the [`Queue`] trait.
#[async_trait]
pub trait QueueBackdoor: Send + Sync {
    /// Puts raw bytes on the queue, as a broken producer might.
    async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()>;
    /// Whether a second publish with the same dedup id is dropped.
    fn dedups(&self) -> bool;
    /// Publishes with an explicit dedup id (ignored when the queue doesn't dedup).
    async fn publish_with_id(&self, p: &Publish, id: &str) -> QueueResult<()>;
}

#[async_trait]
impl QueueBackdoor for MemoryQueue {
    async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()> {
        MemoryQueue::publish_raw(self, payload);
        Ok(())
    }
    fn dedups(&self) -> bool {
        false
    }
    async fn publish_with_id(&self, p: &Publish, _id: &str) -> QueueResult<()> {
        self.publish(std::slice::from_ref(p)).await
    }
}

/// A fresh, empty queue for one test (ack wait [`ACK_WAIT`]), its backdoor,
/// and whatever must live as long as it (a stream to delete).
pub struct TestQueue {
    /// The queue under test.
    pub queue: Arc<dyn Queue>,
    /// The same queue's extras.
    pub backdoor: Arc<dyn QueueBackdoor>,
    /// Dropped when the test ends.
    pub keep: Box<dyn Any + Send + Sync>,
}

/// What a queue suite's fixture may return: a queue, or `None` when its
/// service is unreachable and the fixture has said so (the test is skipped).
pub trait QueueFixture {
    /// The queue, if there is one.
    fn into_queue(self) -> Option<TestQueue>;
}

impl QueueFixture for TestQueue {
    fn into_queue(self) -> Option<TestQueue> {
        Some(self)
    }
}

impl QueueFixture for Option<TestQueue> {
    fn into_queue(self) -> Option<TestQueue> {
        self
    }
}

/// The in-process queue as a suite fixture.
pub async fn memory_queue() -> TestQueue {
    let q = Arc::new(MemoryQueue::new(ACK_WAIT));
    TestQueue {
        queue: q.clone(),
        backdoor: q,
        keep: Box::new(()),
    }
}

fn note() -> Publish {
    Publish {
        notification: Notification::one("t", EventId::new()),
        delay: Duration::ZERO,
    }
}

fn decode(d: &Delivery) -> Notification {
    Notification::decode(&d.payload).expect("a notification")
}

/// Receives one batch within `within`, or panics saying `what`.
async fn recv(q: &dyn Queue, max: usize, within: Duration, what: &str) -> Vec<Delivery> {
    let got = tokio::time::timeout(within, q.receive(max))
        .await
        .unwrap_or_else(|_| panic!("nothing received within {within:?}: {what}"))
        .expect("receive");
    assert!(!got.is_empty(), "receive returned empty: {what}");
    got
}

/// Asserts nothing is delivered for `quiet`.
async fn nothing_for(q: &dyn Queue, quiet: Duration, what: &str) {
    if let Ok(got) = tokio::time::timeout(quiet, q.receive(10)).await {
        let got = got.expect("receive");
        panic!("{what}: got {} deliveries", got.len());
    }
}

/// Published notifications are delivered, intact.
pub async fn delivers_what_is_published(t: TestQueue) {
    let q = &*t.queue;
    let sent: Vec<Publish> = (0..3).map(|_| note()).collect();
    q.publish(&sent).await.expect("publish");
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(recv(q, 10, Duration::from_secs(5), "the published notifications").await);
    }
    let want: HashSet<_> = sent
        .iter()
        .flat_map(|p| p.notification.event_ids.clone())
        .collect();
    let have: HashSet<_> = got.iter().flat_map(|d| decode(d).event_ids).collect();
    assert_eq!(have, want);
    assert_eq!(got.len(), 3, "each once");
    let tags: Vec<_> = got.iter().map(|d| d.tag.clone()).collect();
    q.ack(&tags).await.expect("ack");
}

/// A notification of many events, at the default limits, arrives whole,
/// beside one of a single event in its older one-id form.
pub async fn delivers_a_notification_of_many_events_whole(t: TestQueue) {
    let q = &*t.queue;
    let limits = crate::queue::MessageLimits::default();
    let many = Publish {
        notification: Notification {
            tenant: "t".into(),
            event_ids: (0..limits.ids).map(|_| EventId::new()).collect(),
        },
        delay: Duration::ZERO,
    };
    assert!(many.notification.encode().len() <= limits.bytes);
    let one = note();
    q.publish(&[many.clone(), one.clone()])
        .await
        .expect("publish");
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(recv(q, 10, Duration::from_secs(5), "both notifications").await);
    }
    let mut have: Vec<Notification> = got.iter().map(decode).collect();
    have.sort_by_key(|n| n.event_ids.len());
    assert_eq!(have, vec![one.notification, many.notification]);
    let tags: Vec<_> = got.iter().map(|d| d.tag.clone()).collect();
    q.ack(&tags).await.expect("ack");
}

/// An acked message is not delivered again, even past the ack wait.
pub async fn ack_removes(t: TestQueue) {
    let q = &*t.queue;
    q.publish(&[note()]).await.expect("publish");
    let got = recv(q, 1, Duration::from_secs(5), "the message").await;
    q.ack(&[got[0].tag.clone()]).await.expect("ack");
    nothing_for(
        q,
        ACK_WAIT + Duration::from_secs(1),
        "an acked message came back",
    )
    .await;
}

/// A nacked message with a delay is not delivered again before the delay.
pub async fn nack_with_delay_waits(t: TestQueue) {
    let q = &*t.queue;
    let p = note();
    q.publish(std::slice::from_ref(&p)).await.expect("publish");
    let got = recv(q, 1, Duration::from_secs(5), "the message").await;
    let delay = Duration::from_millis(1500);
    let start = Instant::now();
    q.nack(&[(got[0].tag.clone(), delay)]).await.expect("nack");
    let again = recv(q, 1, Duration::from_secs(5), "the nacked message").await;
    assert!(
        start.elapsed() + SLACK >= delay,
        "back after {:?}",
        start.elapsed()
    );
    assert_eq!(decode(&again[0]), p.notification);
    q.ack(&[again[0].tag.clone()]).await.expect("ack");
}

/// A message published with a delay is not delivered before it.
pub async fn delayed_publish_waits(t: TestQueue) {
    let q = &*t.queue;
    let mut p = note();
    p.delay = Duration::from_millis(1500);
    let start = Instant::now();
    q.publish(std::slice::from_ref(&p)).await.expect("publish");
    let got = recv(q, 1, Duration::from_secs(5), "the delayed message").await;
    assert!(
        start.elapsed() + SLACK >= p.delay,
        "delivered after {:?}",
        start.elapsed()
    );
    assert_eq!(decode(&got[0]), p.notification);
    q.ack(&[got[0].tag.clone()]).await.expect("ack");
}

/// An unanswered delivery comes back after the ack wait, not before.
pub async fn unacked_comes_back_after_the_deadline(t: TestQueue) {
    let q = &*t.queue;
    let p = note();
    q.publish(std::slice::from_ref(&p)).await.expect("publish");
    let first = recv(q, 1, Duration::from_secs(5), "the message").await;
    let start = Instant::now();
    let again = recv(q, 1, ACK_WAIT * 4, "the unacked message").await;
    assert!(
        start.elapsed() + SLACK >= ACK_WAIT,
        "back after {:?}",
        start.elapsed()
    );
    assert_eq!(again[0].payload, first[0].payload);
    q.ack(&[again[0].tag.clone()]).await.expect("ack");
}

/// `extend` holds a delivery past its first deadline.
pub async fn extend_holds_past_the_first_deadline(t: TestQueue) {
    let q = &*t.queue;
    q.publish(&[note()]).await.expect("publish");
    let first = recv(q, 1, Duration::from_secs(5), "the message").await;
    let start = Instant::now();
    tokio::time::sleep(ACK_WAIT * 3 / 4).await;
    q.extend(&[first[0].tag.clone()]).await.expect("extend");
    // Past the first deadline, within the extended one.
    let extended = start + ACK_WAIT * 3 / 4 + ACK_WAIT;
    let quiet = (start + ACK_WAIT + ACK_WAIT / 2).saturating_duration_since(Instant::now());
    nothing_for(q, quiet, "an extended delivery came back early").await;
    let again = recv(
        q,
        1,
        ACK_WAIT * 5,
        "the extended message, after the extension",
    )
    .await;
    assert!(
        Instant::now() + SLACK >= extended,
        "back {:?} before the extended deadline",
        extended.saturating_duration_since(Instant::now())
    );
    assert_eq!(again[0].payload, first[0].payload);
    q.ack(&[again[0].tag.clone()]).await.expect("ack");
}

/// Publishes with the same dedup id are one message where the queue dedups
/// (and at least one where it does not).
pub async fn duplicate_publishes_are_deduplicated(t: TestQueue) {
    let q = &*t.queue;
    let p = note();
    t.backdoor
        .publish_with_id(&p, "dup-1")
        .await
        .expect("publish");
    t.backdoor
        .publish_with_id(&p, "dup-1")
        .await
        .expect("publish again");
    // A real re-notify (another id) is not swallowed.
    t.backdoor
        .publish_with_id(&p, "dup-2")
        .await
        .expect("re-notify");
    let mut got = Vec::new();
    let want = if t.backdoor.dedups() { 2 } else { 3 };
    while got.len() < want {
        let more = recv(q, 10, Duration::from_secs(5), "the published messages").await;
        let tags: Vec<_> = more.iter().map(|d| d.tag.clone()).collect();
        q.ack(&tags).await.expect("ack");
        got.extend(more);
    }
    assert!(got.iter().all(|d| decode(d) == p.notification));
    assert_eq!(got.len(), want);
    nothing_for(q, Duration::from_millis(500), "a duplicate was delivered").await;
}

/// Garbage, terminated, is never delivered again.
pub async fn terminated_garbage_is_not_redelivered(t: TestQueue) {
    let q = &*t.queue;
    t.backdoor
        .publish_raw(b"\xff\x00garbage".to_vec())
        .await
        .expect("publish garbage");
    let got = recv(q, 1, Duration::from_secs(5), "the garbage").await;
    assert!(Notification::decode(&got[0].payload).is_err());
    q.terminate(&[got[0].tag.clone()]).await.expect("terminate");
    nothing_for(
        q,
        ACK_WAIT + Duration::from_secs(1),
        "terminated garbage came back",
    )
    .await;
}

/// `close` wakes a waiting receiver with an empty batch.
pub async fn close_wakes_receivers(t: TestQueue) {
    let q = t.queue.clone();
    let r = tokio::spawn({
        let q = q.clone();
        async move { q.receive(1).await.expect("receive") }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.close().await;
    let got = tokio::time::timeout(Duration::from_secs(5), r)
        .await
        .expect("receive returned after close")
        .expect("the task");
    assert!(got.is_empty());
    assert!(q.receive(1).await.expect("receive").is_empty());
}
