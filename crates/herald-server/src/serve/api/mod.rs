//! The HTTP API: versioned JSON under `/v1`, `/metrics`, `/openapi.json`,
//! and the dashboard (`/` and `/ui/…`).
//! Every route is declared through [`Routes`], which keeps the list that
//! the OpenAPI test compares with the document.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::handler::Handler;
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{self, MethodRouter};
use axum::Router;
use herald::backend::Schedules;
use herald::Client;
use metrics_exporter_prometheus::PrometheusHandle;

use super::auth::Tokens;
use super::error::ApiError;
use super::recent::Tracker;

mod emit;
mod events;
mod limits;
mod rules;
mod schedules;
mod stats;
mod topics;

use emit::{emit, emit_batch};
use events::{delete_event, list_events, retry_event, show_event};
use limits::{delete_limit, limits, put_limit};
use rules::{block, pause, rules, unblock, unpause};
pub use schedules::ScheduleView;
use schedules::{
    all_schedules, create_schedule, delete_schedule, pause_schedule, put_schedule, resume_schedule,
    show_schedule, tenant_schedules,
};
use stats::{metrics, openapi, stats};
use topics::{
    emit_topic, list_topics, subscribe_all, subscribe_tenant, tenant_subscribers, unsubscribe_all,
    unsubscribe_tenant,
};

/// The OpenAPI document, served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Default and largest page of `GET /v1/events`.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// What every request handler shares.
pub struct AppState {
    /// Emits and runs the operator's verbs.
    pub client: Client,
    /// The schedules' definitions, for the schedule endpoints.
    pub schedules: Arc<dyn Schedules>,
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

type ApiState = State<Arc<AppState>>;

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
        .get("/v1/limits", limits)
        .put("/v1/limits", put_limit)
        .delete("/v1/limits", delete_limit)
        .post("/v1/tenants/{tenant}/topics/{topic}/events", emit_topic)
        .get(
            "/v1/tenants/{tenant}/topics/{topic}/subscribers",
            tenant_subscribers,
        )
        .put(
            "/v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}",
            subscribe_tenant,
        )
        .delete(
            "/v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}",
            unsubscribe_tenant,
        )
        .get("/v1/topics", list_topics)
        .put("/v1/topics/{topic}/subscribers/{handler}", subscribe_all)
        .delete("/v1/topics/{topic}/subscribers/{handler}", unsubscribe_all)
        .get("/v1/schedules", all_schedules)
        .get("/v1/tenants/{tenant}/schedules", tenant_schedules)
        .post("/v1/tenants/{tenant}/schedules", create_schedule)
        .get("/v1/tenants/{tenant}/schedules/{name}", show_schedule)
        .put("/v1/tenants/{tenant}/schedules/{name}", put_schedule)
        .delete("/v1/tenants/{tenant}/schedules/{name}", delete_schedule)
        .post(
            "/v1/tenants/{tenant}/schedules/{name}/pause",
            pause_schedule,
        )
        .post(
            "/v1/tenants/{tenant}/schedules/{name}/resume",
            resume_schedule,
        )
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
