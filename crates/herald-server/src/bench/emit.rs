//! Emit throughput: single emits, `--in-flight` at a time (each its own
//! call, as HTTP requests are), then batches of `--batch-size`; no worker
//! runs, so this is the cost of storing and notifying alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::{EmitOptions, EmitRequest};
use serde_json::json;
use tokio::sync::Semaphore;

use super::drain::progress;
use super::report::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh, HANDLER};
use super::{BenchError, Report, Target};

/// Options of `herald bench emit`.
#[derive(clap::Args, Debug)]
pub struct EmitArgs {
    /// Single emits.
    #[arg(long, default_value_t = 20_000)]
    single: u64,
    /// Events emitted in batches.
    #[arg(long, default_value_t = 200_000)]
    batched: u64,
    /// Events per batch.
    #[arg(long, default_value_t = 1000)]
    batch_size: u64,
    /// Single emits in flight at most.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// Tenants the events are spread over.
    #[arg(long, default_value_t = 16)]
    tenants: u64,
    #[command(flatten)]
    target: Target,
}

pub(super) async fn run(args: EmitArgs) -> Result<Report, BenchError> {
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    let tenants = args.tenants.max(1);
    let cpu = process_cpu();

    bench.hook.call("single-start").await?;
    let bar = progress(args.single, "single emits");
    let gate = Arc::new(Semaphore::new(args.in_flight.max(1)));
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.single {
        let permit = gate.clone().acquire_owned().await.expect("open");
        let client = bench.client.clone();
        tasks.spawn(async move {
            let r = client
                .emit_json(
                    &format!("tenant-{}", i % tenants),
                    HANDLER,
                    &format!(r#"{{"i":{i}}}"#),
                    EmitOptions::default(),
                )
                .await;
            drop(permit);
            r
        });
        while let Some(done) = tasks.try_join_next() {
            done.expect("emit task")?;
            bar.inc(1);
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("emit task")?;
        bar.inc(1);
    }
    let single = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    bench.hook.call("single-end").await?;

    bench.hook.call("batched-start").await?;
    let bar = progress(args.batched, "batched emits");
    let size = args.batch_size.max(1);
    let t = Instant::now();
    for start in (0..args.batched).step_by(size as usize) {
        let n = size.min(args.batched - start);
        let batch = (start..start + n)
            .map(|i| EmitRequest {
                tenant: format!("tenant-{}", i % tenants),
                handler: HANDLER.into(),
                payload: format!(r#"{{"i":{i}}}"#),
                options: EmitOptions::default(),
            })
            .collect();
        bench.client.emit_batch(batch).await?;
        bar.inc(n);
    }
    let batched = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    bench.hook.call("batched-end").await?;
    let cpu = cpu_ms(cpu, process_cpu());

    let stored: u64 = bench
        .client
        .handler_counts(&herald::CountsQuery::totals())
        .await?
        .iter()
        .map(|c| c.total())
        .sum();
    if stored != args.single + args.batched {
        return Err(BenchError::Failed(format!(
            "{stored} events stored, not the {} emitted",
            args.single + args.batched
        )));
    }
    let mut report = bench.report("emit");
    report.events = Some(args.single + args.batched);
    report.seconds = Some(single + batched);
    report.single_per_s = Some(args.single as f64 / single.max(f64::EPSILON));
    report.batched_per_s = Some(args.batched as f64 / batched.max(f64::EPSILON));
    report.process_cpu_ms = Some(cpu);
    report
        .knobs
        .insert("in_flight".into(), json!(args.in_flight));
    report.knobs.insert("batch_size".into(), json!(size));
    report.knobs.insert("tenants".into(), json!(tenants));
    // The queue holds their notifications; nothing will run them.
    tokio::time::sleep(Duration::from_millis(10)).await;
    bench.close().await?;
    Ok(report)
}
