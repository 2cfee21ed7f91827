//! Publishing the notifications of emits: those of one grouped write (or
//! of one emit written on its own) go out at once while fewer than a few
//! publishes are in flight; those that arrive while that many are wait for
//! one to end (at most a short linger) and are grouped ([`Publish::group`])
//! and published together, so emits close in time share messages.
//!
//! An emit waits for its notifications' publish at most
//! [`DEFAULT_NOTIFY_WAIT`] (or its client's setting): a broker that is away
//! (a restart, a partition) must not hold an emit whose event is stored.
//! Past that wait the publish goes on in the background; if it fails, the
//! reconciler notifies the events after `sweep_quiet`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::backend::Scheduled;
use crate::escape::escaped;
use crate::model::{Emitted, NewEvent};
use crate::queue::{Publish, Queue};

/// How long emits' notifications wait at most for a publish in flight by
/// default: see
/// [`crate::Client::notify_linger`].
pub const DEFAULT_NOTIFY_LINGER: Duration = Duration::from_millis(1);

/// How many publishes may be in flight before emits' notifications wait
/// to be grouped, by default: see [`crate::Client::notify_publishes`].
/// Four: the group commit's writes already group single emits (one
/// publish per commit), so a commit's notifications should not wait out
/// the previous commit's broker round trip (NATS's ack, about half a
/// millisecond); a broker far away (Pub/Sub, tens of milliseconds) still
/// has its publishes grouped once four are in flight (ADR 0014).
pub const DEFAULT_NOTIFY_PUBLISHES: usize = 4;

/// How long an emit waits at most for its notifications' publish, by
/// default: see [`crate::Client::notify_wait`]. A publish to a broker that
/// answers takes well under a millisecond on NATS and tens of milliseconds
/// on Pub/Sub; one to a broker that is away is retried for seconds, which
/// an emit whose event is stored does not wait out.
pub const DEFAULT_NOTIFY_WAIT: Duration = Duration::from_millis(250);

/// The events of one emit waiting to be published, and who waits for it.
struct Pending {
    events: Vec<Scheduled>,
    published: oneshot::Sender<()>,
}

/// Publishes emits' notifications, grouping those that wait for a publish.
pub(crate) struct Publisher {
    queue: Arc<dyn Queue>,
    pub(crate) linger: Duration,
    /// Publishes in flight before the next waits to be grouped (at least 1).
    pub(crate) publishes: usize,
    /// How long [`Publisher::publish`] waits for the publish at most.
    pub(crate) wait: Duration,
    /// The grouping task's inbox, started at the first publish (on the
    /// runtime that makes it).
    inbox: OnceLock<mpsc::UnboundedSender<Pending>>,
}

impl Publisher {
    /// Publishes on `queue`, grouping what arrives while `publishes` are in
    /// flight (0 counts as 1), for at most `linger` (zero: each emit's
    /// notifications at once, grouped among themselves); a publish is
    /// waited for at most `wait`.
    pub(crate) fn new(
        queue: Arc<dyn Queue>,
        linger: Duration,
        publishes: usize,
        wait: Duration,
    ) -> Self {
        Publisher {
            queue,
            linger,
            publishes: publishes.max(1),
            wait,
            inbox: OnceLock::new(),
        }
    }

    /// Publishes the notifications of `events`, with those of other emits
    /// that wait with them, and returns once they are published or after
    /// [`Publisher::wait`], whichever comes first; a publish still under
    /// way then goes on in the background (a failed publish is logged:
    /// the reconciler notifies those events).
    pub(crate) async fn publish(&self, events: Vec<Scheduled>) {
        if events.is_empty() {
            return;
        }
        let count = events.len();
        let wait = if self.linger.is_zero() {
            self.spawn_publish(events)
        } else {
            let inbox = self.inbox.get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(group(self.queue.clone(), self.linger, self.publishes, rx));
                tx
            });
            let (published, wait) = oneshot::channel();
            match inbox.send(Pending { events, published }) {
                // The grouping task is gone (its runtime was shut down).
                Err(mpsc::error::SendError(p)) => self.spawn_publish(p.events),
                Ok(()) => wait,
            }
        };
        match tokio::time::timeout(self.wait, wait).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                tracing::warn!("the notifier stopped before publishing an emit's notifications; the reconciler will notify them");
            }
            Err(_) => {
                tracing::debug!(events = count, wait = ?self.wait, "an emit's notifications are still being published; answering the emit, the publish goes on");
            }
        }
    }

    /// Publishes `events` on a task of its own; the receiver hears when it
    /// has ended.
    fn spawn_publish(&self, events: Vec<Scheduled>) -> oneshot::Receiver<()> {
        let (published, wait) = oneshot::channel();
        let queue = self.queue.clone();
        tokio::spawn(async move {
            publish(queue.as_ref(), events).await;
            let _ = published.send(());
        });
        wait
    }

    /// Publishes the notifications of `events` now, grouped among
    /// themselves (re-notifies: their pages are batches already).
    pub(crate) async fn publish_now(&self, events: Vec<Scheduled>) {
        if !events.is_empty() {
            publish(self.queue.as_ref(), events).await;
        }
    }
}

/// Publishes each pending emit at once while fewer than `publishes` are in
/// flight (no added latency when the load is light, nor for a lone emit
/// that meets another's publish); while that many are, collects what
/// arrives until one of them has finished or `linger` has passed,
/// whichever comes first, and publishes that as one group on a task of its
/// own (Nagle's rule, as group commit does for writes).
async fn group(
    queue: Arc<dyn Queue>,
    linger: Duration,
    publishes: usize,
    mut inbox: mpsc::UnboundedReceiver<Pending>,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(Notify::new());
    while let Some(first) = inbox.recv().await {
        let mut batch = vec![first];
        let mut deadline = None;
        loop {
            // Registered before the count is read, so that a publish
            // ending in between still wakes this wait.
            let one_ended = ended.notified();
            tokio::pin!(one_ended);
            one_ended.as_mut().enable();
            if in_flight.load(Ordering::SeqCst) < publishes {
                break;
            }
            let until = *deadline.get_or_insert_with(|| Instant::now() + linger);
            tokio::select! {
                p = inbox.recv() => match p {
                    Some(p) => batch.push(p),
                    None => break,
                },
                _ = &mut one_ended => {}
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        while let Ok(p) = inbox.try_recv() {
            batch.push(p);
        }
        in_flight.fetch_add(1, Ordering::SeqCst);
        let (queue, in_flight, ended) = (queue.clone(), in_flight.clone(), ended.clone());
        tokio::spawn(async move {
            let mut events = Vec::new();
            let mut waiting = Vec::with_capacity(batch.len());
            for p in batch {
                events.extend(p.events);
                waiting.push(p.published);
            }
            publish(queue.as_ref(), events).await;
            // Counted out before the emits are answered, so that an
            // emitter's next emit finds this publish over.
            in_flight.fetch_sub(1, Ordering::SeqCst);
            ended.notify_waiters();
            for w in waiting {
                let _ = w.send(());
            }
        });
    }
}

/// The notifications owed for `events` as the store answered them: one for
/// each event it created, delayed by its [`RunAt::publish_delay`] (an
/// idempotent hit was notified when it was created). No local clock is
/// read: the store resolved the due time with its own.
///
/// [`RunAt::publish_delay`]: crate::model::RunAt::publish_delay
pub(crate) fn created(events: &[NewEvent], emitted: &[Emitted]) -> Vec<Scheduled> {
    events
        .iter()
        .zip(emitted)
        .filter(|(_, e)| matches!(e, Emitted::Created(_)))
        .map(|(ev, _)| Scheduled {
            tenant: ev.tenant.clone(),
            event_id: ev.id,
            delay: ev.run_at.publish_delay(),
        })
        .collect()
}

/// Groups `events` by the queue's limits and publishes them, logging a failure.
async fn publish(queue: &dyn Queue, events: Vec<Scheduled>) {
    let count = events.len();
    let batch = Publish::group(events, queue.message_limits());
    if let Err(e) = queue.publish(&batch).await {
        tracing::warn!(error = %escaped(&e), events = count, messages = batch.len(), "events stored but not notified; the reconciler will notify them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_queue::MemoryQueue;
    use crate::model::EventId;
    use crate::queue::{Delivery, DeliveryTag, QueueResult};
    use async_trait::async_trait;
    use tokio::sync::Semaphore;

    /// A wait for publishes that outlives every test but the one of the wait.
    const LONG: Duration = Duration::from_secs(600);

    fn due(n: usize) -> Vec<Scheduled> {
        (0..n)
            .map(|_| Scheduled::due("acme".into(), EventId::new()))
            .collect()
    }

    /// A memory queue whose first `held` publishes each wait until `open`
    /// is called: publishes in flight, for as long as a test wants.
    struct Gated {
        inner: MemoryQueue,
        gate: Semaphore,
        held: usize,
        publishes: AtomicUsize,
    }

    impl Default for Gated {
        fn default() -> Self {
            Gated::holding(1)
        }
    }

    impl Gated {
        fn holding(held: usize) -> Self {
            Gated {
                inner: MemoryQueue::default(),
                gate: Semaphore::new(0),
                held,
                publishes: AtomicUsize::new(0),
            }
        }

        async fn until_publishes(&self, n: usize) {
            while self.publishes.load(Ordering::SeqCst) < n {
                tokio::task::yield_now().await;
            }
        }

        fn open(&self) {
            self.gate.add_permits(1);
        }
    }

    #[async_trait]
    impl Queue for Gated {
        async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
            if self.publishes.fetch_add(1, Ordering::SeqCst) < self.held {
                self.gate.acquire().await.expect("open").forget();
            }
            self.inner.publish(batch).await
        }
        async fn receive(&self, max: usize) -> QueueResult<Vec<Delivery>> {
            self.inner.receive(max).await
        }
        async fn ack(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
            self.inner.ack(tags).await
        }
        async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()> {
            self.inner.nack(batch).await
        }
        async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
            self.inner.extend(tags).await
        }
        fn max_delay(&self) -> Option<Duration> {
            self.inner.max_delay()
        }
        fn retention(&self) -> crate::queue::Retention {
            self.inner.retention()
        }
        async fn close(&self) {
            self.inner.close().await
        }
    }

    /// Starts `n` single-event publishes from tasks of their own.
    fn spawn_publishes(publisher: &Arc<Publisher>, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let p = publisher.clone();
                tokio::spawn(async move { p.publish(due(1)).await })
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_publish_waits_for_no_linger() {
        let queue = Arc::new(MemoryQueue::default());
        let publisher = Publisher::new(queue.clone(), Duration::from_millis(500), 1, LONG);
        let t = Instant::now();
        publisher.publish(due(1)).await;
        publisher.publish(due(1)).await;
        assert_eq!(t.elapsed(), Duration::ZERO, "nothing in flight: at once");
        assert_eq!(queue.len(), 2);
    }

    #[tokio::test]
    async fn emits_arriving_during_a_publish_share_the_next_message() {
        let queue = Arc::new(Gated::default());
        let publisher = Arc::new(Publisher::new(
            queue.clone(),
            Duration::from_secs(60),
            1,
            LONG,
        ));
        let first = spawn_publishes(&publisher, 1);
        queue.until_publishes(1).await;
        let rest = spawn_publishes(&publisher, 39);
        // Let all 39 reach the publisher while the first is held.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            queue.publishes.load(Ordering::SeqCst),
            1,
            "they wait for it"
        );
        queue.open();
        for c in first.into_iter().chain(rest) {
            c.await.unwrap();
        }
        assert_eq!(queue.publishes.load(Ordering::SeqCst), 2);
        assert_eq!(
            queue.inner.len(),
            2,
            "the first alone, the 39 in one message"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_in_flight_holds_the_next_for_at_most_the_linger() {
        let queue = Arc::new(Gated::default());
        let publisher = Arc::new(Publisher::new(
            queue.clone(),
            Duration::from_millis(5),
            1,
            LONG,
        ));
        let first = spawn_publishes(&publisher, 1);
        queue.until_publishes(1).await;
        let t = Instant::now();
        publisher.publish(due(1)).await;
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(5),
            "the linger, no longer"
        );
        assert_eq!(queue.inner.len(), 1, "published beside the held one");
        queue.open();
        first.into_iter().next().unwrap().await.unwrap();
        assert_eq!(queue.inner.len(), 2);
    }

    #[tokio::test]
    async fn a_second_publish_goes_at_once_and_the_rest_wait_for_one_to_end() {
        let queue = Arc::new(Gated::holding(2));
        let publisher = Arc::new(Publisher::new(
            queue.clone(),
            Duration::from_secs(60),
            2,
            LONG,
        ));
        let mut emits = spawn_publishes(&publisher, 1);
        queue.until_publishes(1).await;
        emits.extend(spawn_publishes(&publisher, 1));
        queue.until_publishes(2).await;
        emits.extend(spawn_publishes(&publisher, 38));
        // Let all 38 reach the publisher while both are held.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            queue.publishes.load(Ordering::SeqCst),
            2,
            "two in flight: the rest wait"
        );
        queue.open();
        queue.until_publishes(3).await;
        queue.open();
        for e in emits {
            e.await.unwrap();
        }
        assert_eq!(queue.publishes.load(Ordering::SeqCst), 3);
        assert_eq!(
            queue.inner.len(),
            3,
            "the first two alone, the 38 in one message once one ended"
        );
    }

    #[tokio::test]
    async fn with_two_allowed_the_third_waits_at_most_the_linger() {
        let queue = Arc::new(Gated::holding(2));
        let linger = Duration::from_millis(50);
        let publisher = Arc::new(Publisher::new(queue.clone(), linger, 2, LONG));
        // One at a time: two that wait together are published as one.
        let mut held = spawn_publishes(&publisher, 1);
        queue.until_publishes(1).await;
        held.extend(spawn_publishes(&publisher, 1));
        queue.until_publishes(2).await;
        let t = Instant::now();
        publisher.publish(due(1)).await;
        let waited = t.elapsed();
        assert!(waited >= linger, "it waited for the linger: {waited:?}");
        assert!(waited < Duration::from_secs(10), "not for the held ones");
        assert_eq!(queue.inner.len(), 1, "published beside the two held");
        queue.open();
        queue.open();
        for h in held {
            h.await.unwrap();
        }
        assert_eq!(queue.inner.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_that_does_not_end_is_waited_for_at_most_the_wait_and_goes_on() {
        for linger in [Duration::from_millis(1), Duration::ZERO] {
            let queue = Arc::new(Gated::default());
            let wait = Duration::from_millis(250);
            let publisher = Publisher::new(queue.clone(), linger, 4, wait);
            let t = Instant::now();
            publisher.publish(due(1)).await;
            assert_eq!(t.elapsed(), wait, "the wait, no longer (linger {linger:?})");
            assert_eq!(queue.inner.len(), 0, "still held");
            queue.open();
            while queue.inner.is_empty() {
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test]
    async fn no_linger_publishes_each_emit_on_its_own() {
        let queue = Arc::new(MemoryQueue::default());
        let publisher = Arc::new(Publisher::new(queue.clone(), Duration::ZERO, 1, LONG));
        for c in spawn_publishes(&publisher, 40) {
            c.await.unwrap();
        }
        assert_eq!(queue.len(), 40);
    }

    #[tokio::test]
    async fn a_publish_returns_once_its_notifications_are_on_the_queue() {
        let queue = Arc::new(MemoryQueue::default());
        let publisher = Publisher::new(
            queue.clone(),
            Duration::from_millis(5),
            DEFAULT_NOTIFY_PUBLISHES,
            DEFAULT_NOTIFY_WAIT,
        );
        publisher.publish(due(3)).await;
        let got = queue.receive(10).await.unwrap();
        assert_eq!(got.len(), 1);
        let n = crate::model::Notification::decode(&got[0].payload).unwrap();
        assert_eq!(n.event_ids.len(), 3);
    }
}
