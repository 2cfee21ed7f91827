//! What herald checks of an existing stream and consumer: a field herald
//! depends on that differs is an error naming it; another number of
//! replicas is a warning.

use async_nats::jetstream::{consumer, stream};
use herald::queue::{QueueError, QueueResult};

use std::time::Duration;

use crate::{NatsConfig, MIN_DUPLICATE_WINDOW};

pub(crate) fn mismatch(
    what: &str,
    field: &str,
    want: impl std::fmt::Debug,
    got: impl std::fmt::Debug,
) -> QueueError {
    QueueError::Config(format!(
        "{what}: {field} is {got:?}, herald needs {want:?} (fix or delete it)"
    ))
}

/// Refuses a stream herald can't work with; returns what it accepts but
/// would have set otherwise.
pub(crate) fn check_stream(config: &NatsConfig, got: &stream::Config) -> QueueResult<Vec<String>> {
    let what = format!("stream {}", config.stream);
    if got.retention != stream::RetentionPolicy::WorkQueue {
        return Err(mismatch(
            &what,
            "retention",
            stream::RetentionPolicy::WorkQueue,
            got.retention,
        ));
    }
    if !got.subjects.contains(&config.subject) {
        return Err(mismatch(
            &what,
            "subjects",
            [&config.subject],
            &got.subjects,
        ));
    }
    // Memory storage loses every pending notification, delayed ones
    // included, when its servers restart; the reconciler would then have to
    // re-notify every pending event at once.
    if got.storage != stream::StorageType::File {
        return Err(QueueError::Config(format!(
            "{what}: storage is {:?}, herald needs File: a memory stream loses its notifications when its servers restart (delete it and let herald create it, or create it with --storage file)",
            got.storage
        )));
    }
    if got.duplicate_window < MIN_DUPLICATE_WINDOW {
        return Err(QueueError::Config(format!(
            "{what}: duplicate_window is {:?}, herald needs at least {MIN_DUPLICATE_WINDOW:?}, the span of its retries of one publish (fix it with `nats stream edit {} --dupe-window 2m`)",
            got.duplicate_window, config.stream
        )));
    }
    let mut warnings = Vec::new();
    if got.num_replicas != config.replicas {
        warnings.push(format!(
            "{what}: num_replicas is {}, herald is configured for {}; herald does not change an existing stream (`nats stream edit {} --replicas {}` does)",
            got.num_replicas, config.replicas, config.stream, config.replicas
        ));
    }
    Ok(warnings)
}

/// Refuses a consumer herald can't work with; returns what it accepts but
/// would have set otherwise.
pub(crate) fn check_consumer(
    config: &NatsConfig,
    got: &consumer::Config,
    stream_replicas: usize,
) -> QueueResult<Vec<String>> {
    let what = format!("consumer {}", config.consumer);
    if got.ack_policy != consumer::AckPolicy::Explicit {
        return Err(mismatch(
            &what,
            "ack_policy",
            consumer::AckPolicy::Explicit,
            got.ack_policy,
        ));
    }
    // First: the server sets AckWait to the BackOff's first step.
    if !got.backoff.is_empty() {
        return Err(mismatch(
            &what,
            "backoff",
            Vec::<Duration>::new(),
            &got.backoff,
        ));
    }
    if got.ack_wait != config.ack_wait {
        return Err(mismatch(&what, "ack_wait", config.ack_wait, got.ack_wait));
    }
    if got.max_deliver > 0 {
        return Err(mismatch(&what, "max_deliver", -1, got.max_deliver));
    }
    if got.deliver_subject.is_some() {
        return Err(mismatch(
            &what,
            "deliver_subject",
            None::<String>,
            &got.deliver_subject,
        ));
    }
    if got.max_ack_pending > 0 && got.max_ack_pending < config.max_ack_pending {
        return Err(QueueError::Config(format!(
            "{what}: max_ack_pending is {}, herald needs at least {} or unlimited (-1): raise it with `nats consumer edit {} {} --max-pending {}`, or configure herald for {} or less",
            got.max_ack_pending,
            config.max_ack_pending,
            config.stream,
            config.consumer,
            config.max_ack_pending,
            got.max_ack_pending
        )));
    }
    // A memory consumer's state is lost on restart: the workers' pulls then
    // fail until it is created again.
    if got.memory_storage {
        return Err(mismatch(&what, "mem_storage", false, true));
    }
    let mut warnings = Vec::new();
    // 0: as many as the stream.
    if got.num_replicas != 0 && got.num_replicas != stream_replicas {
        warnings.push(format!(
            "{what}: num_replicas is {}, its stream has {stream_replicas}; herald does not change an existing consumer",
            got.num_replicas
        ));
    }
    Ok(warnings)
}
