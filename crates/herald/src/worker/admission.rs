//! Receiving notifications and deciding, in batches, which ones run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::settle::Ended;
use super::{run, Shared, WorkerStats};
use crate::decision::{self, Admission};
use crate::model::{EventId, LeaseToken, Notification};
use crate::queue::{Delivery, DeliveryTag};
use crate::store::{Finish, Settle};

/// Takes batches of notifications while slots are free, until told to stop.
pub(super) async fn receive_loop(shared: Arc<Shared>, ended: mpsc::UnboundedSender<Ended>) {
    let mut pause = Duration::from_millis(50);
    loop {
        let mut slots = tokio::select! {
            p = free_slots(&shared) => p,
            _ = shared.stop_receiving.cancelled() => return,
        };
        let held = slots.num_permits();
        let room = (held + shared.slots.available_permits()).min(shared.config.batch);
        let received = tokio::select! {
            r = shared.queue.receive(room) => r,
            _ = shared.stop_receiving.cancelled() => return,
        };
        let mut deliveries = match received {
            Ok(d) if d.is_empty() => {
                tracing::info!(worker = %shared.config.name, "the queue is closed: no more notifications");
                return;
            }
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?pause, "cannot receive from the queue");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shared.stop_receiving.cancelled() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(50);
        if deliveries.len() > room {
            // A queue that returned more than asked: give the rest straight back.
            let extra: Vec<_> = deliveries
                .split_off(room)
                .into_iter()
                .map(|d| (d.tag, Duration::ZERO))
                .collect();
            tracing::warn!(
                extra = extra.len(),
                "the queue returned more than asked for"
            );
            if let Err(e) = shared.queue.nack(&extra).await {
                tracing::warn!(error = %e, "nack failed; the queue will redeliver after its deadline");
            }
        }
        let n = deliveries.len();
        if n > held {
            // Only this loop takes slots, so the ones counted above are still free.
            let more = shared
                .slots
                .clone()
                .try_acquire_many_owned((n - held) as u32)
                .expect("free slots were counted by this loop");
            slots.merge(more);
        } else if n < held {
            drop(slots.split(held - n));
        }
        shared.tasks.spawn(admit_batch(
            shared.clone(),
            deliveries,
            slots,
            ended.clone(),
        ));
    }
}

/// How long to wait for slots to free up into a worthwhile batch.
const LINGER: Duration = Duration::from_millis(1);

/// Waits for a free slot. When slots are scarce (the worker is busy), waits
/// up to [`LINGER`] for a quarter of a batch to free up, so that a busy
/// worker claims in batches rather than one event per store call as each
/// run ends. An idle worker has slots to spare and never lingers.
async fn free_slots(shared: &Shared) -> OwnedSemaphorePermit {
    let want = (shared.config.batch.min(shared.config.concurrency) / 4).max(1) as u32;
    let slots = shared.slots.clone();
    if let Ok(p) = slots.clone().try_acquire_many_owned(want) {
        return p;
    }
    if let Ok(p) = tokio::time::timeout(LINGER, slots.clone().acquire_many_owned(want)).await {
        return p.expect("the slot semaphore is never closed");
    }
    slots
        .acquire_owned()
        .await
        .expect("the slot semaphore is never closed")
}

/// Claims a batch in one store call; runs what was claimed; asks the store
/// why the rest was not, and answers each notification per [`decision::admit`].
async fn admit_batch(
    shared: Arc<Shared>,
    deliveries: Vec<Delivery>,
    mut slots: OwnedSemaphorePermit,
    ended: mpsc::UnboundedSender<Ended>,
) {
    WorkerStats::add(&shared.stats.received, deliveries.len());
    let mut notes: Vec<(EventId, DeliveryTag)> = Vec::with_capacity(deliveries.len());
    let mut garbage = Vec::new();
    for d in deliveries {
        match Notification::decode(&d.payload) {
            Ok(n) => notes.push((n.event_id, d.tag)),
            Err(e) => {
                let preview =
                    String::from_utf8_lossy(&d.payload[..d.payload.len().min(120)]).into_owned();
                tracing::warn!(error = %e, message = %preview, "dropping a message that is not a notification");
                garbage.push(d.tag);
            }
        }
    }
    if !garbage.is_empty() {
        WorkerStats::add(&shared.stats.garbage, garbage.len());
        if let Err(e) = shared.queue.terminate(&garbage).await {
            tracing::warn!(error = %e, "cannot remove garbage from the queue");
        }
    }
    if notes.is_empty() {
        return;
    }
    let policy = shared.config.policy;
    let ids: Vec<EventId> = notes.iter().map(|(id, _)| *id).collect();
    let token = LeaseToken::new();
    let claimed = match shared
        .store
        .claim(&ids, &shared.handler_names, token, shared.config.lease)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, events = ids.len(), "claim failed; notifications go back to the queue");
            WorkerStats::add(&shared.stats.store_errors, 1);
            return requeue_all(&shared, notes, decision::store_failed(&policy)).await;
        }
    };
    let mut claimed: HashMap<EventId, _> = claimed.into_iter().map(|e| (e.id, e)).collect();
    let mut rest = Vec::new();
    for (id, tag) in notes {
        match claimed.remove(&id) {
            Some(event) => {
                let slot = slots.split(1).expect("one slot per delivery");
                run::start(&shared, event, token, tag, slot, ended.clone());
            }
            None => rest.push((id, tag)),
        }
    }
    if rest.is_empty() {
        return;
    }
    let ids: Vec<EventId> = rest.iter().map(|(id, _)| *id).collect();
    let seen = match shared.store.inspect(&ids).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "inspect failed; notifications go back to the queue");
            WorkerStats::add(&shared.stats.store_errors, 1);
            return requeue_all(&shared, rest, decision::store_failed(&policy)).await;
        }
    };
    let found: HashMap<EventId, _> = seen.found.iter().map(|i| (i.event.id, i)).collect();
    let mut answers = Answers::default();
    let mut burials = Vec::new();
    for (id, tag) in rest {
        let item = found.get(&id);
        let inspection = decision::Inspection {
            event: item.map(|i| &i.event),
            rules: item.map(|i| i.rules).unwrap_or_default(),
            handler_known: item.is_none_or(|i| shared.handlers.contains_key(&i.event.handler)),
            now: seen.now,
        };
        let admission = match decision::admit(inspection, &policy, Shared::jitter()) {
            // The one-statement claim already failed, so someone changed the
            // event in between: another worker won it.
            Admission::Claim => decision::claim_lost(&policy),
            other => other,
        };
        tracing::debug!(event = %id, ?admission, "not claimed");
        match admission {
            Admission::Bury { error } => {
                let lease = item.and_then(|i| i.event.lease).map(|l| l.token);
                let handler = item.map(|i| i.event.handler.as_str()).unwrap_or_default();
                burials.push((
                    Settle {
                        id,
                        token: lease,
                        finish: Finish::Bury { error },
                    },
                    tag,
                    shared.instruments(handler),
                ));
            }
            other => answers.add(&shared.stats, tag, &other),
        }
    }
    if !burials.is_empty() {
        let writes: Vec<Settle> = burials.iter().map(|(s, _, _)| s.clone()).collect();
        match shared.store.settle(&writes).await {
            Ok(done) => {
                for ((s, tag, instruments), ok) in burials.into_iter().zip(done) {
                    if ok {
                        // Its last attempt failed (its worker died): count it as a failure and a death.
                        instruments.failed.increment(1);
                        instruments.dead.increment(1);
                        if let Some(observer) = &shared.observer {
                            observer.settled(&instruments.name, super::RunSettled::Dead);
                        }
                        tracing::warn!(event = %s.id, "no attempts left after its worker died: moved to dead");
                        WorkerStats::add(&shared.stats.buried, 1);
                        answers.add(
                            &shared.stats,
                            tag,
                            &Admission::Drop(decision::DropReason::Finished),
                        );
                    } else {
                        answers.add(&shared.stats, tag, &decision::claim_lost(&policy));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot move exhausted events to dead");
                WorkerStats::add(&shared.stats.store_errors, 1);
                for (_, tag, _) in burials {
                    answers.add(&shared.stats, tag, &decision::store_failed(&policy));
                }
            }
        }
    }
    answers.send(&shared).await;
}

async fn requeue_all(shared: &Shared, notes: Vec<(EventId, DeliveryTag)>, admission: Admission) {
    let mut answers = Answers::default();
    for (_, tag) in notes {
        answers.add(&shared.stats, tag, &admission);
    }
    answers.send(shared).await;
}

/// Acks and nacks collected for one batch, sent as one call each.
#[derive(Default)]
pub(super) struct Answers {
    acks: Vec<DeliveryTag>,
    nacks: Vec<(DeliveryTag, Duration)>,
}

impl Answers {
    fn add(&mut self, stats: &WorkerStats, tag: DeliveryTag, admission: &Admission) {
        match admission.reply() {
            decision::Reply::Ack => {
                WorkerStats::add(&stats.dropped, 1);
                self.acks.push(tag);
            }
            decision::Reply::Nack(delay) => {
                WorkerStats::add(&stats.requeued, 1);
                self.nacks.push((tag, delay));
            }
            decision::Reply::Leave => {}
        }
    }

    pub(super) fn reply(&mut self, tag: DeliveryTag, reply: decision::Reply) {
        match reply {
            decision::Reply::Ack => self.acks.push(tag),
            decision::Reply::Nack(delay) => self.nacks.push((tag, delay)),
            decision::Reply::Leave => {}
        }
    }

    pub(super) async fn send(self, shared: &Shared) {
        if !self.acks.is_empty() {
            if let Err(e) = shared.queue.ack(&self.acks).await {
                tracing::warn!(error = %e, count = self.acks.len(), "ack failed; the queue will redeliver");
            }
        }
        if !self.nacks.is_empty() {
            if let Err(e) = shared.queue.nack(&self.nacks).await {
                tracing::warn!(error = %e, count = self.nacks.len(), "nack failed; the queue will redeliver after its deadline");
            }
        }
    }
}
