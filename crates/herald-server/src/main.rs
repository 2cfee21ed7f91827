//! The `herald` program: its command line, logging and exit codes; the
//! commands themselves are in the `herald_server` library.

use herald_server::{cli, demo, migrate, runners, serve};

use clap::{Parser, Subcommand};

/// mimalloc rather than glibc's malloc: a worker allocates per run and per
/// row, and glibc's malloc, free and consolidation were 13–18 % of its
/// samples in a drain, mimalloc's about 7 % (a `perf record` of
/// `bench/pg-drain.sh`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process, before any thread
/// starts. mimalloc asks for them (`MADV_HUGEPAGE`) and gives memory it no
/// longer uses back to the kernel a second later; with huge pages every
/// fault on it again zeroes 2 MiB, 13 % of herald's own CPU in a NATS drain
/// (`perf`, 2026-12-06). The flag is the process's, so it also holds where
/// the kernel hands out huge pages unasked (`enabled = always`), and is
/// inherited by command handlers (`docs/handlers.md`). Without it (not
/// Linux, or refused) herald runs as before.
fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("herald: cannot turn transparent huge pages off ({e}); running with them");
    }
}

/// herald: a durable event queue. The database stores, the queue schedules.
#[derive(Parser)]
#[command(name = "herald", version, about, after_help = cli::EXIT_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded herald (SQLite + in-process queue) on a mix of events
    /// and print what happened.
    Demo(demo::DemoArgs),
    /// Create or upgrade herald's tables in a store (PostgreSQL or SQLite).
    Migrate(migrate::MigrateArgs),
    /// Run workers, the HTTP API and /metrics, from herald.toml, HERALD_…
    /// variables and flags; with none, on ./herald.db and the in-process queue.
    Serve(serve::ServeArgs),
    /// Emit one event through a running server; prints its id.
    Emit(cli::emit::EmitArgs),
    /// List, show, retry or delete events on a running server.
    #[command(subcommand)]
    Events(cli::events::EventsCommand),
    /// Pause a tenant's handler: its events wait until `unpause`.
    Pause(cli::rules::RuleArgs),
    /// Remove a pause; prints what still holds and how many were re-notified.
    Unpause(cli::rules::RuleArgs),
    /// Block a tenant's handler (operator token only).
    Block(cli::rules::RuleArgs),
    /// Remove a block; prints what still holds and how many were re-notified.
    Unblock(cli::rules::RuleArgs),
    /// List, set or remove concurrency limits on a running server.
    #[command(subcommand)]
    Limits(cli::limits::LimitsCommand),
    /// List, add, pause, resume or delete schedules on a running server.
    #[command(subcommand)]
    Schedules(cli::schedules::SchedulesCommand),
    /// Show event counts, what holds each handler, and recent throughput.
    Stats(cli::stats::StatsArgs),
    /// Emit to a topic (one event per subscribed handler) and manage its
    /// subscribers on a running server.
    #[command(subcommand)]
    Topics(cli::topics::TopicsCommand),
    /// The run watchdog that `herald serve` starts for itself (internal):
    /// kills the process groups named on its command line and on stdin
    /// (`+PGID` / `-PGID` lines) when stdin closes.
    #[command(name = "watch-runs", hide = true)]
    WatchRuns {
        /// The groups live when it was started (`+PGID`).
        groups: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    without_huge_pages();
    let cli = Cli::parse();
    // The demo's dead events are expected: keep its screen for the summary.
    let default_level = match cli.command {
        Command::Demo(_) => "error",
        Command::Migrate(_) => "warn",
        Command::Serve(_) | Command::WatchRuns { .. } => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
        // async-nats traces the CONNECT message, password and token included;
        // that module only traces, so this keeps it quiet at any HERALD_LOG.
        .add_directive(
            "async_nats::connection=debug"
                .parse()
                .expect("a valid directive"),
        );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Command::WatchRuns { groups } = &cli.command {
        // Single-threaded, before any runtime: it blocks signals for itself.
        return runners::watchdog::watch_runs(groups);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result: Result<(), (u8, String)> = runtime.block_on(async {
        use cli::rules::{run as rule, Kind};
        let other = |e: String| (1, e);
        let exit = |r: Result<(), cli::Failure>| r.map_err(|f| (f.code, f.message));
        match cli.command {
            Command::Demo(args) => demo::run(args).await.map_err(|e| other(e.to_string())),
            Command::Migrate(args) => migrate::run(args).await.map_err(|e| other(e.to_string())),
            Command::Serve(args) => serve::run(args).await.map_err(|e| other(e.to_string())),
            Command::Emit(args) => exit(cli::emit::run(args).await),
            Command::Events(command) => exit(cli::events::run(command).await),
            Command::Schedules(command) => exit(cli::schedules::run(command).await),
            Command::Limits(command) => exit(cli::limits::run(command).await),
            Command::Pause(args) => exit(rule(Kind::Pause, true, args).await),
            Command::Unpause(args) => exit(rule(Kind::Pause, false, args).await),
            Command::Block(args) => exit(rule(Kind::Block, true, args).await),
            Command::Unblock(args) => exit(rule(Kind::Block, false, args).await),
            Command::Stats(args) => exit(cli::stats::run(args).await),
            Command::Topics(command) => exit(cli::topics::run(command).await),
            Command::WatchRuns { .. } => unreachable!("run before the runtime"),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("herald: {e}");
            std::process::ExitCode::from(code)
        }
    }
}
