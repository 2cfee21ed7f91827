//! Topic emit throughput: for each subscriber count, `--events` events
//! stored by topic emits (`--events / subscribers` emits, `--in-flight` at
//! a time, each its own call as HTTP requests are) to a topic with that
//! many subscribed handlers; no worker runs, so this is the cost of
//! reading the subscribers, storing the copies and notifying them alone.
//! Each count calls the hook at `topic-N-start` and `topic-N-end`, so a
//! hook can read PostgreSQL's CPU per count (docs/semantics.md, "Fan-out").

use std::sync::Arc;
use std::time::Instant;

use herald::{EmitOptions, Subscription};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;

use super::drain::progress;
use super::report::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh};
use super::{BenchError, Report, Target};

/// Options of `herald bench topic`.
#[derive(clap::Args, Debug)]
pub struct TopicArgs {
    /// Subscriber counts to measure, each on a topic of its own.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    subscribers: Vec<u32>,
    /// Events to store per subscriber count (rounded up to whole emits).
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Topic emits in flight at most.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// Tenants the emits are spread over.
    #[arg(long, default_value_t = 16)]
    tenants: u64,
    #[command(flatten)]
    target: Target,
}

/// One subscriber count's figures.
#[derive(Clone, Debug, Serialize)]
pub struct TopicPoint {
    /// Handlers subscribed to the topic.
    pub subscribers: u32,
    /// Topic emits made.
    pub emits: u64,
    /// Events stored (emits × subscribers).
    pub events: u64,
    /// The timed phase, seconds.
    pub seconds: f64,
    /// Events stored per second.
    pub events_per_s: f64,
    /// Topic emits per second.
    pub emits_per_s: f64,
    /// This process's CPU over the phase, ms.
    pub process_cpu_ms: f64,
}

pub(super) async fn run(args: TopicArgs) -> Result<Report, BenchError> {
    if args.subscribers.contains(&0) {
        return Err(BenchError::Usage(
            "--subscribers: every count must be at least 1 (a topic without subscribers refuses emits)".into(),
        ));
    }
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    let tenants = args.tenants.max(1);
    let mut points = Vec::with_capacity(args.subscribers.len());
    let mut stored_before = 0u64;
    for &count in &args.subscribers {
        let topic = format!("bench.{count}");
        for k in 0..count {
            bench
                .client
                .subscribe(&Subscription::every_tenant(&topic, format!("sub-{k:04}")))
                .await?;
        }
        let emits = args.events.div_ceil(u64::from(count)).max(1);
        let phase = format!("topic-{count}");
        bench.hook.call(&format!("{phase}-start")).await?;
        let bar = progress(emits * u64::from(count), "topic copies");
        let cpu = process_cpu();
        let gate = Arc::new(Semaphore::new(args.in_flight.max(1)));
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..emits {
            let permit = gate.clone().acquire_owned().await.expect("open");
            let client = bench.client.clone();
            let topic = topic.clone();
            tasks.spawn(async move {
                let r = client
                    .emit_topic_json(
                        &format!("tenant-{}", i % tenants),
                        &topic,
                        &format!(r#"{{"i":{i}}}"#),
                        EmitOptions::default(),
                    )
                    .await;
                drop(permit);
                r
            });
            while let Some(done) = tasks.try_join_next() {
                bar.inc(done.expect("emit task")?.events.len() as u64);
            }
        }
        while let Some(done) = tasks.join_next().await {
            bar.inc(done.expect("emit task")?.events.len() as u64);
        }
        let seconds = t.elapsed().as_secs_f64();
        let cpu = cpu_ms(cpu, process_cpu());
        bar.finish_and_clear();
        bench.hook.call(&format!("{phase}-end")).await?;
        let stored: u64 = bench
            .client
            .handler_counts(&herald::CountsQuery::totals())
            .await?
            .iter()
            .map(|c| c.total())
            .sum();
        let events = emits * u64::from(count);
        if stored - stored_before != events {
            return Err(BenchError::Failed(format!(
                "{} events stored for {count} subscribers, not the {events} emitted",
                stored - stored_before
            )));
        }
        stored_before = stored;
        eprintln!(
            "{count} subscribers: {events} events in {seconds:.2} s: {:.0} events/s, {:.0} emits/s",
            events as f64 / seconds.max(f64::EPSILON),
            emits as f64 / seconds.max(f64::EPSILON)
        );
        points.push(TopicPoint {
            subscribers: count,
            emits,
            events,
            seconds,
            events_per_s: events as f64 / seconds.max(f64::EPSILON),
            emits_per_s: emits as f64 / seconds.max(f64::EPSILON),
            process_cpu_ms: cpu,
        });
    }
    let mut report = bench.report("topic");
    report.events = Some(points.iter().map(|p| p.events).sum());
    report.seconds = Some(points.iter().map(|p| p.seconds).sum());
    if let [one] = points.as_slice() {
        report.events_per_s = Some(one.events_per_s);
        report.process_cpu_ms = Some(one.process_cpu_ms);
    }
    report.topics = points;
    report
        .knobs
        .insert("in_flight".into(), json!(args.in_flight));
    report.knobs.insert("tenants".into(), json!(tenants));
    report
        .knobs
        .insert("events_per_count".into(), json!(args.events));
    bench.close().await?;
    Ok(report)
}
