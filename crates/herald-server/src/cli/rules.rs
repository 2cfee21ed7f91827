//! `herald pause|unpause|block|unblock TENANT HANDLER`.

use reqwest::Method;
use serde_json::Value;

use super::{print, Api, Failure, Remote};

/// A tenant's handler, the target of a rule.
#[derive(clap::Args, Debug)]
pub struct RuleArgs {
    /// The tenant.
    pub tenant: String,
    /// The handler.
    pub handler: String,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// The two kinds of rule.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Held for now: events wait, and run after `unpause`.
    Pause,
    /// Operator only: events wait until `unblock`.
    Block,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Pause => "pause",
            Kind::Block => "block",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Kind::Pause => "paused",
            Kind::Block => "blocked",
        }
    }
}

/// Adds (`add`) or removes a rule and prints what changed; on removal,
/// what still holds the pair and how many events were re-notified.
pub async fn run(kind: Kind, add: bool, args: RuleArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let segments = [
        "v1",
        "tenants",
        &args.tenant,
        "handlers",
        &args.handler,
        kind.path(),
    ];
    let method = if add { Method::PUT } else { Method::DELETE };
    let reply = api.call(method, &segments, &[], None).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let pair = format!("{}/{}", args.tenant, args.handler);
    let v = &reply.value;
    let yes = |key: &str| v[key] == Value::Bool(true);
    let mut out = if add {
        if yes("added") {
            format!("{pair}: {}", kind.done())
        } else {
            format!("{pair}: already {}", kind.done())
        }
    } else if yes("removed") {
        format!("{pair}: un{}", kind.done())
    } else {
        format!("{pair}: was not {}", kind.done())
    };
    if !add {
        let held = &v["still_held"];
        let mut still = Vec::new();
        if held["paused"] == Value::Bool(true) {
            still.push("paused");
        }
        if held["blocked"] == Value::Bool(true) {
            still.push("blocked");
        }
        if still.is_empty() {
            out.push_str("\nstill held: no");
        } else {
            out.push_str(&format!("\nstill held: {}", still.join(", ")));
        }
        let n = v["notified"].as_u64().unwrap_or(0);
        let events = if n == 1 { "event" } else { "events" };
        out.push_str(&format!("\nre-notified: {n} {events}"));
    }
    print(&out);
    Ok(())
}
