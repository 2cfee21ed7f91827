//! The HTTP API: versioned JSON under `/v1`, `/metrics`, `/openapi.json`,
//! and the dashboard (`/` and `/ui/…`).
//! Every route is declared through [`Routes`], which keeps the list that
//! the OpenAPI test compares with the document.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::{Json, Router};
use herald::store::EventFilter;
use herald::{
    Client, ClientError, EmitOptions, EmitRequest, Emitted, Event, EventId, EventState, Millis,
    RuleMatch,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::auth::{Caller, Tokens};
use super::error::{ApiError, JsonBody, PathParams, QueryParams};
use super::recent::{RecentStats, Tracker};
use crate::config::parse_duration;

/// The OpenAPI document, served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Default and largest page of `GET /v1/events`.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// What every request handler shares.
pub struct AppState {
    /// Emits and runs the operator's verbs.
    pub client: Client,
    /// Who may call.
    pub tokens: Tokens,
    /// Recent activity, fed by the worker.
    pub tracker: Arc<Tracker>,
    /// The Prometheus recorder's handle.
    pub metrics: PrometheusHandle,
    /// Most events per batch request.
    pub max_batch: usize,
    /// The largest request body.
    pub max_request_bytes: usize,
    /// The handler names this server's worker runs.
    pub handlers: Vec<String>,
}

type Shared = State<Arc<AppState>>;

/// A router under construction that remembers every `(method, path)` it was given.
pub struct Routes {
    router: Router<Arc<AppState>>,
    list: Vec<(Method, &'static str)>,
}

impl Routes {
    fn new() -> Self {
        Routes {
            router: Router::new(),
            list: Vec::new(),
        }
    }

    fn add(
        mut self,
        method: Method,
        path: &'static str,
        route: MethodRouter<Arc<AppState>>,
    ) -> Self {
        self.list.push((method, path));
        self.router = self.router.route(path, route);
        self
    }

    fn get<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, h: H) -> Self {
        self.add(Method::GET, path, routing::get(h))
    }

    fn post<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, h: H) -> Self {
        self.add(Method::POST, path, routing::post(h))
    }

    fn put<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, h: H) -> Self {
        self.add(Method::PUT, path, routing::put(h))
    }

    fn delete<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, h: H) -> Self {
        self.add(Method::DELETE, path, routing::delete(h))
    }
}

/// Every route of the API, declared once.
fn routes() -> Routes {
    Routes::new()
        .post("/v1/events", emit)
        .get("/v1/events", list_events)
        .post("/v1/events/batch", emit_batch)
        .get("/v1/events/{id}", show_event)
        .delete("/v1/events/{id}", delete_event)
        .post("/v1/events/{id}/retry", retry_event)
        .put("/v1/tenants/{tenant}/handlers/{handler}/pause", pause)
        .delete("/v1/tenants/{tenant}/handlers/{handler}/pause", unpause)
        .put("/v1/tenants/{tenant}/handlers/{handler}/block", block)
        .delete("/v1/tenants/{tenant}/handlers/{handler}/block", unblock)
        .get("/v1/rules", rules)
        .get("/v1/stats", stats)
        .get("/metrics", metrics)
        .get("/openapi.json", openapi)
        .get("/", super::ui::index)
        .get("/ui/app.js", super::ui::app_js)
        .get("/ui/app.css", super::ui::app_css)
}

/// The `(method, path)` of every route, as the router has them.
#[cfg(test)]
pub fn route_list() -> Vec<(Method, &'static str)> {
    routes().list
}

/// The API's router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_request_bytes;
    routes()
        .router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "there is no route {method} {}; the API is described at GET /openapi.json",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} does not accept {method}; the API is described at GET /openapi.json",
            uri.path()
        ),
    )
}

// ---- emit -------------------------------------------------------------

/// One event to emit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmitBody {
    tenant: String,
    handler: String,
    payload: Box<RawValue>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

impl EmitBody {
    fn into_request(self) -> Result<EmitRequest, ApiError> {
        let delay = match self.delay {
            None => None,
            Some(d) => Some(
                parse_duration(&d)
                    .map_err(|m| ApiError::invalid("invalid_delay", format!("delay: {m}")))?,
            ),
        };
        Ok(EmitRequest {
            tenant: self.tenant,
            handler: self.handler,
            payload: self.payload.get().to_string(),
            options: EmitOptions {
                delay,
                max_attempts: self.max_attempts,
                idempotency_key: self.idempotency_key,
            },
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    events: Vec<EmitBody>,
}

#[derive(Serialize)]
struct EmitResult {
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

async fn emit(
    State(s): Shared,
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

async fn emit_batch(
    State(s): Shared,
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

// ---- events -----------------------------------------------------------

fn time(m: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(m.0.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An event as the API shows it.
#[derive(Serialize)]
struct EventView {
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
    created_at: String,
    updated_at: String,
}

/// One failed attempt in an event's error history.
#[derive(Serialize)]
struct ErrorView {
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
            created_at: time(e.created_at),
            updated_at: time(e.updated_at),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    tenant: Option<String>,
    handler: Option<String>,
    state: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

async fn list_events(
    State(s): Shared,
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

async fn show_event(
    State(s): Shared,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(&id)?;
    let mut view: EventView = visible_event(&s, &caller, id).await?.into();
    let history = s.client.store().history(id).await?;
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

async fn retry_event(
    State(s): Shared,
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

async fn delete_event(
    State(s): Shared,
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

// ---- rules ------------------------------------------------------------

fn names(tenant: &str, handler: &str) -> Result<(), ApiError> {
    herald::client::check_name("tenant", tenant)?;
    herald::client::check_name("handler", handler)?;
    Ok(())
}

#[derive(Serialize)]
struct Held {
    paused: bool,
    blocked: bool,
}

impl From<RuleMatch> for Held {
    fn from(m: RuleMatch) -> Self {
        Held {
            paused: m.paused,
            blocked: m.blocked,
        }
    }
}

fn release(r: herald::Release) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "removed": r.removed,
        "still_held": Held::from(r.still_held),
        "notified": r.notified,
    }))
}

async fn pause(
    State(s): Shared,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.may_act_for(&tenant)?;
    let added = s.client.pause(&tenant, &handler).await?;
    Ok(Json(serde_json::json!({ "added": added })))
}

async fn unpause(
    State(s): Shared,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.may_act_for(&tenant)?;
    Ok(release(s.client.unpause(&tenant, &handler).await?))
}

async fn block(
    State(s): Shared,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.must_be_operator("block")?;
    let added = s.client.block(&tenant, &handler).await?;
    Ok(Json(serde_json::json!({ "added": added })))
}

async fn unblock(
    State(s): Shared,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.must_be_operator("unblock")?;
    Ok(release(s.client.unblock(&tenant, &handler).await?))
}

async fn rules(State(s): Shared, caller: Caller) -> Result<Json<serde_json::Value>, ApiError> {
    let mut rules = s.client.rules().await?;
    if let Some(own) = caller.tenant() {
        rules.retain(|r| r.tenant == own);
    }
    Ok(Json(serde_json::json!({ "rules": rules })))
}

// ---- stats, metrics, openapi ------------------------------------------

#[derive(Serialize)]
struct CountView {
    tenant: String,
    handler: String,
    state: EventState,
    count: u64,
    paused: bool,
    blocked: bool,
}

/// One `(tenant, handler)`: what its events are doing now.
#[derive(Serialize)]
struct HandlerCountView {
    #[serde(flatten)]
    counts: herald::HandlerCounts,
    paused: bool,
    blocked: bool,
}

#[derive(Serialize)]
struct StatsView {
    /// Per (tenant, handler, state), as before `by_handler`: kept for
    /// compatibility (derived from it; exact).
    counts: Vec<CountView>,
    /// Per (tenant, handler): waiting, running, delayed, held, dead, done.
    by_handler: Vec<HandlerCountView>,
    /// Server-wide activity: the operator's only.
    recent: Option<RecentStats>,
    /// The handlers this server runs: the operator's only.
    handlers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsParams {
    tenant: Option<String>,
}

async fn stats(
    State(s): Shared,
    caller: Caller,
    QueryParams(q): QueryParams<StatsParams>,
) -> Result<Json<StatsView>, ApiError> {
    let tenant = match (caller.tenant(), q.tenant) {
        (Some(_), Some(asked)) => {
            caller.may_act_for(&asked)?;
            Some(asked)
        }
        (Some(own), None) => Some(own.to_string()),
        (None, asked) => asked,
    };
    if let Some(t) = &tenant {
        herald::client::check_name("tenant", t)?;
    }
    let mut held: HashMap<(String, String), RuleMatch> = HashMap::new();
    for r in s.client.rules().await? {
        let m = held.entry((r.tenant, r.handler)).or_default();
        match r.kind {
            herald::RuleKind::Pause => m.paused = true,
            herald::RuleKind::Block => m.blocked = true,
        }
    }
    let query = herald::CountsQuery {
        tenant,
        ..herald::CountsQuery::all()
    };
    let rows = s.client.handler_counts(&query).await?;
    let mut counts = Vec::new();
    let mut by_handler = Vec::with_capacity(rows.len());
    for c in rows {
        let m = held
            .get(&(c.tenant.clone(), c.handler.clone()))
            .copied()
            .unwrap_or_default();
        for (state, count) in [
            (EventState::Pending, c.pending()),
            (EventState::Dead, c.dead),
            (EventState::Done, c.done),
        ] {
            if count > 0 {
                counts.push(CountView {
                    tenant: c.tenant.clone(),
                    handler: c.handler.clone(),
                    state,
                    count,
                    paused: m.paused,
                    blocked: m.blocked,
                });
            }
        }
        by_handler.push(HandlerCountView {
            counts: c,
            paused: m.paused,
            blocked: m.blocked,
        });
    }
    let operator = caller.tenant().is_none();
    Ok(Json(StatsView {
        counts,
        by_handler,
        recent: operator.then(|| s.tracker.snapshot()),
        handlers: operator.then(|| s.handlers.clone()),
    }))
}

async fn metrics(State(s): Shared) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
