//! The in-process delay queue: the embedded default. Nothing survives the
//! process, so it reports when it began ([`Retention::Process`]) and the
//! reconciler's first sweep notifies every due event last notified before.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::queue::{Delivery, DeliveryTag, MessageLimits, Publish, Queue, QueueResult, Retention};

/// A delay queue in memory with ack deadlines, like a broker's.
pub struct MemoryQueue {
    state: Mutex<State>,
    wake: Notify,
    ack_wait: Duration,
    limits: MessageLimits,
    since: std::time::Instant,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Vec<u8>>,
    /// Waiting for their delay, by (due, sequence).
    delayed: BTreeMap<(Instant, u64), Vec<u8>>,
    /// Delivered and not yet answered, by delivery number.
    in_flight: HashMap<u64, (Vec<u8>, Instant)>,
    /// The same deliveries by (deadline, delivery number).
    deadlines: BTreeMap<(Instant, u64), ()>,
    seq: u64,
    closed: bool,
}

impl State {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Moves due delayed messages and overdue deliveries to `ready`, and
    /// returns the next time something becomes due.
    fn promote(&mut self, now: Instant) -> Option<Instant> {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            self.ready.push_back(entry.remove());
        }
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (_, n) = *entry.key();
            entry.remove();
            if let Some((payload, _)) = self.in_flight.remove(&n) {
                self.ready.push_back(payload);
            }
        }
        let next_delayed = self.delayed.keys().next().map(|k| k.0);
        let next_deadline = self.deadlines.keys().next().map(|k| k.0);
        match (next_delayed, next_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn schedule(&mut self, payload: Vec<u8>, delay: Duration, now: Instant) {
        if delay.is_zero() {
            self.ready.push_back(payload);
        } else {
            let seq = self.next_seq();
            // A century is forever here; `Instant` would overflow on Duration::MAX.
            let due = now
                .checked_add(delay.min(Duration::from_secs(100 * 365 * 24 * 3600)))
                .unwrap_or(now);
            self.delayed.insert((due, seq), payload);
        }
    }

    fn answer(&mut self, tag: &DeliveryTag) -> Option<Vec<u8>> {
        let n: u64 = tag.0.parse().ok()?;
        let (payload, deadline) = self.in_flight.remove(&n)?;
        self.deadlines.remove(&(deadline, n));
        Some(payload)
    }
}

impl MemoryQueue {
    /// A queue whose deliveries come back after `ack_wait` unless answered
    /// or extended. Give it the worker's lease duration.
    pub fn new(ack_wait: Duration) -> Self {
        MemoryQueue {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            ack_wait,
            limits: MessageLimits::default(),
            since: std::time::Instant::now(),
        }
    }

    /// Sets how large a notification publishers make for this queue (one
    /// id per message turns batching off).
    pub fn with_message_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Messages held (ready, delayed and in flight).
    pub fn len(&self) -> usize {
        let s = self.state.lock().expect("queue lock");
        s.ready.len() + s.delayed.len() + s.in_flight.len()
    }

    /// True when no message is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Puts raw bytes on the queue, as a broker might deliver garbage.
    pub fn publish_raw(&self, payload: Vec<u8>) {
        self.state
            .lock()
            .expect("queue lock")
            .ready
            .push_back(payload);
        self.wake.notify_waiters();
    }
}

/// A queue whose ack wait is the worker's default lease, as [`MemoryQueue::new`] asks.
impl Default for MemoryQueue {
    fn default() -> Self {
        MemoryQueue::new(crate::worker::DEFAULT_LEASE)
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn publish(&self, batch: &[Publish]) -> QueueResult<()> {
        let now = Instant::now();
        {
            let mut s = self.state.lock().expect("queue lock");
            for p in batch {
                s.schedule(p.notification.encode(), p.delay, now);
            }
        }
        self.wake.notify_waiters();
        Ok(())
    }

    async fn receive(&self, max: usize) -> QueueResult<Vec<Delivery>> {
        let max = max.max(1);
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let now = Instant::now();
                let mut s = self.state.lock().expect("queue lock");
                if s.closed {
                    return Ok(Vec::new());
                }
                let next = s.promote(now);
                if !s.ready.is_empty() {
                    let take = s.ready.len().min(max);
                    let deadline = now + self.ack_wait;
                    let mut out = Vec::with_capacity(take);
                    for _ in 0..take {
                        let payload = s.ready.pop_front().expect("counted");
                        let n = s.next_seq();
                        s.in_flight.insert(n, (payload.clone(), deadline));
                        s.deadlines.insert((deadline, n), ());
                        out.push(Delivery {
                            payload,
                            tag: DeliveryTag(n.to_string()),
                        });
                    }
                    return Ok(out);
                }
                next
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    async fn ack(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        let mut s = self.state.lock().expect("queue lock");
        for tag in tags {
            s.answer(tag);
        }
        Ok(())
    }

    async fn nack(&self, batch: &[(DeliveryTag, Duration)]) -> QueueResult<()> {
        let now = Instant::now();
        {
            let mut s = self.state.lock().expect("queue lock");
            for (tag, delay) in batch {
                if let Some(payload) = s.answer(tag) {
                    s.schedule(payload, *delay, now);
                }
            }
        }
        self.wake.notify_waiters();
        Ok(())
    }

    async fn extend(&self, tags: &[DeliveryTag]) -> QueueResult<()> {
        let deadline = Instant::now() + self.ack_wait;
        let mut s = self.state.lock().expect("queue lock");
        for tag in tags {
            let Ok(n) = tag.0.parse::<u64>() else {
                continue;
            };
            let Some(entry) = s.in_flight.get_mut(&n) else {
                continue;
            };
            let old = std::mem::replace(&mut entry.1, deadline);
            s.deadlines.remove(&(old, n));
            s.deadlines.insert((deadline, n), ());
        }
        Ok(())
    }

    fn max_delay(&self) -> Option<Duration> {
        None
    }

    fn message_limits(&self) -> MessageLimits {
        self.limits
    }

    fn retention(&self) -> Retention {
        Retention::Process { since: self.since }
    }

    async fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventId, Notification};

    fn note() -> Publish {
        Publish {
            notification: Notification::one("t", EventId::new()),
            delay: Duration::ZERO,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_messages_wait_and_nacks_come_back() {
        let q = MemoryQueue::new(Duration::from_secs(30));
        let mut p = note();
        p.delay = Duration::from_secs(5);
        q.publish(&[p.clone()]).await.unwrap();
        let start = Instant::now();
        let got = q.receive(10).await.unwrap();
        assert_eq!(got.len(), 1);
        assert!(start.elapsed() >= Duration::from_secs(5));
        q.nack(&[(got[0].tag.clone(), Duration::from_secs(2))])
            .await
            .unwrap();
        let again = q.receive(10).await.unwrap();
        assert_eq!(
            Notification::decode(&again[0].payload).unwrap(),
            p.notification
        );
        assert!(start.elapsed() >= Duration::from_secs(7));
        q.ack(&[again[0].tag.clone()]).await.unwrap();
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_deliveries_come_back_after_the_deadline_unless_extended() {
        let q = MemoryQueue::new(Duration::from_secs(10));
        q.publish(&[note()]).await.unwrap();
        let first = q.receive(1).await.unwrap();
        tokio::time::sleep(Duration::from_secs(8)).await;
        q.extend(&[first[0].tag.clone()]).await.unwrap();
        // Past the first deadline but within the extended one: nothing.
        let early = tokio::time::timeout(Duration::from_secs(9), q.receive(1)).await;
        assert!(early.is_err());
        let again = q.receive(1).await.unwrap();
        assert_eq!(again[0].payload, first[0].payload);
        // The old delivery's ack no longer counts.
        q.ack(&[first[0].tag.clone()]).await.unwrap();
        assert_eq!(q.len(), 1);
    }

    #[tokio::test]
    async fn close_wakes_receivers() {
        let q = std::sync::Arc::new(MemoryQueue::default());
        let r = tokio::spawn({
            let q = q.clone();
            async move { q.receive(1).await.unwrap() }
        });
        tokio::task::yield_now().await;
        q.close().await;
        assert!(r.await.unwrap().is_empty());
    }
}
