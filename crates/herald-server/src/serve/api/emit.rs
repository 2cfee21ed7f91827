//! `POST /v1/events` and `POST /v1/events/batch`: emits, one or many.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald::{ClientError, EmitOptions, EmitRequest, Emitted, EventId, Millis};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ApiState;
use crate::config::parse_duration;
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, JsonBody};

/// One event to emit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EmitBody {
    tenant: String,
    handler: String,
    payload: Box<RawValue>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    run_at: Option<String>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    concurrency_key: Option<String>,
    #[serde(default)]
    singleton: Option<herald::Singleton>,
}

impl EmitBody {
    fn into_request(self) -> Result<EmitRequest, ApiError> {
        Ok(EmitRequest {
            tenant: self.tenant,
            handler: self.handler,
            payload: self.payload.get().to_string(),
            options: emit_options(
                self.delay,
                self.run_at,
                self.max_attempts,
                self.idempotency_key,
                self.concurrency_key,
                self.singleton,
            )?,
        })
    }
}

/// An emit's options from its body's fields (an event's or a topic's),
/// `delay` and `run_at` parsed.
pub(super) fn emit_options(
    delay: Option<String>,
    run_at: Option<String>,
    max_attempts: Option<u32>,
    idempotency_key: Option<String>,
    concurrency_key: Option<String>,
    singleton: Option<herald::Singleton>,
) -> Result<EmitOptions, ApiError> {
    let delay = match delay {
        None => None,
        Some(d) => Some(
            parse_duration(&d)
                .map_err(|m| ApiError::invalid("invalid_delay", format!("delay: {m}")))?,
        ),
    };
    let run_at = match run_at {
        None => None,
        Some(t) => Some(parse_run_at(&t)?),
    };
    Ok(EmitOptions {
        delay,
        run_at,
        max_attempts,
        idempotency_key,
        concurrency_key,
        singleton,
    })
}

/// An emit's `run_at`: an RFC 3339 time with its offset
/// (`2026-12-07T12:00:03Z`, `2026-12-07T13:00:03.250+01:00`).
fn parse_run_at(text: &str) -> Result<Millis, ApiError> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| Millis(t.timestamp_millis()))
        .map_err(|e| {
            ApiError::invalid(
                "invalid_run_at",
                format!(
                    "run_at \"{}\": {e}; write an RFC 3339 time such as 2026-12-07T12:00:03Z",
                    herald::escape::escaped(text)
                ),
            )
        })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchBody {
    events: Vec<EmitBody>,
}

/// What one emit stored: the id and whether it is new.
#[derive(Serialize)]
pub(super) struct EmitResult {
    id: EventId,
    created: bool,
}

impl From<Emitted> for EmitResult {
    fn from(e: Emitted) -> Self {
        EmitResult {
            id: e.id(),
            created: matches!(e, Emitted::Created(_)),
        }
    }
}

pub(super) async fn emit(
    State(s): ApiState,
    caller: Caller,
    JsonBody(body): JsonBody<EmitBody>,
) -> Result<Response, ApiError> {
    caller.may_act_for(&body.tenant)?;
    let request = body.into_request()?;
    let emitted = s.client.emit_batch(vec![request]).await?;
    let result = EmitResult::from(emitted[0]);
    let status = if result.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(result)).into_response())
}

pub(super) async fn emit_batch(
    State(s): ApiState,
    caller: Caller,
    JsonBody(body): JsonBody<BatchBody>,
) -> Result<Response, ApiError> {
    let n = body.events.len();
    if n == 0 {
        return Err(ApiError::invalid(
            "empty_batch",
            format!("events is empty; send 1 to {} events", s.max_batch),
        ));
    }
    if n > s.max_batch {
        return Err(ApiError::invalid(
            "batch_too_large",
            format!(
                "events holds {n} events, over the limit of {}; split it into smaller batches",
                s.max_batch
            ),
        ));
    }
    let mut requests = Vec::with_capacity(n);
    for (i, e) in body.events.into_iter().enumerate() {
        let at = format!("events[{i}]");
        caller.may_act_for(&e.tenant).map_err(|e| e.within(&at))?;
        requests.push(e.into_request().map_err(|e| e.within(&at))?);
    }
    let emitted = s.client.emit_batch(requests).await.map_err(|e| match e {
        // A batch of one is validated as a single request: name its index too.
        ClientError::Store(_) | ClientError::InBatch { .. } => ApiError::from(e),
        other => ApiError::from(other).within("events[0]"),
    })?;
    let created = emitted.iter().any(|e| matches!(e, Emitted::Created(_)));
    let results: Vec<EmitResult> = emitted.into_iter().map(EmitResult::from).collect();
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(serde_json::json!({ "results": results }))).into_response())
}
