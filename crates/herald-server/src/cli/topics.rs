//! `herald topics emit|list|subscribers|subscribe|unsubscribe`: fan-out
//! topics on a running server.

use reqwest::Method;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::emit::{parse_payload, read_payload};
use super::{exit, print, table, text, unexpected, Api, Failure, Remote};

/// Emit to topics and manage their subscribers.
#[derive(clap::Subcommand, Debug)]
pub enum TopicsCommand {
    /// Emit to a topic: one event per subscribed handler, all or none;
    /// prints each handler's event id. No subscriber is an error.
    Emit(EmitArgs),
    /// List every subscription (a tenant token sees every tenant's and its own).
    List(ListArgs),
    /// The handlers an emit to TOPIC for TENANT stores an event for.
    Subscribers(SubscribersArgs),
    /// Subscribe HANDLER to TOPIC, for --tenant or (operator token) every tenant.
    Subscribe(SubscriptionArgs),
    /// Remove a subscription; events already stored stay.
    Unsubscribe(SubscriptionArgs),
}

/// `herald topics emit`.
#[derive(clap::Args, Debug)]
pub struct EmitArgs {
    /// The tenant the events belong to.
    pub tenant: String,
    /// The topic ("user.signup").
    pub topic: String,
    /// The payload, as JSON; `-` reads it from stdin. Default `{}`.
    #[arg(value_name = "PAYLOAD|-")]
    pub payload: Option<String>,
    /// Run them no sooner than this from now: "500ms", "30s", "5m".
    #[arg(long, value_name = "DURATION")]
    pub delay: Option<String>,
    /// Attempts before each goes dead (the server's default: 10).
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// Idempotency key, applied to each copy on its own.
    #[arg(long, value_name = "IDEMPOTENCY_KEY")]
    pub key: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// `herald topics list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// `herald topics subscribers`.
#[derive(clap::Args, Debug)]
pub struct SubscribersArgs {
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// `herald topics subscribe|unsubscribe`.
#[derive(clap::Args, Debug)]
pub struct SubscriptionArgs {
    /// The topic.
    pub topic: String,
    /// The handler that gets a copy of each event emitted to it.
    pub handler: String,
    /// Only for this tenant; left out, for every tenant (operator token).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Serialize)]
struct Body<'a> {
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
}

/// Runs a `topics` subcommand.
pub async fn run(command: TopicsCommand) -> Result<(), Failure> {
    match command {
        TopicsCommand::Emit(args) => emit(args).await,
        TopicsCommand::List(args) => list(args).await,
        TopicsCommand::Subscribers(args) => subscribers(args).await,
        TopicsCommand::Subscribe(args) => change(args, true).await,
        TopicsCommand::Unsubscribe(args) => change(args, false).await,
    }
}

async fn emit(args: EmitArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let text_payload = read_payload(args.payload.as_deref())?;
    let body = Body {
        payload: parse_payload(&text_payload)?,
        delay: args.delay.as_deref(),
        max_attempts: args.max_attempts,
        idempotency_key: args.key.as_deref(),
    };
    let body = serde_json::to_string(&body)
        .map_err(|e| Failure::new(exit::OTHER, format!("cannot encode the request: {e}")))?;
    let segments = [
        "v1",
        "tenants",
        &args.tenant,
        "topics",
        &args.topic,
        "events",
    ];
    let reply = api.call(Method::POST, &segments, &[], Some(body)).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let events = reply.value["events"]
        .as_array()
        .ok_or_else(|| unexpected("events", &reply))?;
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let mut id = text(&e["id"]);
            if e["created"] == Value::Bool(false) {
                id.push_str(" existing");
            }
            vec![text(&e["handler"]), id]
        })
        .collect();
    print(&table(&["HANDLER", "ID"], &rows));
    Ok(())
}

fn subscription_rows(v: &Value) -> Vec<Vec<String>> {
    v.as_array()
        .map(|subs| {
            subs.iter()
                .map(|s| {
                    let tenant = if s["tenant"].is_null() {
                        "*".to_string()
                    } else {
                        text(&s["tenant"])
                    };
                    vec![text(&s["topic"]), tenant, text(&s["handler"])]
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let reply = api.call(Method::GET, &["v1", "topics"], &[], None).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    if !reply.value["subscriptions"].is_array() {
        return Err(unexpected("subscriptions", &reply));
    }
    let rows = subscription_rows(&reply.value["subscriptions"]);
    print(&table(&["TOPIC", "TENANT", "HANDLER"], &rows));
    Ok(())
}

async fn subscribers(args: SubscribersArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let segments = [
        "v1",
        "tenants",
        &args.tenant,
        "topics",
        &args.topic,
        "subscribers",
    ];
    let reply = api.call(Method::GET, &segments, &[], None).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let handlers = reply.value["handlers"]
        .as_array()
        .ok_or_else(|| unexpected("handlers", &reply))?;
    if handlers.is_empty() {
        print(&format!(
            "{}/{}: no subscribers (an emit would be refused)",
            args.tenant, args.topic
        ));
        return Ok(());
    }
    let names: Vec<String> = handlers.iter().map(text).collect();
    print(&names.join("\n"));
    Ok(())
}

async fn change(args: SubscriptionArgs, add: bool) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let mut segments: Vec<&str> = vec!["v1"];
    if let Some(tenant) = &args.tenant {
        segments.extend(["tenants", tenant.as_str()]);
    }
    segments.extend(["topics", &args.topic, "subscribers", &args.handler]);
    let method = if add { Method::PUT } else { Method::DELETE };
    let reply = api.call(method, &segments, &[], None).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let scope = args.tenant.as_deref().unwrap_or("every tenant");
    let what = format!("{} -> {} ({scope})", args.topic, args.handler);
    let yes = |key: &str| reply.value[key] == Value::Bool(true);
    let out = match (add, yes("added"), yes("removed")) {
        (true, true, _) => format!("{what}: subscribed"),
        (true, false, _) => format!("{what}: already subscribed"),
        (false, _, true) => format!("{what}: unsubscribed"),
        (false, _, false) => format!("{what}: was not subscribed"),
    };
    print(&out);
    Ok(())
}
