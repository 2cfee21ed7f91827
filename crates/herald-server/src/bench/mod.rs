//! `herald bench`: herald's own benchmarks on the store and queue that
//! `herald serve` would use, with the worker settings of its `herald.toml`
//! and `HERALD_…` variables: a no-op drain (with a backlog of delayed or
//! paused events), emit-to-start latency at fixed rates, emit throughput
//! (direct, and to topics of many subscribers),
//! an idle worker, a long horizon at one rate, and rescue after SIGKILL. A progress bar on stderr, the results as JSON (the
//! last line on stdout, and `--out`), the latency curve as SVG (`--chart`).
//!
//! The benchmark owns what it runs on: a fresh SQLite file in a temporary
//! directory, or a PostgreSQL schema (`herald_bench`) and a NATS stream
//! (`herald_bench`) that it empties first. Its phases call `--hook CMD
//! PHASE`, so that `bench/compare.sh` measures herald and the other queues
//! (`bench/peers/`) the same way.

pub mod chart;
pub mod compare;
pub mod drain;
pub mod emit;
mod hook;
pub mod idle;
pub mod latency;
pub mod long_horizon;
pub mod report;
pub mod rescue;
pub mod schedules;
mod setup;
pub mod topic;

use std::path::PathBuf;

pub use report::{Percentiles, Point, Report, Window};

/// Options of `herald bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// What to measure.
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// The scenarios.
#[derive(clap::Subcommand)]
pub enum Scenario {
    /// Store N no-op events (untimed), then start a worker and time until
    /// every one has run.
    Drain(drain::DrainArgs),
    /// Start a worker, then emit single events at fixed rates and measure
    /// emit-to-start latency (p50, p99, max) at each.
    Latency(latency::LatencyArgs),
    /// Emit throughput: single emits (32 at a time), then batches.
    Emit(emit::EmitArgs),
    /// Topic emit throughput: events stored per second by topic emits to
    /// topics of 1, 10 and 100 subscribers (`--subscribers`).
    Topic(topic::TopicArgs),
    /// Offer single emits at one rate for many minutes to a handler that
    /// works a millisecond: latency per window over time.
    LongHorizon(long_horizon::LongHorizonArgs),
    /// Rescue after SIGKILL: a victim process holds N events and is killed
    /// (by the driver); a rescuer process runs them, timed from the kill.
    Rescue(rescue::RescueArgs),
    /// Start a worker with nothing to do and leave it idle (for the queries
    /// an idle fleet sends, measured by the hook).
    Idle(idle::IdleArgs),
    /// The scheduler's cost: N schedules firing once a minute each, one
    /// elected worker (docs/schedules.md).
    Schedules(schedules::SchedulesArgs),
    /// Turn the runs of `bench/compare.sh` (a directory) into one table
    /// and charts.
    Report(compare::ReportArgs),
}

/// Where a benchmark runs, and what it reports to: shared by every scenario.
#[derive(clap::Args, Clone, Debug)]
pub struct Target {
    /// The store: `sqlite`, a fresh file in a temporary directory under
    /// `--dir`; or a `postgres://` URL, on the scratch schema `--schema`.
    #[arg(long, default_value = "sqlite", value_name = "URL")]
    pub store: String,
    /// PostgreSQL: the scratch schema, dropped before the run and after it
    /// (unless `--keep`). `herald` (serve's default) is refused.
    #[arg(long, default_value = "herald_bench", value_name = "NAME")]
    pub schema: String,
    /// The queue: `memory`, `nats://HOST:PORT` (the stream `herald_bench`,
    /// purged first) or `pubsub://PROJECT/TOPIC?subscription=NAME`.
    #[arg(long, default_value = "memory", value_name = "KIND")]
    pub queue: String,
    /// A `herald.toml` for the worker's settings (concurrency, batch,
    /// lease, …) [default: ./herald.toml if it exists; HERALD_… variables
    /// apply as to `herald serve`].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// SQLite: the directory of the temporary database (on disk, not tmpfs).
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub dir: PathBuf,
    /// Run `sh -c "CMD PHASE"` at each phase of the scenario (see
    /// bench/peers/README.md), e.g. to read PostgreSQL's CPU.
    #[arg(long, value_name = "CMD")]
    pub hook: Option<String>,
    /// Also write the results (JSON) to this file.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// PostgreSQL: keep the scratch schema after the run.
    #[arg(long)]
    pub keep: bool,
}

/// A benchmark that could not run, or found something wrong.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The target is refused.
    #[error("{0}")]
    Usage(String),
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] herald::StoreError),
    /// The client failed.
    #[error("emit: {0}")]
    Client(#[from] herald::ClientError),
    /// The queue failed.
    #[error("queue {location}: {error}")]
    Queue {
        /// The queue, without credentials.
        location: String,
        /// What went wrong.
        error: herald::QueueError,
    },
    /// PostgreSQL refused a statement of the benchmark's own.
    #[error("PostgreSQL: {context}: {source}")]
    Postgres {
        /// What the benchmark was doing.
        context: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// The hook failed.
    #[error("hook {phase}: {reason}")]
    Hook {
        /// The phase.
        phase: String,
        /// Why.
        reason: String,
    },
    /// A result file or chart could not be written.
    #[error("{path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The run did not do what it should (events left, a timeout).
    #[error("{0}")]
    Failed(String),
}

/// Runs a scenario and prints its report.
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let report = match args.scenario {
        Scenario::Drain(a) => drain::run(a).await?,
        Scenario::Latency(a) => latency::run(a).await?,
        Scenario::Emit(a) => emit::run(a).await?,
        Scenario::Topic(a) => topic::run(a).await?,
        Scenario::Idle(a) => idle::run(a).await?,
        Scenario::LongHorizon(a) => long_horizon::run(a).await?,
        Scenario::Rescue(a) => rescue::run(a).await?,
        Scenario::Schedules(a) => schedules::run(a).await?,
        Scenario::Report(a) => return compare::run(a),
    };
    report.print()
}
