//! Topics (fan-out): `POST /v1/tenants/{tenant}/topics/{topic}/events`,
//! the subscribers of a topic, and `GET /v1/topics`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald::{Subscription, TopicEmitted};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::emit::EmitResult;
use super::ApiState;
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, JsonBody, PathParams};

/// One topic emit: a single emit's body without tenant and handler (the
/// path has the tenant; the subscriptions give the handlers).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TopicEmitBody {
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

/// One subscriber's copy as the API shows it.
#[derive(Serialize)]
struct CopyView {
    handler: String,
    #[serde(flatten)]
    result: EmitResult,
}

fn topic_view(out: TopicEmitted) -> serde_json::Value {
    let events: Vec<CopyView> = out
        .events
        .into_iter()
        .map(|e| CopyView {
            handler: e.handler,
            result: EmitResult::from(e.emitted),
        })
        .collect();
    serde_json::json!({ "topic": out.topic, "events": events })
}

pub(super) async fn emit_topic(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, topic)): PathParams<(String, String)>,
    JsonBody(body): JsonBody<TopicEmitBody>,
) -> Result<Response, ApiError> {
    herald::client::check_name("tenant", &tenant)?;
    herald::client::check_name("topic", &topic)?;
    caller.may_act_for(&tenant)?;
    let options = super::emit::emit_options(
        body.delay,
        body.run_at,
        body.max_attempts,
        body.idempotency_key,
        body.concurrency_key,
        body.singleton,
    )?;
    let out = s
        .client
        .emit_topic_json(&tenant, &topic, body.payload.get(), options)
        .await?;
    let created = out
        .events
        .iter()
        .any(|e| matches!(e.emitted, herald::Emitted::Created(_)));
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(topic_view(out))).into_response())
}

/// `GET /v1/topics`: every subscription (a tenant token sees every
/// tenant's and its own).
pub(super) async fn list_topics(
    State(s): ApiState,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut subscriptions = s.client.subscriptions(None).await?;
    if let Some(own) = caller.tenant() {
        subscriptions.retain(|x| x.tenant.as_deref().is_none_or(|t| t == own));
    }
    Ok(Json(serde_json::json!({ "subscriptions": subscriptions })))
}

/// `GET /v1/tenants/{tenant}/topics/{topic}/subscribers`: the handlers an
/// emit would store an event for, with the subscriptions behind them.
pub(super) async fn tenant_subscribers(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, topic)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    herald::client::check_name("tenant", &tenant)?;
    caller.may_act_for(&tenant)?;
    let handlers = s.client.subscribers(&tenant, &topic).await?;
    let mut subscriptions = s.client.subscriptions(Some(&topic)).await?;
    subscriptions.retain(|x| x.tenant.as_deref().is_none_or(|t| t == tenant));
    Ok(Json(serde_json::json!({
        "tenant": tenant,
        "topic": topic,
        "handlers": handlers,
        "subscriptions": subscriptions,
    })))
}

async fn change(
    s: &super::AppState,
    subscription: Subscription,
    add: bool,
) -> Result<Json<serde_json::Value>, ApiError> {
    if add {
        let added = s.client.subscribe(&subscription).await?;
        Ok(Json(serde_json::json!({ "added": added })))
    } else {
        let removed = s.client.unsubscribe(&subscription).await?;
        Ok(Json(serde_json::json!({ "removed": removed })))
    }
}

/// `PUT /v1/topics/{topic}/subscribers/{handler}`: for every tenant
/// (operator only).
pub(super) async fn subscribe_all(
    State(s): ApiState,
    caller: Caller,
    PathParams((topic, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.must_be_operator_or(
        "subscribe a handler for every tenant",
        "a tenant changes its own under /v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}",
    )?;
    change(&s, Subscription::every_tenant(topic, handler), true).await
}

/// `DELETE /v1/topics/{topic}/subscribers/{handler}`.
pub(super) async fn unsubscribe_all(
    State(s): ApiState,
    caller: Caller,
    PathParams((topic, handler)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.must_be_operator_or(
        "unsubscribe a handler of every tenant",
        "a tenant changes its own under /v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}",
    )?;
    change(&s, Subscription::every_tenant(topic, handler), false).await
}

/// `PUT /v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}`.
pub(super) async fn subscribe_tenant(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, topic, handler)): PathParams<(String, String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    herald::client::check_name("tenant", &tenant)?;
    caller.may_act_for(&tenant)?;
    change(&s, Subscription::for_tenant(tenant, topic, handler), true).await
}

/// `DELETE /v1/tenants/{tenant}/topics/{topic}/subscribers/{handler}`.
pub(super) async fn unsubscribe_tenant(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, topic, handler)): PathParams<(String, String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    herald::client::check_name("tenant", &tenant)?;
    caller.may_act_for(&tenant)?;
    change(&s, Subscription::for_tenant(tenant, topic, handler), false).await
}
