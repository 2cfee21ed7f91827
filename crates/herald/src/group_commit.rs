//! Group commit: emits that arrive while earlier ones are being written
//! wait for a free write and are stored together, in one store call, and
//! notified together, in one publish.
//!
//! One request per single emit costs a statement and a commit each; under
//! load, most of an emit's time is spent queued behind other commits. Here
//! at most `writes` store calls run at once: an emit that finds one free is
//! written at once, alone (no added latency when the load is light), and
//! the emits that arrive while all are busy form the next group. The
//! group's notifications go to the publisher as one as soon as its write
//! has committed (they wait for another publish only when several are in
//! flight, by the publisher's rule): the write already grouped them, so a
//! commit costs one publish, however many emits it held.
//!
//! An emit waits for its write at most until its deadline (the client's
//! emit timeout): a store that does not answer (a database that crashed, a
//! connection black-holed) yields [`StoreError::Unavailable`] in bounded
//! time. A write already under way goes on, so the events may be stored
//! after all; emits whose callers stopped waiting before their write began
//! are not written.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::backend::{EventStore, StoreError, StoreResult};
use crate::escape::escaped;
use crate::model::{Emitted, NewEvent};
use crate::publisher::{created, Publisher};

/// How many grouped store writes may run at once by default: see
/// [`crate::Client::group_commit`].
/// Two, not four: on 2 cores four writes at once cost PostgreSQL more CPU
/// per event and added latency (ADR 0014).
pub const DEFAULT_GROUP_COMMIT_WRITES: usize = 2;

/// The most events one group holds; an emit of this many or more is
/// written on its own, as it comes.
pub const GROUP_MAX_EVENTS: usize = 1000;

/// How long an emit waits for the store by default before it fails with
/// [`StoreError::Unavailable`]: see [`crate::Client::emit_timeout`]. Long
/// enough for the PostgreSQL store's retries of a lost connection (about
/// 3.1 s, `herald_postgres::EMIT_TRIES`), short enough that a client's
/// request times out later than the emit answers.
pub const DEFAULT_EMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// An emit's events and the answer to it: the events come back with the
/// result, for their notifications.
type Answer = (Vec<NewEvent>, StoreResult<Vec<Emitted>>);

/// One emit waiting for a write.
struct Pending {
    events: Vec<NewEvent>,
    answer: oneshot::Sender<Answer>,
}

/// Writes emits, grouping those that wait for a free write, and publishes
/// their notifications.
pub(crate) struct GroupCommit {
    store: Arc<dyn EventStore>,
    /// Publishes the notifications of emits written on their own and of
    /// each group, a group's as one.
    publisher: Arc<Publisher>,
    /// Grouped writes at once at most (zero: none, each emit alone).
    pub(crate) writes: usize,
    /// How long an emit waits for its write at most.
    pub(crate) timeout: Duration,
    /// The grouping task's inbox, started at the first emit (on the
    /// runtime that makes it).
    inbox: OnceLock<mpsc::UnboundedSender<Pending>>,
}

impl GroupCommit {
    /// Writes to `store` with at most `writes` grouped writes at once (zero:
    /// each emit is written on its own, as it comes), and notifies through
    /// `publisher`; an emit waits for its write at most `timeout`.
    pub(crate) fn new(
        store: Arc<dyn EventStore>,
        publisher: Arc<Publisher>,
        writes: usize,
        timeout: Duration,
    ) -> Self {
        GroupCommit {
            store,
            publisher,
            writes,
            timeout,
            inbox: OnceLock::new(),
        }
    }

    /// The deadline of an emit that starts now.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// [`StoreError::Unavailable`] for an emit whose store did not answer
    /// within the timeout.
    pub(crate) fn timed_out(&self) -> StoreError {
        StoreError::Unavailable {
            op: "emit",
            source: format!(
                "the store did not answer within {:?}; the events may be stored all the same",
                self.timeout
            )
            .into(),
        }
    }

    /// Stores `events`, perhaps together with other emits' events, and
    /// publishes the notifications of those it created; returns them with
    /// the store's answer for them, in their order, once the write is done
    /// and the publish is done or waited for long enough (see
    /// [`Publisher::publish`]; a failed publish is logged: the reconciler
    /// notifies those events). Past `deadline` without the store's answer:
    /// [`StoreError::Unavailable`].
    pub(crate) async fn emit(&self, events: Vec<NewEvent>, deadline: Instant) -> Answer {
        if self.writes == 0 || events.len() >= GROUP_MAX_EVENTS {
            return self.emit_alone(events, deadline).await;
        }
        let inbox = self.inbox.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(write_groups(
                self.store.clone(),
                self.publisher.clone(),
                self.writes,
                rx,
            ));
            tx
        });
        let (answer, wait) = oneshot::channel();
        match inbox.send(Pending { events, answer }) {
            // The grouping task is gone (its runtime was shut down): here.
            Err(mpsc::error::SendError(p)) => self.emit_alone(p.events, deadline).await,
            Ok(()) => match tokio::time::timeout_at(deadline, wait).await {
                Ok(Ok(answer)) => answer,
                // Only a runtime shutting down drops a write under way; its
                // events may or may not be stored, as after a lost
                // connection.
                Ok(Err(_)) => (
                    Vec::new(),
                    Err(StoreError::Unavailable {
                        op: "emit",
                        source: "the write was dropped as the runtime shut down".into(),
                    }),
                ),
                // The write, if it began, goes on: as after a lost
                // connection, the events may be stored.
                Err(_) => (Vec::new(), Err(self.timed_out())),
            },
        }
    }

    /// Writes `events` in a store call of their own; their notifications
    /// go through the publisher, grouped with other emits' that wait.
    async fn emit_alone(&self, events: Vec<NewEvent>, deadline: Instant) -> Answer {
        let out = match tokio::time::timeout_at(deadline, self.store.emit(&events)).await {
            Ok(out) => out,
            Err(_) => Err(self.timed_out()),
        };
        if let Ok(emitted) = &out {
            self.publisher.publish(created(&events, emitted)).await;
        }
        (events, out)
    }
}

/// Takes a free write, then every emit waiting (up to [`GROUP_MAX_EVENTS`]),
/// and writes them on a task of their own while the next group waits; the
/// write is free again once it has committed, before the group's publish.
/// An emit whose caller stopped waiting (its deadline passed while the
/// store was slow or away) is dropped unwritten: its caller was told the
/// store is unavailable.
async fn write_groups(
    store: Arc<dyn EventStore>,
    publisher: Arc<Publisher>,
    writes: usize,
    mut inbox: mpsc::UnboundedReceiver<Pending>,
) {
    let free = Arc::new(Semaphore::new(writes));
    loop {
        let Ok(write) = free.clone().acquire_owned().await else {
            return;
        };
        let first = loop {
            let Some(p) = inbox.recv().await else {
                return;
            };
            if !p.answer.is_closed() {
                break p;
            }
        };
        let mut count = first.events.len();
        let mut group = vec![first];
        while count < GROUP_MAX_EVENTS {
            match inbox.try_recv() {
                Ok(p) if p.answer.is_closed() => {}
                Ok(p) => {
                    count += p.events.len();
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        let (store, publisher) = (store.clone(), publisher.clone());
        tokio::spawn(async move {
            let answers = write_group(store.as_ref(), group).await;
            drop(write);
            let notify = answers
                .iter()
                .filter_map(|(_, (events, out))| Some(created(events, out.as_ref().ok()?)))
                .flatten()
                .collect();
            publisher.publish(notify).await;
            for (to, answer) in answers {
                let _ = to.send(answer);
            }
        });
    }
}

/// Where an emit's answer goes, and the answer.
type Answered = (oneshot::Sender<Answer>, Answer);

/// Writes a group in one store call and returns each emit's part of the
/// answer, in the group's order. If the call fails for a reason other than
/// a lost store, each emit is written again on its own, so that one emit's
/// bad event fails only that emit.
async fn write_group(store: &dyn EventStore, mut group: Vec<Pending>) -> Vec<Answered> {
    if group.len() == 1 {
        let p = group.pop().expect("one");
        let out = store.emit(&p.events).await;
        return vec![(p.answer, (p.events, out))];
    }
    let lens: Vec<usize> = group.iter().map(|p| p.events.len()).collect();
    let mut all: Vec<NewEvent> = group
        .iter_mut()
        .flat_map(|p| std::mem::take(&mut p.events))
        .collect();
    let mut answered = Vec::with_capacity(group.len());
    match store.emit(&all).await {
        Ok(mut emitted) => {
            for (p, n) in group.into_iter().zip(lens).rev() {
                let events = all.split_off(all.len() - n);
                let out = emitted.split_off(emitted.len() - n);
                answered.push((p.answer, (events, Ok(out))));
            }
        }
        Err(e @ (StoreError::Unavailable { .. } | StoreError::Closed)) => {
            // Another try each would wait out the store's retries again:
            // every emit of the group gets the error (the first the
            // original, with its source; the others a copy of its text).
            let copy = |e: &StoreError| match e {
                StoreError::Unavailable { op, source } => StoreError::Unavailable {
                    op,
                    source: source.to_string().into(),
                },
                _ => StoreError::Closed,
            };
            let mut original = Some(e);
            for (p, n) in group.into_iter().zip(lens).rev() {
                let events = all.split_off(all.len() - n);
                let err = if all.is_empty() {
                    original
                        .take()
                        .expect("taken once, by the group's first emit")
                } else {
                    copy(original.as_ref().expect("kept for the first emit"))
                };
                answered.push((p.answer, (events, Err(err))));
            }
        }
        Err(e) => {
            tracing::debug!(error = %escaped(&e), emits = group.len(), "a grouped emit failed; writing each emit on its own");
            for (p, n) in group.into_iter().zip(lens).rev() {
                let events = all.split_off(all.len() - n);
                let out = store.emit(&events).await;
                answered.push((p.answer, (events, out)));
            }
        }
    }
    answered.reverse();
    answered
}
