//! `/v1/events`: listing, showing, retrying and deleting stored events.

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use herald::backend::EventFilter;
use herald::{Event, EventId, EventState, Millis};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{ApiState, AppState, DEFAULT_LIMIT, MAX_LIMIT};
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, PathParams, QueryParams};

fn time(m: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(m.0.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An event as the API shows it.
#[derive(Serialize)]
pub(super) struct EventView {
    id: EventId,
    tenant: String,
    handler: String,
    /// The payload exactly as emitted.
    payload: Box<RawValue>,
    state: EventState,
    /// Whether a live lease holds it (by this server's clock).
    running: bool,
    run_at: String,
    attempt: u32,
    max_attempts: u32,
    lease_expires_at: Option<String>,
    last_error: Option<String>,
    /// Every failed attempt, oldest first: only when one event is shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<Vec<ErrorView>>,
    idempotency_key: Option<String>,
    /// The topic it was emitted to; `null` for a direct emit.
    topic: Option<String>,
    /// The concurrency key it was emitted with; `null` for none.
    concurrency_key: Option<String>,
    /// What holds it from running: the full limit it waits for (only
    /// when one event is shown, and one holds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_for: Option<WaitView>,
    /// The turn a rate limit gave it, while it is ahead: it starts then.
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limited_until: Option<String>,
    created_at: String,
    updated_at: String,
}

/// The full concurrency limit an event waits for.
#[derive(Serialize)]
pub(super) struct WaitView {
    /// What the limit counts: `handler`, `tenant` or `key`.
    per: herald::LimitKind,
    /// The tenant and key it counts this event under, where it counts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// Runs holding a slot of it now.
    running: u32,
    /// The limit.
    limit: u32,
    /// The same in words: "5 of 5 running for key \"acme\" of handler \"sync\"".
    reason: String,
}

impl From<herald::LimitWait> for WaitView {
    fn from(w: herald::LimitWait) -> Self {
        let (tenant, key) = w.scope.names();
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        WaitView {
            per: w.scope.kind(),
            tenant: some(tenant),
            key: some(key),
            running: w.running,
            limit: w.limit,
            reason: w.to_string(),
        }
    }
}

/// One failed attempt in an event's error history.
#[derive(Serialize)]
pub(super) struct ErrorView {
    attempt: u32,
    at: String,
    error: String,
}

impl From<Event> for EventView {
    fn from(e: Event) -> Self {
        let now = Millis::now();
        let payload = RawValue::from_string(e.payload.clone()).unwrap_or_else(|_| {
            // Every stored payload was checked as JSON; show anything else as a string.
            RawValue::from_string(serde_json::Value::String(e.payload).to_string())
                .expect("a JSON string")
        });
        EventView {
            id: e.id,
            tenant: e.tenant,
            handler: e.handler,
            payload,
            state: e.state,
            running: e.state == EventState::Pending && e.lease.is_some_and(|l| l.expires_at > now),
            run_at: time(e.run_at),
            attempt: e.attempt,
            max_attempts: e.max_attempts,
            lease_expires_at: e.lease.map(|l| time(l.expires_at)),
            last_error: e.last_error,
            errors: None,
            idempotency_key: e.idempotency_key,
            topic: e.topic,
            concurrency_key: e.concurrency_key,
            waiting_for: None,
            rate_limited_until: e
                .rate_turn
                .filter(|t| e.state == EventState::Pending && t.0 > now.0)
                .map(time),
            created_at: time(e.created_at),
            updated_at: time(e.updated_at),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    tenant: Option<String>,
    handler: Option<String>,
    state: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

pub(super) async fn list_events(
    State(s): ApiState,
    caller: Caller,
    QueryParams(q): QueryParams<ListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = match (caller.tenant(), q.tenant) {
        (Some(_), Some(asked)) => {
            caller.may_act_for(&asked)?;
            Some(asked)
        }
        (Some(own), None) => Some(own.to_string()),
        (None, asked) => asked,
    };
    let state = match q.state.as_deref() {
        None => None,
        Some(text) => Some(EventState::parse(text).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("state: {text:?} is not a state; use pending, dead or done"),
            )
        })?),
    };
    let after = match q.after.as_deref() {
        None | Some("") => None,
        Some(text) => Some(text.parse::<EventId>().map_err(|_| {
            ApiError::bad_request(
                "invalid_query",
                format!(
                    "after: {text:?} is not a cursor; pass the `next` value of the previous page"
                ),
            )
        })?),
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_query",
                    format!("limit: {text:?} is not a whole number from 1 to {MAX_LIMIT}"),
                )
            })?,
    };
    let filter = EventFilter {
        tenant,
        handler: q.handler,
        state,
        after,
    };
    let events = s.client.list(&filter, limit).await?;
    let next = (events.len() == limit)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    let events: Vec<EventView> = events.into_iter().map(EventView::from).collect();
    Ok(Json(serde_json::json!({ "events": events, "next": next })))
}

fn event_id(text: &str) -> Result<EventId, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_id",
            format!("{text:?} is not an event id; ids are UUIDs, as returned by POST /v1/events"),
        )
    })
}

/// Loads an event the caller may see.
async fn visible_event(s: &AppState, caller: &Caller, id: EventId) -> Result<Event, ApiError> {
    let event = s
        .client
        .get(id)
        .await?
        .ok_or_else(|| ApiError::no_event(id))?;
    caller.may_act_for(&event.tenant)?;
    Ok(event)
}

pub(super) async fn show_event(
    State(s): ApiState,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(&id)?;
    let mut view: EventView = visible_event(&s, &caller, id).await?.into();
    let history = s.client.history(id).await?;
    view.waiting_for = s.client.waiting(id).await?.map(WaitView::from);
    view.errors = Some(
        history
            .into_iter()
            .map(|h| ErrorView {
                attempt: h.attempt,
                at: time(h.at),
                error: h.error,
            })
            .collect(),
    );
    Ok(Json(view))
}

pub(super) async fn retry_event(
    State(s): ApiState,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = event_id(&id)?;
    let event = visible_event(&s, &caller, id).await?;
    if event.state != EventState::Dead {
        return Err(not_dead(&event));
    }
    if !s.client.retry_dead(id).await? {
        // It changed in between: say what it is now.
        let event = visible_event(&s, &caller, id).await?;
        return Err(not_dead(&event));
    }
    Ok(Json(serde_json::json!({ "id": id, "state": "pending" })))
}

fn not_dead(e: &Event) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_dead",
        format!(
            "event {} is {}, not dead: only dead events can be retried",
            e.id,
            e.state.as_str()
        ),
    )
}

pub(super) async fn delete_event(
    State(s): ApiState,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = event_id(&id)?;
    visible_event(&s, &caller, id).await?;
    if s.client.delete(id).await? {
        return Ok(Json(serde_json::json!({ "id": id, "deleted": true })));
    }
    match s.client.get(id).await? {
        None => Err(ApiError::no_event(id)),
        Some(e) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "event_running",
            format!(
                "event {id} is running (its lease expires at {}); wait for the run to end, then delete it",
                e.lease.map(|l| time(l.expires_at)).unwrap_or_else(|| "?".into())
            ),
        )),
    }
}
