//! Handlers: the code that processes events, and what they can answer.
//!
//! A handler is either a payload type that implements [`Job`], or an async
//! function registered under a name (see [`crate::WorkerBuilder::handler`]).
//! Both return `Result<(), HandlerError>`; `?` on any error means "failed,
//! retry with backoff". [`HandlerError`] also says "retry after", "snooze"
//! and "fail for good".

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::model::{EventId, LeaseToken};

/// How a run ended, from the handler's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: the event is deleted (or archived).
    Done,
    /// Failed: retry with backoff (or after `after`), or go dead when no
    /// attempts are left.
    Retry {
        /// What went wrong, recorded on the event.
        error: String,
        /// Wait this long instead of the backoff.
        after: Option<Duration>,
    },
    /// Not now: run again after this long; the attempt is given back.
    Snooze(Duration),
    /// Failed for good: go dead at once, whatever attempts are left.
    Fail(String),
}

impl Outcome {
    /// A failure to retry with backoff.
    pub fn retry(error: impl fmt::Display) -> Self {
        Outcome::Retry {
            error: error.to_string(),
            after: None,
        }
    }

    /// A failure that should not be retried.
    pub fn fail(error: impl fmt::Display) -> Self {
        Outcome::Fail(error.to_string())
    }
}

/// The error side of a handler's result. Convert any `std::error::Error`
/// with `?` (a retryable failure), or build one to say more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError(Outcome);

impl HandlerError {
    /// Failed; retry with the backoff.
    pub fn retry(error: impl fmt::Display) -> Self {
        HandlerError(Outcome::retry(error))
    }

    /// Failed; retry after exactly `after` (still uses an attempt).
    pub fn retry_after(error: impl fmt::Display, after: Duration) -> Self {
        HandlerError(Outcome::Retry {
            error: error.to_string(),
            after: Some(after),
        })
    }

    /// Not now: run again after `d` without using an attempt.
    pub fn snooze(d: Duration) -> Self {
        HandlerError(Outcome::Snooze(d))
    }

    /// Failed for good: the event goes dead now.
    pub fn fail(error: impl fmt::Display) -> Self {
        HandlerError(Outcome::fail(error))
    }

    /// The outcome this error stands for.
    pub fn into_outcome(self) -> Outcome {
        self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        // Keep the whole cause chain: the last error is often the useful one.
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        HandlerError::retry(text)
    }
}

/// Anything a handler may return.
pub trait IntoOutcome {
    /// Converts into the outcome herald acts on.
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Outcome::Done
    }
}

impl IntoOutcome for Result<(), HandlerError> {
    fn into_outcome(self) -> Outcome {
        match self {
            Ok(()) => Outcome::Done,
            Err(e) => e.into_outcome(),
        }
    }
}

/// What a handler knows about the run it is in.
#[derive(Clone, Debug)]
pub struct Context {
    /// The event's id.
    pub event_id: EventId,
    /// The event's tenant.
    pub tenant: String,
    /// The handler name.
    pub handler: String,
    /// This run's attempt number, from 1.
    pub attempt: u32,
    /// The attempt limit.
    pub max_attempts: u32,
    /// This run's lease token: unique per run (every event of a claim gets
    /// its own), so a handler can tell two
    /// runs of one event apart (for example to make its side effects
    /// idempotent per run, or to keep a ledger of runs).
    pub lease_token: LeaseToken,
    cancel: CancellationToken,
    deadline: watch::Receiver<Instant>,
}

impl Context {
    /// The context of a run of `event` (its tenant, handler and attempts).
    pub(crate) fn new(
        event: &crate::model::Event,
        lease_token: LeaseToken,
        cancel: CancellationToken,
        deadline: watch::Receiver<Instant>,
    ) -> Self {
        Context {
            event_id: event.id,
            tenant: event.tenant.clone(),
            handler: event.handler.clone(),
            attempt: event.attempt,
            max_attempts: event.max_attempts,
            lease_token,
            cancel,
            deadline,
        }
    }

    /// When, by this worker's monotonic clock, the runtime gives this run
    /// up (cancels it) unless its lease is renewed first: a sixth of the
    /// lease before the lease could lapse in the store, whatever the store
    /// does (docs/semantics.md, "Leases"). Each renewal moves it on. A
    /// handler that hands its work to another process can stop that work
    /// by then even if this process is frozen: herald's command handler
    /// gives it to its run watchdog.
    pub fn lease_deadline(&self) -> watch::Receiver<Instant> {
        self.deadline.clone()
    }

    /// Resolves when the run is cancelled (shutdown past its grace period, or
    /// a lost lease). The runtime drops the handler's future at that moment
    /// anyway; this lets a handler clean up on its own terms first.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// True once the run is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// A handler as the runtime sees it: a name-erased function of the raw
/// JSON payload.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one event.
    async fn call(&self, payload: &str, cx: Context) -> Outcome;
}

/// A typed event: a payload type with a handler name and the code to run it.
///
/// ```
/// use herald::{Context, HandlerError, Job};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail { to: String }
///
/// impl Job for SendEmail {
///     const NAME: &'static str = "send_email";
///     async fn run(self, _cx: Context) -> Result<(), HandlerError> {
///         if self.to.is_empty() {
///             return Err(HandlerError::fail("no recipient"));
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + 'static {
    /// The handler name events of this type are emitted under.
    const NAME: &'static str;
    /// Attempts before an event of this type goes dead, unless the emit says
    /// otherwise.
    const MAX_ATTEMPTS: u32 = crate::retry::DEFAULT_MAX_ATTEMPTS;
    /// Processes one event.
    fn run(self, cx: Context) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

fn decode<T: DeserializeOwned>(payload: &str) -> Result<T, Outcome> {
    serde_json::from_str(payload).map_err(|e| {
        // A payload that does not fit the type will not fit it next time either.
        Outcome::fail(format!(
            "payload does not match {}: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// Adapts a [`Job`] type to [`Handler`].
pub(crate) struct JobHandler<J>(PhantomData<fn() -> J>);

impl<J> JobHandler<J> {
    pub(crate) fn new() -> Self {
        JobHandler(PhantomData)
    }
}

#[async_trait]
impl<J: Job> Handler for JobHandler<J> {
    async fn call(&self, payload: &str, cx: Context) -> Outcome {
        match decode::<J>(payload) {
            Ok(job) => job.run(cx).await.into_outcome(),
            Err(outcome) => outcome,
        }
    }
}

/// Adapts an async function of a typed payload to [`Handler`].
pub(crate) struct FnHandler<F, T> {
    f: F,
    _payload: PhantomData<fn() -> T>,
}

impl<F, T> FnHandler<F, T> {
    pub(crate) fn new(f: F) -> Self {
        FnHandler {
            f,
            _payload: PhantomData,
        }
    }
}

#[async_trait]
impl<F, Fut, T, O> Handler for FnHandler<F, T>
where
    F: Fn(T, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send,
    T: DeserializeOwned + Send + 'static,
    O: IntoOutcome,
{
    async fn call(&self, payload: &str, cx: Context) -> Outcome {
        match decode::<T>(payload) {
            Ok(value) => (self.f)(value, cx).await.into_outcome(),
            Err(outcome) => outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn question_mark_keeps_the_cause_chain_and_retries() {
        let e: HandlerError = Outer(std::io::Error::other("disk full")).into();
        assert_eq!(e.into_outcome(), Outcome::retry("outer: disk full"));
    }

    #[tokio::test]
    async fn a_payload_of_the_wrong_shape_fails_for_good() {
        #[derive(serde::Deserialize)]
        struct P {
            #[allow(dead_code)]
            n: u32,
        }
        let h = FnHandler::new(|_: P, _cx: Context| async {});
        let event = crate::model::Event {
            rate_turn: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: "t".into(),
            handler: "h".into(),
            payload: r#"{"n":"seven"}"#.into(),
            state: crate::model::EventState::Pending,
            run_at: crate::model::Millis(0),
            attempt: 1,
            max_attempts: 3,
            lease: None,
            last_error: None,
            idempotency_key: None,
            topic: None,
            created_at: crate::model::Millis(0),
            updated_at: crate::model::Millis(0),
        };
        let cx = Context::new(
            &event,
            LeaseToken::new(),
            CancellationToken::new(),
            watch::channel(Instant::now() + std::time::Duration::from_secs(60)).1,
        );
        let out = h.call(r#"{"n":"seven"}"#, cx).await;
        assert!(matches!(out, Outcome::Fail(ref e) if e.contains("payload does not match")));
    }
}
