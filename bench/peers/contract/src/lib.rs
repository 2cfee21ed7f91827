//! The Rust peers' side of the contract in `bench/peers/README.md`.
//!
//! A peer implements [`Peer`] (how its system installs its schema, stores a
//! batch of jobs, starts and stops its workers and inserts one job) and calls
//! [`main`]; the flags, the scenarios (drain, latency, idle, long-horizon,
//! rescue), the hooks, the paced producer, the percentiles and the result
//! line are here, once, so every Rust peer is measured the same way.
//!
//! A handler calls [`Tally::ran`] first thing with the job's `seq` and
//! `t_us`, then awaits [`Tally::work`] (the long horizon's `--work-ms`, the
//! rescue victim's never-ending work, nothing otherwise) and returns.

mod hook;
mod scenario;
mod tally;

use std::future::Future;

pub use anyhow::{anyhow, bail, Context, Result};
pub use serde_json::{json, Value};
pub use tally::{epoch_micros, Tally};

/// One job as every peer stores it: its sequence number and, in the latency
/// and long-horizon scenarios, the epoch microseconds taken just before its
/// insert call (0 otherwise). The handler passes both to [`Tally::ran`].
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// Position in the run, from 0.
    pub seq: u64,
    /// Epoch microseconds just before the insert call, or 0.
    pub t_us: i64,
}

/// When a stored job becomes runnable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Runnable at once.
    Now,
    /// The backlog: scheduled a day ahead.
    InADay,
}

/// One other queue, as the scenarios drive it. Each method is called once
/// per run, in the order given, except [`Peer::insert`], which the latency
/// and long-horizon scenarios call concurrently (at most 32 in flight).
pub trait Peer: Sized {
    /// The system's name in the results ("awa").
    const SYSTEM: &'static str;
    /// The system's version, as its own package names it.
    const VERSION: &'static str;

    /// Connects to the peer's database and installs the system's schema
    /// (its own migrations). The database is fresh, except for the rescue's
    /// rescuer, which finds the victim's schema and jobs there: the install
    /// must then leave them be (`IF NOT EXISTS`, or whatever the system's
    /// own migrations do when run twice). Handlers report each run to
    /// `tally`.
    fn install(url: &str, tally: std::sync::Arc<Tally>) -> impl Future<Output = Result<Self>>;

    /// Every knob the peer sets, written into the result, with
    /// `rescue_after_s` (after how long the system, at its default, gives a
    /// dead worker's job to another worker; null when it never does) and
    /// `rescue_setting` (which setting decides it).
    fn knobs(&self) -> Value;

    /// Stores `jobs` (untimed) with the system's own bulk insert where it
    /// has one.
    fn store(&self, jobs: std::ops::Range<u64>, due: Due) -> impl Future<Output = Result<()>>;

    /// Starts the workers and returns once they are started (a drain's
    /// clock runs meanwhile, so no settling sleep: the latency scenario
    /// gives them a second before it offers). A worker task that fails
    /// reports it through [`Tally::watch`] or [`Tally::fail`].
    fn start(&mut self) -> impl Future<Output = Result<()>>;

    /// Inserts one runnable job with one call of the system's insert API.
    fn insert(&self, job: Job) -> impl Future<Output = Result<()>>;

    /// Stops the workers gracefully.
    fn stop(self) -> impl Future<Output = Result<()>>;

    /// After the drain: the runnable jobs the system itself says are left,
    /// when it can say so cheaply (`None` otherwise).
    fn left_runnable(&self) -> impl Future<Output = Result<Option<u64>>> {
        async { Ok(None) }
    }
}

/// Parses the contract's flags, runs the scenario on a multi-threaded tokio
/// runtime, prints the result as the last stdout line and exits non-zero
/// with the reason on stderr on any failure.
pub fn main<P: Peer>() -> std::process::ExitCode {
    use clap::Parser as _;
    let args = scenario::Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("[{}] error: starting the tokio runtime: {e}", P::SYSTEM);
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(scenario::run::<P>(&args)) {
        Ok(result) => {
            println!("{result}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("[{}] error: {e:#}", P::SYSTEM);
            std::process::ExitCode::FAILURE
        }
    }
}

/// A log line on stderr, prefixed with the system's name.
pub fn log<P: Peer>(msg: impl std::fmt::Display) {
    eprintln!("[{}] {msg}", P::SYSTEM);
}
