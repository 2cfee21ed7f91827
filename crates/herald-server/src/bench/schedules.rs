//! The scheduler's cost: `--schedules` schedules that fire once a minute
//! each (cron `S * * * * *`, their seconds spread over the minute), one
//! elected worker, `--seconds` of it. Reports the occurrences emitted and
//! this process's CPU; the hook (`schedules-start`, `schedules-end`) or
//! `pg-cpu` around the command reads PostgreSQL's. docs/schedules.md.

use std::time::Duration;

use herald::schedule::{ScheduleDef, ScheduleSource};
use herald::Millis;

use super::report::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh, HANDLER};
use super::{BenchError, Report, Target};

/// Options of `herald bench schedules`.
#[derive(clap::Args, Debug)]
pub struct SchedulesArgs {
    /// How many schedules, each firing once a minute.
    #[arg(long, default_value_t = 1000)]
    schedules: u32,
    /// Seconds to run the scheduler.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    #[command(flatten)]
    target: Target,
}

/// The election and first tick.
const WARM_UP: Duration = Duration::from_secs(3);

pub(super) async fn run(args: SchedulesArgs) -> Result<Report, BenchError> {
    let bench = Bench::open(&args.target, Fresh::Empty).await?;
    let now = Millis::now();
    for i in 0..args.schedules {
        let def = ScheduleDef {
            cron: Some(format!("{} * * * * *", i % 60)),
            ..ScheduleDef::new("bench", format!("s{i:06}"), HANDLER, ScheduleSource::Api)
        };
        let s = def
            .build(now, 0)
            .map_err(|e| BenchError::Failed(e.to_string()))?;
        bench.store.put_schedule(&s).await?;
    }
    let worker = bench.worker(|_: serde::de::IgnoredAny, _| async {});
    tokio::time::sleep(WARM_UP).await;
    let before = worker.stats().scheduled;
    bench.hook.call("schedules-start").await?;
    let cpu = process_cpu();
    let bar = indicatif::ProgressBar::new(args.seconds.max(0.0) as u64);
    let end = std::time::Instant::now() + Duration::from_secs_f64(args.seconds.max(0.0));
    while std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1).min(end - std::time::Instant::now())).await;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let cpu = cpu_ms(cpu, process_cpu());
    bench.hook.call("schedules-end").await?;
    let emitted = worker.stats().scheduled - before;
    worker.shutdown(Duration::from_secs(5)).await;
    let mut report = bench.report("schedules");
    report.seconds = Some(args.seconds);
    report.events = Some(emitted);
    report.events_per_s = Some(emitted as f64 / args.seconds.max(1e-9));
    report.process_cpu_ms = Some(cpu);
    report
        .knobs
        .insert("schedules".into(), serde_json::json!(args.schedules));
    bench.close().await?;
    Ok(report)
}
