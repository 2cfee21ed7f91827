//! Publishing the notifications of emits: those that arrive within a short
//! linger of each other are grouped ([`Publish::group`]) and published
//! together, so single emits close in time share messages.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::queue::{Publish, Queue};
use crate::store::Scheduled;

/// How long emits' notifications wait for others by default: see
/// [`crate::Client::notify_linger`].
pub const DEFAULT_NOTIFY_LINGER: Duration = Duration::from_millis(1);

/// The events of one emit waiting to be published, and who waits for it.
struct Pending {
    events: Vec<Scheduled>,
    published: oneshot::Sender<()>,
}

/// Publishes emits' notifications, grouped within a linger.
pub(crate) struct Publisher {
    queue: Arc<dyn Queue>,
    linger: Duration,
    /// The grouping task's inbox, started at the first publish (on the
    /// runtime that makes it).
    inbox: OnceLock<mpsc::UnboundedSender<Pending>>,
}

impl Publisher {
    /// Publishes on `queue`, grouping what arrives within `linger` (zero:
    /// each emit's notifications at once, grouped among themselves).
    pub(crate) fn new(queue: Arc<dyn Queue>, linger: Duration) -> Self {
        Publisher {
            queue,
            linger,
            inbox: OnceLock::new(),
        }
    }

    /// Publishes the notifications of `events`, with those of other emits
    /// that arrive within the linger, and returns once they are published
    /// (a failed publish is logged: the reconciler notifies those events).
    pub(crate) async fn publish(&self, events: Vec<Scheduled>) {
        if events.is_empty() {
            return;
        }
        if self.linger.is_zero() {
            return self.publish_now(events).await;
        }
        let inbox = self.inbox.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(group(self.queue.clone(), self.linger, rx));
            tx
        });
        let (published, wait) = oneshot::channel();
        match inbox.send(Pending { events, published }) {
            // The grouping task is gone (its runtime was shut down): here.
            Err(mpsc::error::SendError(p)) => self.publish_now(p.events).await,
            Ok(()) => {
                if wait.await.is_err() {
                    tracing::warn!("the notifier stopped before publishing an emit's notifications; the reconciler will notify them");
                }
            }
        }
    }

    /// Publishes the notifications of `events` now, grouped among
    /// themselves (re-notifies: their pages are batches already).
    pub(crate) async fn publish_now(&self, events: Vec<Scheduled>) {
        if !events.is_empty() {
            publish(self.queue.as_ref(), events).await;
        }
    }
}

/// Collects what arrives within `linger` of the first pending emit, and
/// publishes it on a task of its own while the next group collects.
async fn group(
    queue: Arc<dyn Queue>,
    linger: Duration,
    mut inbox: mpsc::UnboundedReceiver<Pending>,
) {
    while let Some(first) = inbox.recv().await {
        let deadline = Instant::now() + linger;
        let mut batch = vec![first];
        while let Ok(Some(p)) = tokio::time::timeout_at(deadline, inbox.recv()).await {
            batch.push(p);
        }
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut events = Vec::new();
            let mut waiting = Vec::with_capacity(batch.len());
            for p in batch {
                events.extend(p.events);
                waiting.push(p.published);
            }
            publish(queue.as_ref(), events).await;
            for w in waiting {
                let _ = w.send(());
            }
        });
    }
}

/// Groups `events` by the queue's limits and publishes them, logging a failure.
async fn publish(queue: &dyn Queue, events: Vec<Scheduled>) {
    let count = events.len();
    let batch = Publish::group(events, queue.message_limits());
    if let Err(e) = queue.publish(&batch).await {
        tracing::warn!(error = %e, events = count, messages = batch.len(), "events stored but not notified; the reconciler will notify them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_queue::MemoryQueue;
    use crate::model::EventId;

    fn due(n: usize) -> Vec<Scheduled> {
        (0..n)
            .map(|_| Scheduled::due("acme".into(), EventId::new()))
            .collect()
    }

    /// Publishes one event per call from 40 tasks at once; returns the
    /// messages on the queue.
    async fn forty_single_emits(linger: Duration) -> usize {
        let queue = Arc::new(MemoryQueue::default());
        let publisher = Arc::new(Publisher::new(queue.clone(), linger));
        let calls: Vec<_> = (0..40)
            .map(|_| {
                let p = publisher.clone();
                tokio::spawn(async move { p.publish(due(1)).await })
            })
            .collect();
        for c in calls {
            c.await.unwrap();
        }
        queue.len()
    }

    #[tokio::test]
    async fn single_emits_within_the_linger_share_messages() {
        // A long linger, so that the 40 calls surely fall within it: they
        // fit in one message of 64 ids.
        assert_eq!(forty_single_emits(Duration::from_millis(500)).await, 1);
        assert_eq!(
            forty_single_emits(Duration::ZERO).await,
            40,
            "no linger: one each"
        );
    }

    #[tokio::test]
    async fn a_publish_returns_once_its_notifications_are_on_the_queue() {
        let queue = Arc::new(MemoryQueue::default());
        let publisher = Publisher::new(queue.clone(), Duration::from_millis(5));
        publisher.publish(due(3)).await;
        let got = queue.receive(10).await.unwrap();
        assert_eq!(got.len(), 1);
        let n = crate::model::Notification::decode(&got[0].payload).unwrap();
        assert_eq!(n.event_ids.len(), 3);
    }
}
