//! `herald events ls|show|retry|rm`.

use reqwest::Method;
use serde_json::{json, Value};

use super::{cell, print, table, text, unexpected, Api, Failure, Remote};

/// List, show, retry and delete events.
#[derive(clap::Subcommand, Debug)]
pub enum EventsCommand {
    /// List events in id order (oldest first), a page at a time.
    Ls(LsArgs),
    /// Show one event, payload, last error and error history included.
    Show(IdArgs),
    /// Make a dead event pending again, its attempts reset.
    Retry(IdArgs),
    /// Delete an event (refused while it runs).
    Rm(IdArgs),
}

/// The event states `ls --state` takes.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum StateArg {
    /// Waiting or running.
    Pending,
    /// Out of attempts, or failed for good.
    Dead,
    /// Finished (kept only with done_retention).
    Done,
}

impl StateArg {
    fn as_str(self) -> &'static str {
        match self {
            StateArg::Pending => "pending",
            StateArg::Dead => "dead",
            StateArg::Done => "done",
        }
    }
}

/// `herald events ls`.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Only this tenant's events (a tenant token lists its own by default).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this handler's events.
    #[arg(long)]
    pub handler: Option<String>,
    /// Only events in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Events per page, 1 to 1000 (the server's default: 100).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Start after this event id (the `next` cursor of the previous page).
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
    /// Follow the cursor to the last page; with --json, prints one
    /// document `{"events": [all of them], "next": null}`.
    #[arg(long)]
    pub all: bool,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// One event id.
#[derive(clap::Args, Debug)]
pub struct IdArgs {
    /// The event's id (a UUID, as printed by `herald emit`).
    pub id: String,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// Runs an `events` subcommand.
pub async fn run(command: EventsCommand) -> Result<(), Failure> {
    match command {
        EventsCommand::Ls(args) => ls(args).await,
        EventsCommand::Show(args) => show(args).await,
        EventsCommand::Retry(args) => retry(args).await,
        EventsCommand::Rm(args) => rm(args).await,
    }
}

async fn ls(args: LsArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(t) = &args.tenant {
        query.push(("tenant", t.clone()));
    }
    if let Some(h) = &args.handler {
        query.push(("handler", h.clone()));
    }
    if let Some(s) = args.state {
        query.push(("state", s.as_str().to_string()));
    }
    if let Some(n) = args.limit {
        query.push(("limit", n.to_string()));
    }
    let mut after = args.after.clone();
    let mut events: Vec<Value> = Vec::new();
    let next = loop {
        let mut q = query.clone();
        if let Some(a) = &after {
            q.push(("after", a.clone()));
        }
        let reply = api.call(Method::GET, &["v1", "events"], &q, None).await?;
        if args.remote.json && !args.all {
            print(&reply.text);
            return Ok(());
        }
        let page = reply.value["events"]
            .as_array()
            .ok_or_else(|| unexpected("events", &reply))?;
        events.extend(page.iter().cloned());
        let next = reply.value["next"].as_str().map(str::to_string);
        match next {
            Some(n) if args.all => after = Some(n),
            other => break other,
        }
    };
    if args.remote.json {
        print(&json!({ "events": events, "next": null }).to_string());
        return Ok(());
    }
    let rows: Vec<Vec<String>> = events.iter().map(row).collect();
    print(&table(
        &[
            "ID",
            "TENANT",
            "HANDLER",
            "STATE",
            "ATTEMPT",
            "RUN_AT",
            "LAST_ERROR",
        ],
        &rows,
    ));
    if let Some(next) = next {
        eprintln!("more events: pass --after {next} for the next page, or --all");
    }
    Ok(())
}

fn state(e: &Value) -> String {
    let s = text(&e["state"]);
    if e["running"] == Value::Bool(true) {
        format!("{s} (running)")
    } else {
        s
    }
}

fn row(e: &Value) -> Vec<String> {
    vec![
        text(&e["id"]),
        cell(&text(&e["tenant"]), 30),
        cell(&text(&e["handler"]), 30),
        state(e),
        format!("{}/{}", text(&e["attempt"]), text(&e["max_attempts"])),
        text(&e["run_at"]),
        if e["last_error"].is_null() {
            String::new()
        } else {
            cell(&text(&e["last_error"]), 60)
        },
    ]
}

async fn show(args: IdArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let reply = api
        .call(Method::GET, &["v1", "events", &args.id], &[], None)
        .await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let e = &reply.value;
    if !e.is_object() {
        return Err(unexpected("event", &reply));
    }
    let mut lines = vec![
        ("id", text(&e["id"])),
        ("tenant", text(&e["tenant"])),
        ("handler", text(&e["handler"])),
        ("state", state(e)),
        (
            "attempt",
            format!("{} of {}", text(&e["attempt"]), text(&e["max_attempts"])),
        ),
        ("run_at", text(&e["run_at"])),
    ];
    if !e["lease_expires_at"].is_null() {
        lines.push(("lease_expires_at", text(&e["lease_expires_at"])));
    }
    if !e["idempotency_key"].is_null() {
        lines.push(("idempotency_key", text(&e["idempotency_key"])));
    }
    if !e["concurrency_key"].is_null() {
        lines.push(("concurrency_key", text(&e["concurrency_key"])));
    }
    if !e["rate_limited_until"].is_null() {
        lines.push(("rate_limited_until", text(&e["rate_limited_until"])));
    }
    if !e["waiting_for"].is_null() {
        lines.push(("waiting_for", text(&e["waiting_for"]["reason"])));
    }
    if !e["topic"].is_null() {
        lines.push(("topic", text(&e["topic"])));
    }
    lines.push(("created_at", text(&e["created_at"])));
    lines.push(("updated_at", text(&e["updated_at"])));
    lines.push(("last_error", text(&e["last_error"])));
    lines.push(("errors", errors(&e["errors"])));
    lines.push(("payload", e["payload"].to_string()));
    let mut out = String::new();
    for (k, v) in lines {
        // Multi-line errors: indent their continuation lines under the value.
        let v = v.replace('\n', &format!("\n{:18}", ""));
        out.push_str(&format!("{k:<18}{v}\n"));
    }
    print(&out);
    Ok(())
}

/// The error history of `GET /v1/events/{id}`, one failed attempt a line,
/// oldest first: `attempt N at TIME: ERROR`.
fn errors(history: &Value) -> String {
    let Some(history) = history.as_array().filter(|h| !h.is_empty()) else {
        return "none".into();
    };
    history
        .iter()
        .map(|h| {
            format!(
                "attempt {} at {}: {}",
                text(&h["attempt"]),
                text(&h["at"]),
                text(&h["error"])
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn retry(args: IdArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let reply = api
        .call(
            Method::POST,
            &["v1", "events", &args.id, "retry"],
            &[],
            None,
        )
        .await?;
    if args.remote.json {
        print(&reply.text);
    } else {
        print(&format!(
            "{}: {} again",
            text(&reply.value["id"]),
            text(&reply.value["state"])
        ));
    }
    Ok(())
}

async fn rm(args: IdArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let reply = api
        .call(Method::DELETE, &["v1", "events", &args.id], &[], None)
        .await?;
    if args.remote.json {
        print(&reply.text);
    } else {
        print(&format!("{}: deleted", text(&reply.value["id"])));
    }
    Ok(())
}
