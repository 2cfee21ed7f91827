//! Receiving: the outstanding budget, the streaming or unary pull, the
//! deliveries held back until due, and the hand-back of lapsed ones.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{FutureExt, StreamExt};
use gcloud_gax::grpc::Code;
use gcloud_pubsub::subscriber::ReceivedMessage;
use herald::escape::escaped;
use herald::queue::{Delivery, DeliveryTag};

use crate::settings::{hold_back_seconds, time_left};
use crate::{unix_ms, Inner, PullMode, DELAY, REOPEN_PAUSE};

impl Inner {
    /// Forgets these deliveries: they are answered.
    pub(crate) fn release(&self, ack_ids: impl IntoIterator<Item = impl AsRef<str>>) {
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
    pub(crate) fn budget(&self) -> usize {
        let held = self.held.lock().expect("held lock").len();
        self.config.max_outstanding.saturating_sub(held)
    }

    /// Waits until this process holds fewer than `max_outstanding` deliveries.
    pub(crate) async fn wait_for_room(&self) -> usize {
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
    pub(crate) async fn sort(&self, messages: Vec<ReceivedMessage>) -> Vec<Delivery> {
        let now = unix_ms(SystemTime::now());
        let expires = Instant::now() + self.config.ack_wait;
        let mut due = Vec::with_capacity(messages.len());
        let mut later: HashMap<i32, Vec<String>> = HashMap::new();
        {
            let mut held = self.held.lock().expect("held lock");
            for m in messages {
                let delay = m.message.attributes.get(DELAY).map(String::as_str);
                let published = m.message.publish_time.as_ref().map(|t| {
                    let ms = i128::from(t.seconds) * 1000 + i128::from(t.nanos / 1_000_000);
                    ms.clamp(0, i128::from(u64::MAX)) as u64
                });
                if let Some(left) = time_left(delay, published, now) {
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
                tracing::warn!(error = %escaped(&e), "cannot hold back a message that is not due");
            }
        }
        due
    }

    pub(crate) async fn receive(&self, max: usize) -> Vec<Delivery> {
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
                        tracing::warn!(subscription = %self.config.subscription_name(), error = %escaped(&e), "cannot open the streaming pull");
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
                    tracing::warn!(error = %escaped(&e), "cannot check the subscription");
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
    pub(crate) async fn pull_unary(&self, max: usize) -> Vec<Delivery> {
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
                        tracing::warn!(error = %escaped(&e), "cannot check the subscription");
                    }
                    tokio::time::sleep(REOPEN_PAUSE).await;
                }
                Err(e) => {
                    tracing::warn!(subscription = %self.config.subscription_name(), error = %escaped(&e), "pull failed");
                    tokio::time::sleep(REOPEN_PAUSE).await;
                }
            }
        }
    }

    /// Hands back the deliveries whose ack wait has passed.
    pub(crate) async fn expire(&self) {
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
            tracing::warn!(error = %escaped(&e), "cannot hand back deliveries past their ack wait");
        }
    }
}

/// Every quarter of the ack wait (50 ms to 1 s), hands back what lapsed.
pub(crate) async fn expiry_loop(inner: Arc<Inner>) {
    let every =
        (inner.config.ack_wait / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        inner.expire().await;
    }
}
