//! `http-emit`: emit throughput over HTTP against a running `herald serve`,
//! single and batched, then the emit-to-start latency at a steady rate
//! (read from the server's `/v1/stats`).
//!
//! ```sh
//! cargo build --release --bin herald -p herald-server
//! target/release/herald serve --store /tmp/bench.db --listen 127.0.0.1:7878 \
//!     --noop-handler http-emit-single --noop-handler http-emit-batch --noop-handler http-emit-steady &
//! cargo run --release -p herald-bench --bin http-emit -- --url http://127.0.0.1:7878
//! ```
//!
//! Each phase emits for its own handler name, so that the steady phase's
//! latency figures are its own. Run the server with a no-op handler for
//! each (as above) for the events to run; without one they stay pending
//! and the steady phase reports no latency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};

/// Emit throughput and emit-to-start latency of `herald serve`, over HTTP.
#[derive(Parser, Clone)]
struct Args {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:7878")]
    url: String,
    /// A bearer token (the operator's: the steady phase reads /v1/stats).
    #[arg(long, env = "HERALD_TOKEN")]
    token: Option<String>,
    /// The tenant to emit for.
    #[arg(long, default_value = "bench")]
    tenant: String,
    /// Events emitted one per request.
    #[arg(long, default_value_t = 20_000)]
    single: usize,
    /// Events emitted in batches.
    #[arg(long, default_value_t = 200_000)]
    batched: usize,
    /// Events per batch request.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// Requests in flight at once (connections).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The steady phase's rate, events per second (single emits).
    #[arg(long, default_value_t = 1000)]
    rate: usize,
    /// The steady phase's length, seconds (at most 60: /v1/stats keeps a minute).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Payload size in bytes (a JSON string of that many characters, roughly).
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
}

struct Bench {
    args: Args,
    http: reqwest::Client,
    payload: Value,
}

/// Request latencies, for quantiles.
#[derive(Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn quantile(&mut self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.sort_unstable();
        let i = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len()) - 1;
        self.0[i]
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

impl Bench {
    fn event(&self, handler: &str) -> Value {
        json!({"tenant": self.args.tenant, "handler": handler, "payload": self.payload})
    }

    async fn post(&self, path: &str, body: &Value) -> Result<(), String> {
        let mut req = self
            .http
            .post(format!("{}{path}", self.args.url))
            .json(body);
        if let Some(t) = &self.args.token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.map_err(|e| e.to_string())?;
        if r.status().is_success() {
            Ok(())
        } else {
            let status = r.status();
            Err(format!("{status}: {}", r.text().await.unwrap_or_default()))
        }
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        let mut req = self.http.get(format!("{}{path}", self.args.url));
        if let Some(t) = &self.args.token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.map_err(|e| e.to_string())?;
        let status = r.status();
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {v}"));
        }
        Ok(v)
    }

    /// `requests` requests of `per` events each, `concurrency` at a time.
    async fn flood(
        self: &Arc<Self>,
        handler: &'static str,
        requests: usize,
        per: usize,
    ) -> (Duration, Latencies) {
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..self.args.concurrency {
            let b = self.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let body = if per == 1 {
                    b.event(handler)
                } else {
                    json!({"events": (0..per).map(|_| b.event(handler)).collect::<Vec<_>>()})
                };
                let path = if per == 1 {
                    "/v1/events"
                } else {
                    "/v1/events/batch"
                };
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let t = Instant::now();
                    if let Err(e) = b.post(path, &body).await {
                        eprintln!("http-emit: POST {path} failed: {e}");
                        std::process::exit(1);
                    }
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        let mut all = Latencies::default();
        for t in tasks {
            all.0.extend(t.await.expect("a request task"));
        }
        (started.elapsed(), all)
    }

    /// Pending events of this tenant.
    async fn pending(&self) -> Result<u64, String> {
        let stats = self.get("/v1/stats").await?;
        Ok(stats["counts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|c| c["tenant"] == self.args.tenant.as_str() && c["state"] == "pending")
                    .map(|c| c["count"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0))
    }

    async fn wait_drained(&self, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let n = self.pending().await?;
            if n == 0 {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(format!("{n} events still pending after {limit:?}: does the server run a handler for them (--noop-handler)?"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Emits at `rate` per second for `seconds`, one event per request.
    async fn steady(self: &Arc<Self>, handler: &'static str) -> (usize, Duration, Latencies) {
        let rate = self.args.rate.max(1);
        let tick = Duration::from_millis(10);
        let per_tick = rate as f64 / 100.0;
        let total = rate * self.args.seconds as usize;
        let gate = Arc::new(tokio::sync::Semaphore::new(self.args.concurrency * 4));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut sent = 0usize;
        let mut owed = 0.0f64;
        let mut lagged = 0usize;
        while sent < total {
            interval.tick().await;
            owed += per_tick;
            while owed >= 1.0 && sent < total {
                owed -= 1.0;
                sent += 1;
                let Ok(permit) = gate.clone().try_acquire_owned() else {
                    // The server is not keeping up: count it, don't queue without bound.
                    lagged += 1;
                    continue;
                };
                let b = self.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = b.post("/v1/events", &b.event(handler)).await;
                    drop(permit);
                    let _ = tx.send(r.map(|()| t.elapsed()));
                });
            }
        }
        drop(tx);
        let mut lat = Latencies::default();
        while let Some(r) = rx.recv().await {
            match r {
                Ok(d) => lat.0.push(d),
                Err(e) => {
                    eprintln!("http-emit: POST /v1/events failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        if lagged > 0 {
            eprintln!(
                "http-emit: {lagged} emits skipped: more than {} requests were in flight",
                self.args.concurrency * 4
            );
        }
        (sent - lagged, started.elapsed(), lat)
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency * 4)
        .build()
        .expect("an HTTP client");
    let payload = json!({ "data": "x".repeat(args.payload_bytes.saturating_sub(12)) });
    let bench = Arc::new(Bench {
        args: args.clone(),
        http,
        payload,
    });
    if let Err(e) = bench.get("/v1/stats").await {
        eprintln!("http-emit: cannot read {}/v1/stats: {e}", args.url);
        std::process::exit(1);
    }
    println!(
        "http-emit: {} with {} connections, payload ~{} bytes",
        args.url, args.concurrency, args.payload_bytes
    );

    let (took, mut lat) = bench.flood("http-emit-single", args.single, 1).await;
    println!(
        "single   {:>8} events in {:>6.2} s = {:>8.0} events/s   request p50 {}  p99 {}",
        args.single,
        took.as_secs_f64(),
        args.single as f64 / took.as_secs_f64(),
        ms(lat.quantile(0.5)),
        ms(lat.quantile(0.99))
    );

    let requests = args.batched.div_ceil(args.batch_size);
    let events = requests * args.batch_size;
    let (took, mut lat) = bench
        .flood("http-emit-batch", requests, args.batch_size)
        .await;
    println!(
        "batch    {:>8} events in {:>6.2} s = {:>8.0} events/s   request p50 {}  p99 {}  ({} per request)",
        events,
        took.as_secs_f64(),
        events as f64 / took.as_secs_f64(),
        ms(lat.quantile(0.5)),
        ms(lat.quantile(0.99)),
        args.batch_size
    );

    match bench.wait_drained(Duration::from_secs(300)).await {
        Ok(d) => println!(
            "drained  the backlog {:.2} s after the last emit",
            d.as_secs_f64()
        ),
        Err(e) => {
            eprintln!("http-emit: {e}");
            std::process::exit(1);
        }
    }

    if let Ok(before) = bench.get("/v1/stats").await {
        let old =
            &before["recent"]["handlers"]["http-emit-steady"]["emit_to_start_seconds"]["samples"];
        if old.as_u64().unwrap_or(0) > 0 {
            eprintln!("http-emit: /v1/stats still holds {old} runs of an earlier steady phase (it keeps a minute): restart the server, or wait a minute, for figures of this run alone");
        }
    }
    let (sent, took, mut lat) = bench.steady("http-emit-steady").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = match bench.get("/v1/stats").await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("http-emit: {e}");
            std::process::exit(1);
        }
    };
    let steady = &stats["recent"]["handlers"]["http-emit-steady"]["emit_to_start_seconds"];
    let secs = |v: &Value| {
        v.as_f64()
            .map(|s| format!("{:.2} ms", s * 1000.0))
            .unwrap_or_else(|| "n/a".into())
    };
    println!(
        "steady   {:>8} events in {:>6.2} s = {:>8.0} events/s   request p50 {}  p99 {}",
        sent,
        took.as_secs_f64(),
        sent as f64 / took.as_secs_f64(),
        ms(lat.quantile(0.5)),
        ms(lat.quantile(0.99))
    );
    println!(
        "         emit-to-start p50 {}  p99 {}  max {}  ({} runs; from /v1/stats)",
        secs(&steady["p50"]),
        secs(&steady["p99"]),
        secs(&steady["max"]),
        steady["samples"]
    );
    if steady["samples"].as_u64().unwrap_or(0) == 0 {
        eprintln!("http-emit: no runs of http-emit-steady in /v1/stats: start the server with --noop-handler http-emit-steady, and use the operator's token");
    }
}
