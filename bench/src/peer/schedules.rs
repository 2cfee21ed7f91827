//! The scheduler's cost: `--schedules` schedules that fire once a minute
//! each (cron `S * * * * *`, their seconds spread over the minute), one
//! elected worker, `--seconds` of it. Reports the occurrences emitted and
//! this process's CPU; the hook (`schedules-start`, `schedules-end`) or
//! `pg-cpu` around the command reads PostgreSQL's. docs/schedules.md.

use std::time::Duration;

use herald::schedule::{ScheduleDef, ScheduleSource};
use herald::Millis;

use super::result::{cpu_ms, process_cpu};
use super::setup::{Bench, Fresh, HANDLER};
use super::{Args, BenchError, Report};

/// The election and first tick.
const WARM_UP: Duration = Duration::from_secs(3);

pub(super) async fn run(args: &Args) -> Result<Report, BenchError> {
    let seconds = args.seconds_or(60.0).max(0.0);
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
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let cpu = cpu_ms(cpu, process_cpu());
    bench.hook.call("schedules-end").await?;
    let emitted = worker.stats().scheduled - before;
    worker.shutdown(Duration::from_secs(5)).await;
    let mut report = bench.report("schedules");
    report.seconds = Some(seconds);
    report.events = Some(emitted);
    report.events_per_s = Some(emitted as f64 / seconds.max(1e-9));
    report.process_cpu_ms = Some(cpu);
    report
        .knobs
        .insert("schedules".into(), serde_json::json!(args.schedules));
    bench.close().await?;
    Ok(report)
}
