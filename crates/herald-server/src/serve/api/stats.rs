//! `GET /v1/stats`, `/metrics` and `/openapi.json`.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald::RuleMatch;
use serde::{Deserialize, Serialize};

use super::{ApiState, OPENAPI};
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, QueryParams};
use crate::serve::recent::RecentStats;

/// One `(tenant, handler)`: what its events are doing now.
#[derive(Serialize)]
pub(super) struct HandlerCountView {
    #[serde(flatten)]
    counts: herald::HandlerCounts,
    paused: bool,
    blocked: bool,
}

#[derive(Serialize)]
pub(super) struct StatsView {
    /// Per (tenant, handler): waiting, running, delayed, held, dead, done.
    by_handler: Vec<HandlerCountView>,
    /// Server-wide activity: the operator's only.
    recent: Option<RecentStats>,
    /// The handlers this server runs: the operator's only.
    handlers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatsParams {
    tenant: Option<String>,
}

pub(super) async fn stats(
    State(s): ApiState,
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
    let mut by_handler = Vec::with_capacity(rows.len());
    for c in rows {
        let m = held
            .get(&(c.tenant.clone(), c.handler.clone()))
            .copied()
            .unwrap_or_default();
        by_handler.push(HandlerCountView {
            counts: c,
            paused: m.paused,
            blocked: m.blocked,
        });
    }
    let operator = caller.tenant().is_none();
    Ok(Json(StatsView {
        by_handler,
        recent: operator.then(|| s.tracker.snapshot()),
        handlers: operator.then(|| s.handlers.clone()),
    }))
}

pub(super) async fn metrics(State(s): ApiState) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
