//! An idle worker: started with nothing to do, left alone for `--seconds`.
//! What it costs is read by the hook (`idle-start`, `idle-end`): queries
//! per second, PostgreSQL's CPU.

use std::time::Duration;

use super::report::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh};
use super::{BenchError, Report, Target};

/// Options of `herald bench idle`.
#[derive(clap::Args, Debug)]
pub struct IdleArgs {
    /// Seconds to stay idle.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    #[command(flatten)]
    target: Target,
}

/// How long the worker runs before the idle phase starts: its first
/// receive, the reconciler's election and first sweep.
const WARM_UP: Duration = Duration::from_secs(5);

pub(super) async fn run(args: IdleArgs) -> Result<Report, BenchError> {
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    let worker = bench.worker(|_: serde::de::IgnoredAny, _| async {});
    tokio::time::sleep(WARM_UP).await;
    bench.hook.call("idle-start").await?;
    let cpu = process_cpu();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds.max(0.0))).await;
    let cpu = cpu_ms(cpu, process_cpu());
    bench.hook.call("idle-end").await?;
    worker.shutdown(Duration::from_secs(5)).await;
    let mut report = bench.report("idle");
    report.seconds = Some(args.seconds);
    report.process_cpu_ms = Some(cpu);
    bench.close().await?;
    Ok(report)
}
