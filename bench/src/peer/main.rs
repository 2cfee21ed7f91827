//! `herald-peer`: herald as a peer of `bench/compare.sh`, on the contract
//! of `bench/peers/README.md` (`--url`, `--scenario`, the scenario's flags,
//! `--hook`, one JSON result line), on the store and queue that `herald
//! serve` would use, with the worker settings of its `herald.toml` and
//! `HERALD_…` variables. Besides the contract's scenarios (drain, latency,
//! idle, long-horizon, rescue), herald's own: a backlog of paused events
//! (`--backlog-kind paused`), emit throughput (`emit`), topic emits
//! (`topic`) and the scheduler's cost (`schedules`).
//!
//! The benchmark owns what it runs on: a fresh SQLite file in a temporary
//! directory, or a PostgreSQL schema (`herald_bench`) and a NATS stream
//! (`herald_bench`) that it empties first.

mod drain;
mod emit;
mod hook;
mod idle;
mod latency;
mod long_horizon;
mod rescue;
mod result;
mod schedules;
mod setup;
mod topic;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use result::Report;

/// herald driven by the peers' contract (bench/peers/README.md).
#[derive(Parser, Debug)]
#[command(name = "herald-peer")]
struct Args {
    /// What to measure.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// drain: runnable events [200000]; rescue: events the victim stores
    /// [2000]; topic: events per subscriber count [100000].
    #[arg(long)]
    events: Option<u64>,
    /// drain: events that are not runnable, stored first (see
    /// --backlog-kind).
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// drain: `delayed`: the backlog is due a day from now; `paused`: of the
    /// same handler, paused for --backlog-tenants tenants, due an hour ago
    /// (in front of every runnable event). Both are stored without
    /// notifications, as in a steady state: a delayed event's notification
    /// waits in the queue, a paused one's was dropped when it arrived and
    /// the sweep has parked the event since (done here before the drain,
    /// untimed: phase `backlog-parked`).
    #[arg(long, default_value = "delayed", value_parser = ["delayed", "paused"])]
    backlog_kind: String,
    /// drain, paused backlog: the tenants it is spread over, each with a
    /// pause.
    #[arg(long, default_value_t = 1000)]
    backlog_tenants: u64,
    /// latency: events per second to offer, one run per rate, in order
    /// (`--rate 500,1000,2000`); long-horizon: the first.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    rate: Vec<f64>,
    /// Seconds: latency, of offering each rate [20] (offering stops then,
    /// so a store that cannot keep up is offered fewer events, not for
    /// longer); idle [60]; long-horizon [600]; schedules [60].
    #[arg(long)]
    seconds: Option<f64>,
    /// long-horizon: milliseconds each handler works (sleeps) after it
    /// starts.
    #[arg(long, default_value_t = 1.0)]
    work_ms: f64,
    /// long-horizon: seconds per window of the per-window figures.
    #[arg(long, default_value_t = 10.0)]
    window: f64,
    /// rescue: `victim` stores the events, holds them, says so and waits to
    /// be killed; `rescuer` runs them on the victim's store and queue.
    #[arg(long, value_parser = ["victim", "rescuer"])]
    role: Option<String>,
    /// rescue, rescuer: when the victim was killed, ms since the epoch.
    #[arg(long, value_name = "EPOCH_MS")]
    killed_at: Option<u64>,
    /// drain: give up when it has not finished in this many seconds [600];
    /// rescue, rescuer: give up (and say so in the result) [120].
    #[arg(long)]
    timeout: Option<f64>,
    /// Emits in flight at most (like a pool of HTTP clients).
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// Tenants the events are spread over.
    #[arg(long, default_value_t = 16)]
    tenants: u64,
    /// drain: before the drain (untimed), set a limit of N runs at once on
    /// the drained handler, over all its runs (`LimitScope::Handler`). One
    /// above the worker's concurrency never binds: it measures the limit's
    /// bookkeeping (a slot per run).
    #[arg(long, value_name = "N")]
    limit_running: Option<u32>,
    /// drain: before the drain (untimed), set a limit of N runs at once per
    /// concurrency key, the default of every key (`LimitScope::Key { key:
    /// None }`); needs --keys.
    #[arg(long, value_name = "N", requires = "keys")]
    limit_per_key: Option<u32>,
    /// drain: emit the runnable events with the concurrency keys `k0` …
    /// `k{K-1}`, round robin (a key's scope is its tenant's: with T tenants
    /// the events fall into lcm(T, K) tenant-key scopes); 0: no key.
    #[arg(long, value_name = "K", default_value_t = 0)]
    keys: u64,
    /// emit: single emits.
    #[arg(long, default_value_t = 20_000)]
    single: u64,
    /// emit: events emitted in batches.
    #[arg(long, default_value_t = 200_000)]
    batched: u64,
    /// emit: events per batch.
    #[arg(long, default_value_t = 1000)]
    batch_size: u64,
    /// topic: subscriber counts to measure, each on a topic of its own.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    subscribers: Vec<u32>,
    /// schedules: how many, each firing once a minute.
    #[arg(long, default_value_t = 1000)]
    schedules: u32,
    #[command(flatten)]
    target: Target,
}

impl Args {
    /// `--seconds`, or the scenario's default.
    fn seconds_or(&self, default: f64) -> f64 {
        self.seconds.unwrap_or(default)
    }
}

/// The scenarios.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Scenario {
    /// Store N no-op events (untimed), then start a worker and time until
    /// every one has run.
    Drain,
    /// Start a worker, then emit single events at fixed rates and measure
    /// emit-to-start latency (p50, p99, max) at each.
    Latency,
    /// Start a worker with nothing to do and leave it idle (for the queries
    /// an idle fleet sends, measured by the hook).
    Idle,
    /// Offer single emits at one rate for many minutes to a handler that
    /// works a millisecond: latency per window over time.
    LongHorizon,
    /// Rescue after SIGKILL: a victim process holds N events and is killed
    /// (by the driver); a rescuer process runs them, timed from the kill.
    Rescue,
    /// Emit throughput: single emits (32 at a time), then batches.
    Emit,
    /// Topic emit throughput: events stored per second by topic emits to
    /// topics of 1, 10 and 100 subscribers (`--subscribers`).
    Topic,
    /// The scheduler's cost: N schedules firing once a minute each, one
    /// elected worker (docs/schedules.md).
    Schedules,
}

/// Where a benchmark runs, and what it reports to: shared by every scenario.
#[derive(clap::Args, Clone, Debug)]
struct Target {
    /// The store: a `postgres://` URL, on the scratch schema `--schema`; or
    /// `sqlite`, a fresh file in a temporary directory under `--dir`.
    #[arg(long, alias = "store", default_value = "sqlite", value_name = "URL")]
    url: String,
    /// PostgreSQL: the scratch schema, dropped before the run and after it
    /// (unless `--keep`). `herald` (serve's default) is refused.
    #[arg(long, default_value = "herald_bench", value_name = "NAME")]
    schema: String,
    /// The queue: `memory`, `nats://HOST:PORT` (the stream `herald_bench`,
    /// purged first) or `pubsub://PROJECT/TOPIC?subscription=NAME`.
    #[arg(long, default_value = "memory", value_name = "KIND")]
    queue: String,
    /// A `herald.toml` for the worker's settings (concurrency, batch,
    /// lease, …) [default: ./herald.toml if it exists; HERALD_… variables
    /// apply as to `herald serve`].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// SQLite: the directory of the temporary database (on disk, not tmpfs).
    #[arg(long, default_value = ".", value_name = "DIR")]
    dir: PathBuf,
    /// Run `sh -c "CMD PHASE"` at each phase of the scenario (see
    /// bench/peers/README.md), e.g. to read PostgreSQL's CPU.
    #[arg(long, value_name = "CMD")]
    hook: Option<String>,
    /// Also write the result (JSON) to this file.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// PostgreSQL: keep the scratch schema after the run.
    #[arg(long)]
    keep: bool,
}

/// A benchmark that could not run, or found something wrong.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    /// The flags are refused.
    #[error("{0}")]
    Usage(String),
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] herald_server::config::ConfigError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] herald::StoreError),
    /// The client failed.
    #[error("emit: {0}")]
    Client(#[from] herald::ClientError),
    /// The queue could not be reached.
    #[error("{0}")]
    Serve(#[from] herald_server::serve::ServeError),
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
    /// A result file could not be written.
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

/// Runs the scenario and prints its result.
async fn run(args: Args) -> Result<(), BenchError> {
    let report = match args.scenario {
        Scenario::Drain => drain::run(&args).await?,
        Scenario::Latency => latency::run(&args).await?,
        Scenario::Idle => idle::run(&args).await?,
        Scenario::LongHorizon => long_horizon::run(&args).await?,
        Scenario::Rescue => rescue::run(&args).await?,
        Scenario::Emit => emit::run(&args).await?,
        Scenario::Topic => topic::run(&args).await?,
        Scenario::Schedules => schedules::run(&args).await?,
    };
    report.print()
}

/// The `herald` binary's allocator: the figures are herald's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // As the `herald` binary does, before any thread starts (its main.rs
    // says why).
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("herald-peer: cannot turn transparent huge pages off ({e}); running with them");
    }
    let args = Args::parse();
    herald_bench::init_logs();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald-peer: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
