//! An idle worker: started with nothing to do, left alone for `--seconds` (60).
//! What it costs is read by the hook (`idle-start`, `idle-end`): queries
//! per second, PostgreSQL's CPU.

use std::time::Duration;

use super::result::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh};
use super::{Args, BenchError, Report};

/// How long the worker runs before the idle phase starts: its first
/// receive, the reconciler's election and first sweep.
const WARM_UP: Duration = Duration::from_secs(5);

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    let seconds = args.seconds_or(60.0);
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    let worker = bench.worker(|_: serde::de::IgnoredAny, _| async {});
    tokio::time::sleep(WARM_UP).await;
    bench.hook.call("idle-start").await?;
    let cpu = process_cpu();
    tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0))).await;
    let cpu = cpu_ms(cpu, process_cpu());
    bench.hook.call("idle-end").await?;
    worker.shutdown(Duration::from_secs(5)).await;
    let mut report = bench.report("idle");
    report.seconds = Some(seconds);
    report.process_cpu_ms = Some(cpu);
    bench.close().await?;
    Ok(report)
}
