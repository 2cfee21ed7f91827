//! Receiving notifications and deciding, in batches, which ones run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::settle::Ended;
use super::telemetry::{Instruments, RunEvent};
use super::{run, WorkerState};
use crate::decision::{self, Answer, Plan, Reply, Tally, Write};
use crate::model::{EventId, LeaseToken, Notification};
use crate::queue::{Delivery, DeliveryTag};
use crate::store::{Settle, StoreResult};

/// Takes batches of notifications while claims are free, until told to stop.
pub(super) async fn receive_loop(shared: Arc<WorkerState>, ended: mpsc::UnboundedSender<Ended>) {
    let mut pause = Duration::from_millis(50);
    loop {
        let mut claims = tokio::select! {
            p = free_claims(&shared) => p,
            _ = shared.stop_receiving.cancelled() => return,
        };
        let held = claims.num_permits();
        let room = (held + shared.claims.available_permits()).min(shared.config.batch);
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
            // Only this loop takes claims, so the ones counted above are still free.
            let more = shared
                .claims
                .clone()
                .try_acquire_many_owned((n - held) as u32)
                .expect("free claims were counted by this loop");
            claims.merge(more);
        } else if n < held {
            drop(claims.split(held - n));
        }
        shared.tasks.spawn(admit_batch(
            shared.clone(),
            deliveries,
            claims,
            ended.clone(),
        ));
    }
}

/// How long to wait for claims to free up into a worthwhile batch.
const LINGER: Duration = Duration::from_millis(1);

/// Waits for a free claim. When claims are scarce (the worker is busy),
/// waits up to [`LINGER`] for a quarter of a batch to free up, so that a
/// busy worker claims in batches rather than one event per store call as
/// each run ends. An idle worker has claims to spare and never lingers.
async fn free_claims(shared: &WorkerState) -> OwnedSemaphorePermit {
    let want = (shared.config.batch.min(shared.config.concurrency) / 4).max(1) as u32;
    let claims = shared.claims.clone();
    if let Ok(p) = claims.clone().try_acquire_many_owned(want) {
        return p;
    }
    if let Ok(p) = tokio::time::timeout(LINGER, claims.clone().acquire_many_owned(want)).await {
        return p.expect("the claim semaphore is never closed");
    }
    claims
        .acquire_owned()
        .await
        .expect("the claim semaphore is never closed")
}

/// Claims a batch in one store call; runs what was claimed; asks the store
/// why the rest was not, and answers each notification per [`decision::admit`].
async fn admit_batch(
    shared: Arc<WorkerState>,
    deliveries: Vec<Delivery>,
    mut claims: OwnedSemaphorePermit,
    ended: mpsc::UnboundedSender<Ended>,
) {
    shared.record(RunEvent::Received(deliveries.len()));
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
        shared.record(RunEvent::Garbage(garbage.len()));
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
            shared.record(RunEvent::StoreFailed);
            return requeue_all(&shared, notes, decision::store_failed(&policy)).await;
        }
    };
    shared.record(RunEvent::Claimed(claimed.len()));
    let mut claimed: HashMap<EventId, _> = claimed.into_iter().map(|e| (e.id, e)).collect();
    let mut rest = Vec::new();
    for (id, tag) in notes {
        match claimed.remove(&id) {
            Some(event) => {
                let claim = claims.split(1).expect("one claim per delivery");
                run::start(&shared, event, token, tag, claim, ended.clone());
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
            shared.record(RunEvent::StoreFailed);
            return requeue_all(&shared, rest, decision::store_failed(&policy)).await;
        }
    };
    let found: HashMap<EventId, _> = seen.found.iter().map(|i| (i.event.id, i)).collect();
    let mut answers = Answers::default();
    let mut writes = Vec::new();
    for (id, tag) in rest {
        let item = found.get(&id);
        let inspection = decision::Inspection {
            event: item.map(|i| &i.event),
            rules: item.map(|i| i.rules).unwrap_or_default(),
            handler_known: item.is_none_or(|i| shared.handlers.contains_key(&i.event.handler)),
            now: seen.now,
        };
        let admission = decision::admit(inspection, &policy, WorkerState::jitter());
        tracing::debug!(event = %id, ?admission, "not claimed");
        let handler = item.map(|i| i.event.handler.as_str()).unwrap_or_default();
        match admission.plan {
            Plan::Answer(answer) => answers.add(&shared, tag, answer, None),
            Plan::Write(write) => writes.push((write, tag, shared.instruments(handler))),
        }
    }
    if !writes.is_empty() {
        let settles: Vec<Settle> = writes.iter().map(|(w, _, _)| w.settle.clone()).collect();
        let held = shared.store.settle(&settles).await;
        if let Err(e) = &held {
            tracing::warn!(error = %e, "cannot move exhausted events to dead");
            shared.record(RunEvent::StoreFailed);
        }
        for (i, (write, tag, instruments)) in writes.into_iter().enumerate() {
            let answer = written(&write, &held, i);
            if answer.tally == Tally::Buried {
                tracing::warn!(event = %write.settle.id, "no attempts left after its worker died: moved to dead");
            }
            answers.add(&shared, tag, answer, Some(&instruments));
        }
    }
    answers.send(&shared).await;
}

async fn requeue_all(shared: &WorkerState, notes: Vec<(EventId, DeliveryTag)>, answer: Answer) {
    let mut answers = Answers::default();
    for (_, tag) in notes {
        answers.add(shared, tag, answer, None);
    }
    answers.send(shared).await;
}

/// The answer of the `i`th of a batch of writes, as the store's `held`
/// (one flag per write) says it turned out.
pub(super) fn written(write: &Write, held: &StoreResult<Vec<bool>>, i: usize) -> Answer {
    match held {
        Ok(held) if held.get(i) == Some(&true) => write.held,
        Ok(_) => write.refused,
        Err(_) => write.failed,
    }
}

/// Acks and nacks collected for one batch, sent as one call each.
#[derive(Default)]
pub(super) struct Answers {
    acks: Vec<DeliveryTag>,
    nacks: Vec<(DeliveryTag, Duration)>,
}

impl Answers {
    /// Queues `answer`'s reply and counts it; `instruments` are the
    /// handler's metric handles, for tallies that count in the metrics.
    pub(super) fn add(
        &mut self,
        shared: &WorkerState,
        tag: DeliveryTag,
        answer: Answer,
        instruments: Option<&Instruments>,
    ) {
        shared.record(RunEvent::Answered {
            tally: answer.tally,
            handler: instruments,
        });
        match answer.reply {
            Reply::Ack => self.acks.push(tag),
            Reply::Nack(delay) => self.nacks.push((tag, delay)),
            Reply::Leave => {}
        }
    }

    pub(super) async fn send(self, shared: &WorkerState) {
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
