//! The `herald` program.
#![forbid(unsafe_code)]

mod demo;
mod handlers;
mod migrate;
mod serve;

use clap::{Parser, Subcommand};

/// herald: a durable event queue. The database stores, the queue schedules.
#[derive(Parser)]
#[command(name = "herald", version, about)]
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The demo's dead events are expected: keep its screen for the summary.
    let default_level = match cli.command {
        Command::Demo(_) => "error",
        Command::Migrate(_) => "warn",
        Command::Serve(_) => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("herald: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo::run(args).await.map_err(|e| e.to_string()),
            Command::Migrate(args) => migrate::run(args).await.map_err(|e| e.to_string()),
            Command::Serve(args) => serve::run(args).await.map_err(|e| e.to_string()),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
