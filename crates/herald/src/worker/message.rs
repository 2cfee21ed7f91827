//! A received message and its answer: each of its events gets a reply, and
//! once all have one, the message gets the one answer [`decision::close`]
//! folds them into. Answers are sent to the queue in batches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::telemetry::{Instruments, RunEvent};
use super::WorkerState;
use crate::backend::Scheduled;
use crate::decision::{self, Answer, Close, Reply};
use crate::escape::escaped;
use crate::model::{EventId, Notification};
use crate::queue::{DeliveryTag, Publish};

/// One delivery of a notification, shared by the runs of its events.
#[derive(Debug)]
pub(crate) struct Message {
    /// How to answer the queue for it.
    pub(super) tag: DeliveryTag,
    /// The events' tenant, for the notifications of requeued events.
    tenant: String,
    /// How many events the message names.
    events: usize,
    /// The replies of its events so far.
    replies: Mutex<Vec<(EventId, Reply)>>,
}

impl Message {
    /// A delivery of `notification`, awaiting a reply for each of its events.
    pub(super) fn new(tag: DeliveryTag, notification: &Notification) -> Arc<Self> {
        Arc::new(Message {
            tag,
            tenant: notification.tenant.clone(),
            events: notification.event_ids.len(),
            replies: Mutex::new(Vec::with_capacity(notification.event_ids.len())),
        })
    }

    /// The tenant the notification named: a hint for the claim, which
    /// still checks an event of another tenant on its own.
    pub(super) fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Records `id`'s reply; returns the message's answer when it was the
    /// last one owed.
    fn reply(&self, id: EventId, reply: Reply) -> Option<Close> {
        let mut replies = self.replies.lock().expect("replies lock");
        replies.push((id, reply));
        (replies.len() == self.events).then(|| decision::close(&replies))
    }
}

/// Answers collected for one batch, sent as one call of each kind.
#[derive(Default)]
pub(super) struct Answers {
    acks: Vec<DeliveryTag>,
    nacks: Vec<(DeliveryTag, Duration)>,
    /// Events requeued out of messages of several events…
    requeue: Vec<Scheduled>,
    /// …and those messages, acked once the requeue is published.
    acks_after_requeue: Vec<DeliveryTag>,
}

impl Answers {
    /// Counts `answer` for event `id` of `message`, and queues the
    /// message's own answer when this was its last event. `instruments`
    /// are the handler's metric handles, for tallies that count in the
    /// metrics.
    pub(super) fn add(
        &mut self,
        shared: &WorkerState,
        message: &Message,
        id: EventId,
        answer: Answer,
        instruments: Option<&Instruments>,
    ) {
        shared.record(RunEvent::Answered {
            tally: answer.tally,
            handler: instruments,
        });
        match message.reply(id, answer.reply) {
            None | Some(Close::Reply(Reply::Leave)) => {}
            Some(Close::Reply(Reply::Ack)) => self.acks.push(message.tag.clone()),
            Some(Close::Reply(Reply::Nack(delay))) => {
                self.nacks.push((message.tag.clone(), delay));
            }
            Some(Close::RequeueThenAck(events)) => {
                // The delays are the replies', already within the queue's longest.
                self.requeue
                    .extend(events.into_iter().map(|(event_id, delay)| Scheduled {
                        tenant: message.tenant.clone(),
                        event_id,
                        delay,
                    }));
                self.acks_after_requeue.push(message.tag.clone());
            }
        }
    }

    /// Sends what was collected: the requeued events' notifications first,
    /// then the acks (of their messages too, once they are published) and
    /// the nacks.
    pub(super) async fn send(mut self, shared: &WorkerState) {
        if !self.requeue.is_empty() {
            let events = self.requeue.len();
            let requeue = Publish::group(self.requeue, shared.queue.message_limits());
            match shared.queue.publish(&requeue).await {
                Ok(()) => self.acks.append(&mut self.acks_after_requeue),
                Err(e) => tracing::warn!(
                    error = %escaped(&e), events, messages = self.acks_after_requeue.len(),
                    "cannot publish the notifications of requeued events; their messages are left for the queue to redeliver"
                ),
            }
        }
        if !self.acks.is_empty() {
            if let Err(e) = shared.queue.ack(&self.acks).await {
                tracing::warn!(error = %escaped(&e), count = self.acks.len(), "ack failed; the queue will redeliver");
            }
        }
        if !self.nacks.is_empty() {
            if let Err(e) = shared.queue.nack(&self.nacks).await {
                tracing::warn!(error = %escaped(&e), count = self.nacks.len(), "nack failed; the queue will redeliver after its deadline");
            }
        }
    }
}
