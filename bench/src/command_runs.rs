//! `command-runs`: command handler runs per second through `herald serve`
//! (SQLite, the in-process queue, a `/bin/true` command handler). Measures
//! what each run costs the server: a fork and exec, the process group's
//! bookkeeping (its report to the run watchdog included), the store's
//! writes.
//!
//! ```sh
//! bench/command-runs.sh                       # builds herald, 3 rounds
//! cargo run --release -p herald-bench --bin command-runs -- --herald PATH --events 5000 --rounds 3
//! ```
//!
//! Each round starts a fresh server on a fresh store, emits `--events`
//! events in batches of 1,000 (the handler is paused meanwhile, so that the
//! emit is not timed), unpauses, and times until `/metrics` counts every
//! one done.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use herald_bench::fleet::{herald_binary, toml_string};
use serde_json::json;

/// Command runs per second through `herald serve`.
#[derive(Parser)]
struct Args {
    /// The herald binary [default: $CARGO_TARGET_DIR/release/herald].
    #[arg(long)]
    herald: Option<PathBuf>,
    /// Events per round.
    #[arg(long, default_value_t = 5000)]
    events: usize,
    /// Rounds; the median is reported too.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Runs at once (`worker.concurrency`).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

const HANDLER: &str = "true";
const TENANT: &str = "bench";
const BATCH: usize = 1000;

/// A `herald serve`, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn serve(herald: &PathBuf, dir: &std::path::Path, concurrency: usize) -> Server {
    let config = dir.join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "store = {}\nlisten = \"127.0.0.1:0\"\n[worker]\nconcurrency = {concurrency}\n[handlers.{HANDLER}]\nkind = \"command\"\nprogram = \"/bin/true\"\n",
            toml_string(&format!("sqlite://{}", dir.join("herald.db").display())),
        ),
    )
    .unwrap();
    let mut child = Command::new(herald)
        .args(["serve", "--config"])
        .arg(&config)
        .env("HERALD_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start herald serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server { child, base }
}

async fn done_count(http: &reqwest::Client, base: &str) -> usize {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("herald_events_done_total{{handler=\"{HANDLER}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse::<f64>().unwrap() as usize)
}

async fn round(args: &Args, herald: &PathBuf) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(herald, dir.path(), args.concurrency);
    let http = reqwest::Client::new();
    let rule = format!(
        "{}/v1/tenants/{TENANT}/handlers/{HANDLER}/pause",
        server.base
    );
    let r = http.put(&rule).send().await.unwrap();
    assert!(r.status().is_success(), "pause: {}", r.status());
    let mut left = args.events;
    while left > 0 {
        let n = left.min(BATCH);
        let events: Vec<_> = (0..n)
            .map(|_| json!({"tenant": TENANT, "handler": HANDLER, "payload": {}}))
            .collect();
        let r = http
            .post(format!("{}/v1/events/batch", server.base))
            .json(&json!({ "events": events }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "emit: {}", r.status());
        left -= n;
    }
    let started = Instant::now();
    let r = http.delete(&rule).send().await.unwrap();
    assert!(r.status().is_success(), "unpause: {}", r.status());
    while done_count(&http, &server.base).await < args.events {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not done after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    args.events as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    let herald = herald_binary(args.herald.clone());
    let mut rates = Vec::with_capacity(args.rounds);
    for n in 1..=args.rounds {
        let rate = round(&args, &herald).await;
        println!(
            "round {n}: {} command runs in {:.2} s: {rate:.0} runs/s",
            args.events,
            args.events as f64 / rate
        );
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "median of {}: {:.0} runs/s ({}, concurrency {})",
        rates.len(),
        rates[rates.len() / 2],
        herald.display(),
        args.concurrency
    );
}
