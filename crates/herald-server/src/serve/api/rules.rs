//! Pause and block: `/v1/tenants/{tenant}/handlers/{handler}/…` and `GET /v1/rules`.

use axum::extract::State;
use axum::Json;
use herald::RuleMatch;
use serde::Serialize;

use super::ApiState;
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, PathParams};

fn names(tenant: &str, handler: &str) -> Result<(), ApiError> {
    herald::client::check_name("tenant", tenant)?;
    herald::client::check_name("handler", handler)?;
    Ok(())
}

#[derive(Serialize)]
pub(super) struct Held {
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

pub(super) async fn pause(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.may_act_for(&tenant)?;
    let added = s.client.pause(&tenant, &handler).await?;
    Ok(Json(serde_json::json!({ "added": added })))
}

pub(super) async fn unpause(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.may_act_for(&tenant)?;
    Ok(release(s.client.unpause(&tenant, &handler).await?))
}

pub(super) async fn block(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.must_be_operator("block")?;
    let added = s.client.block(&tenant, &handler).await?;
    Ok(Json(serde_json::json!({ "added": added })))
}

pub(super) async fn unblock(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &handler)?;
    caller.must_be_operator("unblock")?;
    Ok(release(s.client.unblock(&tenant, &handler).await?))
}

pub(super) async fn rules(
    State(s): ApiState,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut rules = s.client.rules().await?;
    if let Some(own) = caller.tenant() {
        rules.retain(|r| r.tenant == own);
    }
    Ok(Json(serde_json::json!({ "rules": rules })))
}
