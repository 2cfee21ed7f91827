//! `herald emit TENANT HANDLER [PAYLOAD|-]`.

use std::io::Read;

use reqwest::Method;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{exit, print, unexpected, Api, Failure, Remote};

/// Emit one event.
#[derive(clap::Args, Debug)]
pub struct EmitArgs {
    /// The tenant the event belongs to.
    pub tenant: String,
    /// The handler that runs it.
    pub handler: String,
    /// The payload, as JSON; `-` reads it from stdin. Default `{}`.
    #[arg(value_name = "PAYLOAD|-")]
    pub payload: Option<String>,
    /// Run it no sooner than this from now: "500ms", "30s", "5m", "1h 30m".
    #[arg(long, value_name = "DURATION", conflicts_with = "run_at")]
    pub delay: Option<String>,
    /// Run it no sooner than this time, RFC 3339: "2026-12-07T12:00:03Z".
    #[arg(long, value_name = "TIME")]
    pub run_at: Option<String>,
    /// Attempts before it goes dead (the server's default: 10).
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// Idempotency key: emitting the same key again returns the first event.
    #[arg(long, value_name = "IDEMPOTENCY_KEY")]
    pub key: Option<String>,
    /// Concurrency key: the handler's limits per key count its runs under
    /// this key ("account-7").
    #[arg(long, value_name = "KEY")]
    pub concurrency_key: Option<String>,
    /// Singleton key: at most one waiting event of this key; --keep says
    /// which stays.
    #[arg(long, value_name = "KEY")]
    pub singleton: Option<String>,
    /// With --singleton: keep the event already waiting (`oldest`: this
    /// emit prints its id as existing) or replace it (`newest`).
    #[arg(long, value_parser = ["oldest", "newest"], default_value = "oldest", requires = "singleton")]
    pub keep: String,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Serialize)]
struct Body<'a> {
    tenant: &'a str,
    handler: &'a str,
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    singleton: Option<serde_json::Value>,
}

/// The payload argument: JSON text, `-` for stdin, `{}` when left out.
pub(super) fn read_payload(arg: Option<&str>) -> Result<String, Failure> {
    Ok(match arg {
        None => "{}".to_string(),
        Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Failure::new(exit::OTHER, format!("cannot read stdin: {e}")))?;
            s
        }
        Some(text) => text.to_string(),
    })
}

/// Checks the payload as JSON before anything is sent.
pub(super) fn parse_payload(text: &str) -> Result<&RawValue, Failure> {
    serde_json::from_str(text.trim()).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!(
                "the payload is not valid JSON: {e}; quote it for the shell, e.g. '{{\"to\": \"a@b.c\"}}'"
            ),
        )
    })
}

/// Emits the event and prints its id, followed by ` existing` when the
/// idempotency key already named an event.
pub async fn run(args: EmitArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let text = read_payload(args.payload.as_deref())?;
    let payload: &RawValue = parse_payload(&text)?;
    let body = Body {
        tenant: &args.tenant,
        handler: &args.handler,
        payload,
        delay: args.delay.as_deref(),
        run_at: args.run_at.as_deref(),
        max_attempts: args.max_attempts,
        idempotency_key: args.key.as_deref(),
        concurrency_key: args.concurrency_key.as_deref(),
        singleton: args
            .singleton
            .as_ref()
            .map(|key| serde_json::json!({"key": key, "keep": args.keep})),
    };
    let body = serde_json::to_string(&body)
        .map_err(|e| Failure::new(exit::OTHER, format!("cannot encode the request: {e}")))?;
    let reply = api
        .call(Method::POST, &["v1", "events"], &[], Some(body))
        .await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let id = reply.value["id"]
        .as_str()
        .ok_or_else(|| unexpected("id", &reply))?;
    if reply.value["created"] == serde_json::Value::Bool(false) {
        print(&format!("{id} existing"));
    } else {
        print(id);
    }
    Ok(())
}
