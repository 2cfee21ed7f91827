//! Limits: `GET`, `PUT` and `DELETE /v1/limits`: runs at once
//! (`running`) and starts per period (`rate`).
//!
//! A limit is named by its handler and what it counts (`per`): every run
//! of the handler (`handler`), each tenant's (`tenant`, with `tenant` for
//! one tenant's own limit, without it the default of every tenant), each
//! concurrency key's (`key`, with `tenant` and `key` for one key's own,
//! without both the default of every key). A tenant's token may set and
//! remove the limits that name its own tenant; the others are the
//! operator's.

use axum::extract::State;
use axum::Json;
use herald::{Limit, LimitKind, LimitScope, StoredLimit, TenantKey};
use serde::{Deserialize, Serialize};

use super::ApiState;
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, JsonBody, QueryParams};

/// A limit's name: its handler and scope, as the API writes them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitName {
    handler: String,
    per: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// `PUT /v1/limits`: a limit's name and its number.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitBody {
    handler: String,
    per: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    running: Option<u32>,
    #[serde(default)]
    rate: Option<RateBody>,
}

/// A rate as the API writes it: `{"starts": 10, "period": "1s", "burst": 5}`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateBody {
    starts: u32,
    period: String,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    burst: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// A stored limit as the API shows it.
#[derive(Serialize)]
pub(super) struct LimitView {
    handler: String,
    per: LimitKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    running: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<RateBody>,
    source: herald::LimitSource,
}

impl From<StoredLimit> for LimitView {
    fn from(l: StoredLimit) -> Self {
        let (tenant, key) = l.limit.scope.names();
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        LimitView {
            per: l.limit.scope.kind(),
            tenant: some(tenant),
            key: some(key),
            handler: l.limit.handler,
            running: l.limit.running,
            rate: l.limit.rate.map(|r| RateBody {
                starts: r.starts,
                period: humantime::format_duration(r.period).to_string(),
                burst: r.burst,
            }),
            source: l.source,
        }
    }
}

impl LimitName {
    /// The scope named, checked; and whether a tenant's token may act on it.
    fn scope(&self, caller: &Caller) -> Result<LimitScope, ApiError> {
        herald::client::check_name("handler", &self.handler)?;
        let kind = LimitKind::parse(&self.per).ok_or_else(|| {
            ApiError::invalid(
                "invalid_limit",
                format!(
                    "per \"{}\": expected \"handler\", \"tenant\" or \"key\"",
                    herald::escape::escaped(&self.per)
                ),
            )
        })?;
        let scope = match (kind, self.tenant.clone(), self.key.clone()) {
            (LimitKind::Handler, None, None) => LimitScope::Handler,
            (LimitKind::Tenant, tenant, None) => LimitScope::Tenant { tenant },
            (LimitKind::Key, None, None) => LimitScope::Key { key: None },
            (LimitKind::Key, Some(tenant), Some(key)) => LimitScope::Key {
                key: Some(TenantKey { tenant, key }),
            },
            _ => {
                return Err(ApiError::invalid(
                    "invalid_limit",
                    "per \"handler\" takes neither tenant nor key; per \"tenant\" takes a \
                     tenant or none (every tenant); per \"key\" takes a tenant and a key, or \
                     neither (every key)",
                ))
            }
        };
        match scope.names().0 {
            "" => caller.must_be_operator("set or remove a limit of every tenant")?,
            tenant => {
                herald::client::check_name("tenant", tenant)?;
                caller.may_act_for(tenant)?;
            }
        }
        Ok(scope)
    }
}

pub(super) async fn put_limit(
    State(s): ApiState,
    caller: Caller,
    JsonBody(body): JsonBody<LimitBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let name = LimitName {
        handler: body.handler,
        per: body.per,
        tenant: body.tenant,
        key: body.key,
    };
    let scope = name.scope(&caller)?;
    let rate = match body.rate {
        None => None,
        Some(r) => Some(
            crate::config::parse_rate(&format!("{}/{}", r.starts, r.period), Some(r.burst))
                .map_err(|m| {
                    ApiError::invalid("invalid_limit", herald::escape::escaped(&m).to_string())
                })?,
        ),
    };
    let limit = Limit {
        handler: name.handler,
        scope,
        running: body.running,
        rate,
    };
    limit
        .check()
        .map_err(|m| ApiError::invalid("invalid_limit", m))?;
    let changed = s.client.set_limit(&limit).await?;
    Ok(Json(serde_json::json!({ "changed": changed })))
}

pub(super) async fn delete_limit(
    State(s): ApiState,
    caller: Caller,
    QueryParams(name): QueryParams<LimitName>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let scope = name.scope(&caller)?;
    let removed = s.client.remove_limit(&name.handler, &scope).await?;
    Ok(Json(serde_json::json!({ "removed": removed })))
}

/// `GET /v1/limits?handler=`: a tenant's token sees the defaults and its
/// own tenant's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsQuery {
    #[serde(default)]
    handler: Option<String>,
}

pub(super) async fn limits(
    State(s): ApiState,
    caller: Caller,
    QueryParams(q): QueryParams<LimitsQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(h) = &q.handler {
        herald::client::check_name("handler", h)?;
    }
    let mut limits = s.client.limits(q.handler.as_deref()).await?;
    if let Some(own) = caller.tenant() {
        limits.retain(|l| matches!(l.limit.scope.names().0, "") || l.limit.scope.names().0 == own);
    }
    let views: Vec<LimitView> = limits.into_iter().map(LimitView::from).collect();
    Ok(Json(serde_json::json!({ "limits": views })))
}
