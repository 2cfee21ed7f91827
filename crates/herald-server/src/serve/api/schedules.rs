//! Schedules: `/v1/tenants/{tenant}/schedules…` and `GET /v1/schedules`
//! (docs/schedules.md).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald::schedule::{Cadence, Schedule, ScheduleDef, ScheduleError, ScheduleSource, NEVER};
use herald::Millis;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ApiState;
use crate::config::parse_duration;
use crate::serve::auth::Caller;
use crate::serve::error::{ApiError, JsonBody, PathParams};

/// A schedule as written to the API. `name` only in `POST`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleBody {
    #[serde(default)]
    name: Option<String>,
    handler: String,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    every: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    missed: Option<String>,
    #[serde(default)]
    missed_cap: Option<i64>,
}

/// A schedule as the API shows it.
#[derive(Serialize)]
pub struct ScheduleView {
    tenant: String,
    name: String,
    handler: String,
    cron: Option<String>,
    every: Option<String>,
    every_ms: Option<u64>,
    timezone: String,
    payload: Box<RawValue>,
    max_attempts: u32,
    missed: &'static str,
    missed_cap: Option<i64>,
    paused: bool,
    source: &'static str,
    /// The next occurrence not yet emitted, in ms; `null` when none is left.
    next_at: Option<i64>,
    /// The same in the schedule's zone, RFC 3339.
    next_at_local: Option<String>,
    last_occurrence: Option<i64>,
    last_occurrence_local: Option<String>,
    last_event_id: Option<String>,
}

impl ScheduleView {
    /// The view of `s`.
    pub fn of(s: &Schedule) -> Self {
        let (cron, every_ms) = s.cadence.columns();
        let (missed, missed_cap) = s.missed.columns();
        let every = match &s.cadence {
            Cadence::Every(d) => Some(humantime::format_duration(*d).to_string()),
            Cadence::Cron(_) => None,
        };
        ScheduleView {
            tenant: s.tenant.clone(),
            name: s.name.clone(),
            handler: s.handler.clone(),
            cron: cron.map(str::to_string),
            every,
            every_ms: every_ms.map(|ms| ms as u64),
            timezone: s.timezone.name().to_string(),
            payload: RawValue::from_string(s.payload.clone())
                .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON")),
            max_attempts: s.max_attempts,
            missed,
            missed_cap,
            paused: s.paused,
            source: s.source.as_str(),
            next_at: (s.next_at != NEVER).then_some(s.next_at.0),
            next_at_local: s.local_time(s.next_at),
            last_occurrence: s.last.map(|l| l.occurrence.0),
            last_occurrence_local: s.last.and_then(|l| s.local_time(l.occurrence)),
            last_event_id: s.last.map(|l| l.event_id.to_string()),
        }
    }
}

fn invalid(e: ScheduleError) -> ApiError {
    ApiError::invalid("invalid_schedule", e.to_string())
}

fn no_schedule(tenant: &str, name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "schedule_not_found",
        format!("tenant {tenant:?} has no schedule {name:?}; GET /v1/tenants/{tenant}/schedules lists them"),
    )
}

fn names(tenant: &str, name: &str) -> Result<(), ApiError> {
    herald::client::check_name("tenant", tenant)?;
    herald::client::check_name("name", name)?;
    Ok(())
}

impl ScheduleBody {
    fn into_def(self, tenant: String, name: String) -> Result<ScheduleDef, ApiError> {
        let every: Option<Duration> = match self.every {
            None => None,
            Some(text) => Some(
                parse_duration(&text)
                    .map_err(|m| ApiError::invalid("invalid_schedule", format!("every: {m}")))?,
            ),
        };
        Ok(ScheduleDef {
            cron: self.cron,
            every,
            timezone: self.timezone,
            payload: self.payload.map(|p| p.get().to_string()),
            max_attempts: self.max_attempts,
            missed: self.missed,
            missed_cap: self.missed_cap,
            ..ScheduleDef::new(tenant, name, self.handler, ScheduleSource::Api)
        })
    }
}

async fn store_def(
    s: &super::AppState,
    def: ScheduleDef,
    must_be_new: bool,
) -> Result<Response, ApiError> {
    let store = s.schedules.as_ref();
    // Checked before the store is read, so that a bad definition is a 400
    // whatever the store does; then built again from the store's clock,
    // which judges its occurrences: the first is the first after the
    // store's now, however this process's clock is off.
    def.build(Millis::now(), s.client.payload_limit())
        .map_err(invalid)?;
    let schedule = def
        .build(store.clock().await?, s.client.payload_limit())
        .map_err(invalid)?;
    if must_be_new && store.schedule(&def.tenant, &def.name).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "schedule_exists",
            format!(
                "tenant {:?} already has a schedule {:?}; PUT /v1/tenants/{}/schedules/{} replaces it",
                def.tenant, def.name, def.tenant, def.name
            ),
        ));
    }
    let created = store.put_schedule(&schedule).await?;
    let stored = store
        .schedule(&def.tenant, &def.name)
        .await?
        .ok_or_else(|| no_schedule(&def.tenant, &def.name))?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(ScheduleView::of(&stored))).into_response())
}

pub(super) async fn create_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams(tenant): PathParams<String>,
    JsonBody(body): JsonBody<ScheduleBody>,
) -> Result<Response, ApiError> {
    let Some(name) = body.name.clone() else {
        return Err(ApiError::invalid(
            "invalid_schedule",
            "name: the body needs the schedule's name",
        ));
    };
    names(&tenant, &name)?;
    caller.may_act_for(&tenant)?;
    let def = body.into_def(tenant, name)?;
    store_def(&s, def, true).await
}

pub(super) async fn put_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, name)): PathParams<(String, String)>,
    JsonBody(body): JsonBody<ScheduleBody>,
) -> Result<Response, ApiError> {
    names(&tenant, &name)?;
    caller.may_act_for(&tenant)?;
    if body.name.as_ref().is_some_and(|n| *n != name) {
        return Err(ApiError::invalid(
            "invalid_schedule",
            "name: the body names another schedule than the path; leave it out",
        ));
    }
    let def = body.into_def(tenant, name)?;
    store_def(&s, def, false).await
}

pub(super) async fn show_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, name)): PathParams<(String, String)>,
) -> Result<Json<ScheduleView>, ApiError> {
    names(&tenant, &name)?;
    caller.may_act_for(&tenant)?;
    let found = s.schedules.schedule(&tenant, &name).await?;
    found
        .map(|sch| Json(ScheduleView::of(&sch)))
        .ok_or_else(|| no_schedule(&tenant, &name))
}

pub(super) async fn delete_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, name)): PathParams<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    names(&tenant, &name)?;
    caller.may_act_for(&tenant)?;
    if !s.schedules.delete_schedule(&tenant, &name).await? {
        return Err(no_schedule(&tenant, &name));
    }
    Ok(Json(serde_json::json!({ "deleted": true })))
}

async fn set_paused(
    s: &super::AppState,
    caller: &Caller,
    tenant: &str,
    name: &str,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    names(tenant, name)?;
    caller.may_act_for(tenant)?;
    let store = s.schedules.as_ref();
    if !store.pause_schedule(tenant, name, paused).await? {
        return Err(no_schedule(tenant, name));
    }
    let found = store.schedule(tenant, name).await?;
    found
        .map(|sch| Json(ScheduleView::of(&sch)))
        .ok_or_else(|| no_schedule(tenant, name))
}

pub(super) async fn pause_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, name)): PathParams<(String, String)>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&s, &caller, &tenant, &name, true).await
}

pub(super) async fn resume_schedule(
    State(s): ApiState,
    caller: Caller,
    PathParams((tenant, name)): PathParams<(String, String)>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&s, &caller, &tenant, &name, false).await
}

pub(super) async fn tenant_schedules(
    State(s): ApiState,
    caller: Caller,
    PathParams(tenant): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    herald::client::check_name("tenant", &tenant)?;
    caller.may_act_for(&tenant)?;
    let all = s.schedules.schedules(Some(&tenant)).await?;
    let views: Vec<ScheduleView> = all.iter().map(ScheduleView::of).collect();
    Ok(Json(serde_json::json!({ "schedules": views })))
}

pub(super) async fn all_schedules(
    State(s): ApiState,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let all = s.schedules.schedules(caller.tenant()).await?;
    let views: Vec<ScheduleView> = all.iter().map(ScheduleView::of).collect();
    Ok(Json(serde_json::json!({ "schedules": views })))
}
