//! Receiving notifications and deciding, in batches, which ones run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::message::{Answers, Message};
use super::settle::Ended;
use super::telemetry::RunEvent;
use super::{run, WorkerState};
use crate::backend::{LeaseRef, Settle};
use crate::decision::{self, Answer, Plan, Tally};
use crate::escape::escaped;
use crate::model::{EventId, LeaseToken, Notification};
use crate::queue::{Delivery, DeliveryTag};

/// Takes batches of notifications while claims are free, until told to stop.
///
/// A claim is one event held: a message of several events takes as many.
/// How many messages to ask for is estimated from the events per message
/// seen so far; messages beyond the free claims are given straight back
/// (the first one is always kept, so one message may overshoot by its size).
pub(super) async fn receive_loop(shared: Arc<WorkerState>, ended: mpsc::UnboundedSender<Ended>) {
    let mut pause = Duration::from_millis(50);
    let mut events_per_message = 1.0_f64;
    loop {
        let mut claims = tokio::select! {
            p = free_claims(&shared) => p,
            _ = shared.stop_receiving.cancelled() => return,
        };
        let held = claims.num_permits();
        let free = held + shared.claims.available_permits();
        let room = ((free as f64 / events_per_message) as usize).clamp(1, shared.config.batch);
        let received = tokio::select! {
            r = shared.queue.receive(room) => r,
            _ = shared.stop_receiving.cancelled() => return,
        };
        let deliveries = match received {
            Ok(d) if d.is_empty() => {
                tracing::info!(worker = %shared.config.name, "the queue is closed: no more notifications");
                return;
            }
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %escaped(&e), retry_in = ?pause, "cannot receive from the queue");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shared.stop_receiving.cancelled() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(50);
        let (batch, extra) = Batch::read(deliveries, room, free);
        shared.record(RunEvent::Received(batch.messages + batch.garbage.len()));
        if !extra.is_empty() {
            // More than asked for, or more events than the free claims
            // hold: give the rest straight back, to be received again.
            tracing::debug!(
                extra = extra.len(),
                "received more than the free claims hold"
            );
            if let Err(e) = shared.queue.nack(&extra).await {
                tracing::warn!(error = %escaped(&e), "nack failed; the queue will redeliver after its deadline");
            }
        }
        if batch.messages > 0 {
            let seen = batch.notes.len() as f64 / batch.messages as f64;
            events_per_message = (events_per_message + seen) / 2.0;
        }
        let n = batch.notes.len().min(free);
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
        shared
            .tasks
            .spawn(admit_batch(shared.clone(), batch, claims, ended.clone()));
    }
}

/// One batch of received messages, read.
struct Batch {
    /// How many messages are notifications.
    messages: usize,
    /// Each event of each of those messages, with its message.
    notes: Vec<(EventId, Arc<Message>)>,
    /// Messages that are not notifications.
    garbage: Vec<DeliveryTag>,
}

impl Batch {
    /// Reads `deliveries`: keeps messages while their events fit in `free`
    /// claims (at least the first) and at most `room` messages; returns the
    /// rest's tags to be given back.
    fn read(
        deliveries: Vec<Delivery>,
        room: usize,
        free: usize,
    ) -> (Batch, Vec<(DeliveryTag, Duration)>) {
        let mut batch = Batch {
            messages: 0,
            notes: Vec::new(),
            garbage: Vec::new(),
        };
        let mut extra = Vec::new();
        for (i, d) in deliveries.into_iter().enumerate() {
            match Notification::decode(&d.payload) {
                Err(e) => {
                    // Anyone who can publish to the queue writes this: escaped,
                    // or a newline in it forges a log record.
                    let preview = String::from_utf8_lossy(&d.payload[..d.payload.len().min(120)]);
                    tracing::warn!(error = %escaped(&e), body = %escaped(&preview), "dropping a message that is not a notification");
                    batch.garbage.push(d.tag);
                }
                Ok(n)
                    if i >= room
                        || (!batch.notes.is_empty()
                            && batch.notes.len() + n.event_ids.len() > free) =>
                {
                    extra.push((d.tag, Duration::ZERO));
                }
                Ok(n) => {
                    let message = Message::new(d.tag, &n);
                    batch
                        .notes
                        .extend(n.event_ids.iter().map(|id| (*id, message.clone())));
                    batch.messages += 1;
                }
            }
        }
        (batch, extra)
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

/// The tenants a batch's notifications named, each once: the claim's hint
/// (a store may check the rules once per claim for them).
fn tenants_named(notes: &[(EventId, Arc<Message>)]) -> Vec<String> {
    let mut tenants: Vec<&str> = notes.iter().map(|(_, m)| m.tenant()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    tenants.into_iter().map(str::to_owned).collect()
}

/// Claims a batch in one store call; runs what was claimed; asks the store
/// why the rest was not, and answers each notification per [`decision::admit`].
/// `claims` holds one claim per event (fewer when one message alone has
/// more events than the worker had free claims).
async fn admit_batch(
    shared: Arc<WorkerState>,
    batch: Batch,
    mut claims: OwnedSemaphorePermit,
    ended: mpsc::UnboundedSender<Ended>,
) {
    let Batch { notes, garbage, .. } = batch;
    if !garbage.is_empty() {
        shared.record(RunEvent::Garbage(garbage.len()));
        if let Err(e) = shared.queue.terminate(&garbage).await {
            tracing::warn!(error = %escaped(&e), "cannot remove garbage from the queue");
        }
    }
    if notes.is_empty() {
        return;
    }
    let policy = shared.config.policy;
    // A token per event: a token names one run (HERALD_LEASE_TOKEN).
    let leases: Vec<LeaseRef> = notes
        .iter()
        .map(|(id, _)| LeaseRef {
            id: *id,
            token: LeaseToken::new(),
        })
        .collect();
    let tenants = tenants_named(&notes);
    // The store's expiry is at least this plus the lease: the statement
    // runs after it is sent.
    let sent = std::time::Instant::now();
    let claimed = match shared
        .events
        .claim(
            &leases,
            &shared.handler_names,
            &tenants,
            shared.config.lease,
        )
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %escaped(&e), events = leases.len(), "claim failed; notifications go back to the queue");
            shared.record(RunEvent::StoreFailed);
            return requeue_all(&shared, notes, decision::store_failed(&policy)).await;
        }
    };
    shared.record(RunEvent::Claimed(claimed.len()));
    let mut claimed: HashMap<EventId, _> = claimed.into_iter().map(|e| (e.id, e)).collect();
    let mut rest = Vec::new();
    for (id, message) in notes {
        match claimed.remove(&id) {
            // Each with the token its lease was taken with.
            Some(event) => {
                let Some(token) = event.lease.as_ref().map(|l| l.token) else {
                    // A store returns claimed events with their lease.
                    rest.push((id, message));
                    continue;
                };
                // None past the claims taken: a message larger than the
                // free claims overshoots by its size.
                let claim = claims.split(1);
                let deadline = super::heartbeat::deadline(sent, shared.config.lease);
                run::start(
                    &shared,
                    event,
                    token,
                    message,
                    claim,
                    ended.clone(),
                    deadline,
                );
            }
            None => rest.push((id, message)),
        }
    }
    if rest.is_empty() {
        return;
    }
    drop(claims);
    let ids: Vec<EventId> = rest.iter().map(|(id, _)| *id).collect();
    let seen = match shared.events.inspect(&ids).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %escaped(&e), "inspect failed; notifications go back to the queue");
            shared.record(RunEvent::StoreFailed);
            return requeue_all(&shared, rest, decision::store_failed(&policy)).await;
        }
    };
    let found: HashMap<EventId, _> = seen.found.iter().map(|i| (i.event.id, i)).collect();
    let mut answers = Answers::default();
    let mut writes = Vec::new();
    for (id, message) in rest {
        let item = found.get(&id);
        let inspection = decision::Inspection {
            event: item.map(|i| &i.event),
            rules: item.map(|i| i.rules).unwrap_or_default(),
            waiting: item.and_then(|i| i.waiting.as_ref()),
            handler_known: item.is_none_or(|i| shared.handlers.contains_key(&i.event.handler)),
            now: seen.now,
        };
        let admission = decision::admit(inspection, &policy, WorkerState::jitter());
        tracing::debug!(event = %id, ?admission, "not claimed");
        let handler = item.map(|i| i.event.handler.as_str()).unwrap_or_default();
        match admission.plan {
            Plan::Answer(answer) => answers.add(&shared, &message, id, answer, None),
            Plan::Write(write) => writes.push((write, id, message, shared.instruments(handler))),
        }
    }
    if !writes.is_empty() {
        let settles: Vec<Settle> = writes.iter().map(|(w, ..)| w.settle.clone()).collect();
        let held = shared.events.settle(&settles).await;
        match &held {
            Err(e) => {
                tracing::warn!(error = %escaped(&e), "cannot move exhausted events to dead");
                shared.record(RunEvent::StoreFailed);
            }
            Ok(s) if !s.woken.is_empty() => super::settle::wake(&shared, s.woken.clone()).await,
            Ok(_) => {}
        }
        for (i, (write, id, message, instruments)) in writes.into_iter().enumerate() {
            let answer = write.answer(&held, i);
            if answer.tally == Tally::Buried {
                tracing::warn!(event = %write.settle.id, "no attempts left after its worker died: moved to dead");
            }
            answers.add(&shared, &message, id, answer, Some(&instruments));
        }
    }
    answers.send(&shared).await;
}

async fn requeue_all(shared: &WorkerState, notes: Vec<(EventId, Arc<Message>)>, answer: Answer) {
    let mut answers = Answers::default();
    for (id, message) in notes {
        answers.add(shared, &message, id, answer, None);
    }
    answers.send(shared).await;
}
