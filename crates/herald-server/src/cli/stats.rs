//! `herald stats`.

use reqwest::Method;
use serde_json::Value;

use super::{cell, print, table, text, unexpected, Api, Failure, Remote};

/// Show event counts and recent throughput.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
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

/// Prints the counts per tenant, handler and state (with what holds each
/// pair), and for the operator, the last minute's activity and the
/// handlers this server runs.
pub async fn run(args: StatsArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let reply = api.call(Method::GET, &["v1", "stats"], &[], None).await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let v = &reply.value;
    let counts = v["counts"]
        .as_array()
        .ok_or_else(|| unexpected("counts", &reply))?;
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
            vec![
                cell(&text(&c["tenant"]), 30),
                cell(&text(&c["handler"]), 30),
                text(&c["state"]),
                text(&c["count"]),
                held.join(","),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no events stored\n".to_string()
    } else {
        table(&["TENANT", "HANDLER", "STATE", "COUNT", "HELD"], &rows)
    };
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
