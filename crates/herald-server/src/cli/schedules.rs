//! `herald schedules ls|add|pause|resume|rm` (docs/schedules.md).

use reqwest::Method;
use serde_json::{json, Value};

use super::{cell, print, table, text, unexpected, Api, Failure, Remote};

/// List, add, pause, resume and delete schedules.
#[derive(clap::Subcommand, Debug)]
pub enum SchedulesCommand {
    /// List schedules with their next occurrence and last emitted event.
    #[command(alias = "list")]
    Ls(ListArgs),
    /// Create or replace a schedule (`PUT`): the same cadence and zone keep
    /// its cursor.
    Add(AddArgs),
    /// Pause a schedule: it emits nothing until resumed.
    Pause(NameArgs),
    /// Resume a schedule; occurrences that passed meanwhile follow its
    /// missed policy.
    Resume(NameArgs),
    /// Delete a schedule (not the events it emitted).
    #[command(alias = "delete")]
    Rm(NameArgs),
}

/// `herald schedules ls`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this tenant's (a tenant token lists its own).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// One schedule.
#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The tenant.
    pub tenant: String,
    /// The schedule's name.
    pub name: String,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// `herald schedules add`.
#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The tenant.
    pub tenant: String,
    /// The schedule's name, unique per tenant.
    pub name: String,
    /// The events' handler.
    #[arg(long)]
    pub handler: String,
    /// A cron expression (5 or 6 fields, or `@hourly`…), read in --timezone.
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    pub cron: Option<String>,
    /// An interval instead: `30s`, `5m`, … (multiples of it since the epoch).
    #[arg(long)]
    pub every: Option<String>,
    /// An IANA zone [default: UTC].
    #[arg(long)]
    pub timezone: Option<String>,
    /// The events' payload, JSON [default: null].
    #[arg(long)]
    pub payload: Option<String>,
    /// The events' attempts [default: 10].
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Missed occurrences: skip, once (the latest; the default) or each.
    #[arg(long)]
    pub missed: Option<String>,
    /// With `--missed each`: at most this many, the most recent.
    #[arg(long)]
    pub missed_cap: Option<i64>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// Runs a `herald schedules` command.
pub async fn run(command: SchedulesCommand) -> Result<(), Failure> {
    match command {
        SchedulesCommand::Ls(a) => list(a).await,
        SchedulesCommand::Add(a) => add(a).await,
        SchedulesCommand::Pause(a) => one(a, Method::POST, Some("pause")).await,
        SchedulesCommand::Resume(a) => one(a, Method::POST, Some("resume")).await,
        SchedulesCommand::Rm(a) => one(a, Method::DELETE, None).await,
    }
}

/// The table of schedules: cadence, next occurrence and last event.
pub fn schedule_table(schedules: &[Value]) -> String {
    let rows: Vec<Vec<String>> = schedules
        .iter()
        .map(|s| {
            let cadence = match (&s["cron"], &s["every"]) {
                (Value::String(c), _) => format!("cron {c}"),
                (_, Value::String(e)) => format!("every {e}"),
                _ => "-".into(),
            };
            let state = if s["paused"] == Value::Bool(true) {
                "paused"
            } else {
                "active"
            };
            vec![
                cell(&text(&s["tenant"]), 30),
                cell(&text(&s["name"]), 40),
                cell(&text(&s["handler"]), 30),
                cell(&cadence, 40),
                text(&s["timezone"]),
                state.to_string(),
                text(&s["next_at_local"]),
                text(&s["last_occurrence_local"]),
                text(&s["last_event_id"]),
            ]
        })
        .collect();
    table(
        &[
            "TENANT",
            "NAME",
            "HANDLER",
            "CADENCE",
            "ZONE",
            "STATE",
            "NEXT",
            "LAST",
            "LAST EVENT",
        ],
        &rows,
    )
}

async fn list(a: ListArgs) -> Result<(), Failure> {
    let api = Api::new(&a.remote)?;
    let reply = match &a.tenant {
        Some(t) => {
            api.call(Method::GET, &["v1", "tenants", t, "schedules"], &[], None)
                .await?
        }
        None => {
            api.call(Method::GET, &["v1", "schedules"], &[], None)
                .await?
        }
    };
    if a.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let Some(all) = reply.value["schedules"].as_array() else {
        return Err(unexpected("schedules", &reply));
    };
    if all.is_empty() {
        print("no schedules");
    } else {
        print(&schedule_table(all));
    }
    Ok(())
}

async fn add(a: AddArgs) -> Result<(), Failure> {
    let api = Api::new(&a.remote)?;
    let payload: Option<Value> = match &a.payload {
        None => None,
        Some(p) => Some(serde_json::from_str(p).map_err(|e| {
            Failure::new(super::exit::USAGE, format!("--payload is not JSON: {e}"))
        })?),
    };
    let mut body = json!({ "handler": a.handler });
    let fields: [(&str, Option<Value>); 7] = [
        ("cron", a.cron.map(Value::from)),
        ("every", a.every.map(Value::from)),
        ("timezone", a.timezone.map(Value::from)),
        ("payload", payload),
        ("max_attempts", a.max_attempts.map(Value::from)),
        ("missed", a.missed.map(Value::from)),
        ("missed_cap", a.missed_cap.map(Value::from)),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            body[k] = v;
        }
    }
    let reply = api
        .call(
            Method::PUT,
            &["v1", "tenants", &a.tenant, "schedules", &a.name],
            &[],
            Some(body.to_string()),
        )
        .await?;
    if a.remote.json {
        print(&reply.text);
    } else {
        print(&schedule_table(std::slice::from_ref(&reply.value)));
    }
    Ok(())
}

async fn one(a: NameArgs, method: Method, verb: Option<&str>) -> Result<(), Failure> {
    let api = Api::new(&a.remote)?;
    let mut segments = vec!["v1", "tenants", &a.tenant, "schedules", &a.name];
    if let Some(v) = verb {
        segments.push(v);
    }
    let reply = api.call(method, &segments, &[], None).await?;
    if a.remote.json {
        print(&reply.text);
    } else if verb.is_none() {
        print(&format!("{}/{}: deleted", a.tenant, a.name));
    } else {
        print(&schedule_table(std::slice::from_ref(&reply.value)));
    }
    Ok(())
}
