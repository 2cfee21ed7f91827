//! `herald stats`.

use reqwest::Method;
use serde_json::Value;

use super::{cell, print, table, text, unexpected, Api, Failure, Remote};

/// Show event counts and recent throughput.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Only this tenant's counts (a tenant token sees its own anyway).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

fn rate(v: &Value) -> String {
    v.as_f64().map(|r| format!("{r:.2}")).unwrap_or("-".into())
}

fn seconds(v: &Value) -> String {
    match v.as_f64() {
        None => "-".into(),
        Some(s) if s < 1.0 => format!("{:.1}ms", s * 1000.0),
        Some(s) => format!("{s:.2}s"),
    }
}

fn recent_row(name: &str, r: &Value) -> Vec<String> {
    let lat = &r["emit_to_start_seconds"];
    vec![
        cell(name, 30),
        rate(&r["started_per_second"]),
        rate(&r["done_per_second"]),
        rate(&r["failed_per_second"]),
        rate(&r["dead_per_second"]),
        seconds(&lat["p50"]),
        seconds(&lat["p99"]),
    ]
}

/// Prints the counts per tenant and handler (waiting, running, delayed,
/// held, dead, done; `~` marks an estimated split, with what holds each
/// pair), and for the operator, the last minute's activity and the
/// handlers this server runs.
pub async fn run(args: StatsArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let query: Vec<(&str, String)> = args.tenant.iter().map(|t| ("tenant", t.clone())).collect();
    let reply = api
        .call(Method::GET, &["v1", "stats"], &query, None)
        .await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let v = &reply.value;
    let counts = v["by_handler"]
        .as_array()
        .ok_or_else(|| unexpected("by_handler", &reply))?;
    let mut estimated = false;
    let rows: Vec<Vec<String>> = counts
        .iter()
        .map(|c| {
            let mut held = Vec::new();
            if c["paused"] == Value::Bool(true) {
                held.push("paused");
            }
            if c["blocked"] == Value::Bool(true) {
                held.push("blocked");
            }
            // An estimated split: waiting, running and delayed are
            // extrapolated (their sum is exact).
            let about = if c["estimated"] == Value::Bool(true) {
                estimated = true;
                "~"
            } else {
                ""
            };
            let split = |k: &str| format!("{about}{}", text(&c[k]));
            vec![
                cell(&text(&c["tenant"]), 30),
                cell(&text(&c["handler"]), 30),
                split("waiting"),
                split("running"),
                split("delayed"),
                text(&c["held"]),
                text(&c["dead"]),
                text(&c["done"]),
                held.join(","),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no events stored\n".to_string()
    } else {
        table(
            &[
                "TENANT", "HANDLER", "WAITING", "RUNNING", "DELAYED", "HELD", "DEAD", "DONE",
                "RULE",
            ],
            &rows,
        )
    };
    if estimated {
        out.push_str("~ estimated from a sample of the pending events (their sum is exact)\n");
    }
    let recent = &v["recent"];
    if recent.is_object() {
        let mut rows = vec![recent_row("(all)", recent)];
        if let Some(handlers) = recent["handlers"].as_object() {
            for (name, r) in handlers {
                rows.push(recent_row(name, r));
            }
        }
        out.push_str(&format!(
            "\nlast {}s, per second; latency is emit to start:\n",
            text(&recent["window_seconds"])
        ));
        out.push_str(&table(
            &["HANDLER", "STARTED", "DONE", "FAILED", "DEAD", "P50", "P99"],
            &rows,
        ));
    }
    if let Some(handlers) = v["handlers"].as_array() {
        let names: Vec<String> = handlers.iter().map(text).collect();
        out.push_str(&format!(
            "\nhandlers run by this server: {}\n",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    }
    print(&out);
    Ok(())
}
