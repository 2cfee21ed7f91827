//! The contract's flags and its scenarios (drain, latency, idle,
//! long-horizon, rescue), the paced producer and the result line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use futures::StreamExt as _;
use serde_json::{json, Value};

use crate::tally::Mode;
use crate::{hook, log, Due, Job, Peer, Tally};

/// A drain that has not finished by then is a failure.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// `run-end` comes at the last offered job, or this long after offering.
const LATENCY_GRACE: Duration = Duration::from_secs(60);
/// Concurrent insert calls in the latency scenario.
const IN_FLIGHT: usize = 32;
/// The idle scenario's warm-up before `idle-start`.
const IDLE_WARMUP: Duration = Duration::from_secs(5);
/// After the workers start and before the latency scenario offers its
/// first job: time for them to reach their idle wait (LISTEN set up, first
/// empty claim made). Not in a drain's timed span.
const SETTLE: Duration = Duration::from_secs(1);
/// Jobs per [`Peer::store`] call.
const STORE_CHUNK: u64 = 5_000;
/// The rescue's victim: its handlers are taken to be all busy once the
/// count of started ones has not moved for this long.
const VICTIM_STEADY: Duration = Duration::from_secs(1);
/// The rescue's victim never ends by itself before this (the driver kills it).
const VICTIM_LIMIT: Duration = Duration::from_secs(600);

/// Which scenario to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
    Drain,
    Latency,
    Idle,
    LongHorizon,
    Rescue,
}

/// Which of the rescue's two processes this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// Stores the jobs, takes them and is killed holding them.
    Victim,
    /// Runs on the same database after the kill, until every job has run.
    Rescuer,
}

/// The contract's flags (`bench/peers/README.md`).
#[derive(clap::Parser, Debug)]
#[command(about = "herald benchmark peer (bench/peers/README.md)")]
pub(crate) struct Args {
    /// The peer's own PostgreSQL database, fresh and empty.
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// drain: runnable no-op jobs; rescue: jobs the victim stores.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// drain: jobs stored a day ahead, before the runnable ones.
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// latency, long-horizon: jobs offered per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// latency: seconds of offering (default 20); long-horizon: the same
    /// (default 600); idle: seconds idle (default 60).
    #[arg(long)]
    seconds: Option<f64>,
    /// long-horizon: milliseconds each handler works after its start.
    #[arg(long, default_value_t = 1.0)]
    work_ms: f64,
    /// long-horizon: seconds per window of the per-window figures.
    #[arg(long, default_value_t = 10.0)]
    window: f64,
    /// rescue: which of the two processes this is.
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// rescue (rescuer): epoch milliseconds at which the victim was killed.
    #[arg(long)]
    killed_at: Option<i64>,
    /// rescue (rescuer): seconds to wait for the jobs after the workers start.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
    /// Run `sh -c "CMD PHASE"` at each phase.
    #[arg(long)]
    hook: Option<String>,
}

pub(crate) async fn run<P: Peer>(args: &Args) -> Result<Value> {
    let mode = match (args.scenario, args.role) {
        (Scenario::LongHorizon, _) => {
            if !(args.work_ms >= 0.0 && args.work_ms.is_finite()) {
                bail!("--work-ms must be a number >= 0");
            }
            Mode::Work(Duration::from_secs_f64(args.work_ms / 1000.0))
        }
        (Scenario::Rescue, Some(Role::Victim)) => Mode::Victim,
        (Scenario::Rescue, Some(Role::Rescuer)) if args.killed_at.is_none() => {
            bail!("--role rescuer needs --killed-at EPOCH_MS")
        }
        (Scenario::Rescue, Some(Role::Rescuer)) => Mode::Rescuer,
        (Scenario::Rescue, None) => bail!("--scenario rescue needs --role victim|rescuer"),
        _ => Mode::Plain,
    };
    let tally = Arc::new(Tally::new(mode));
    let peer = P::install(&args.url, tally.clone()).await?;
    let hook = args.hook.as_deref();
    let mut result = match args.scenario {
        Scenario::Drain => drain(peer, &tally, args.events, args.backlog, hook).await?,
        Scenario::Latency => {
            latency(peer, &tally, args.rate, args.seconds.unwrap_or(20.0), hook).await?
        }
        Scenario::Idle => idle(peer, &tally, args.seconds.unwrap_or(60.0), hook).await?,
        Scenario::LongHorizon => {
            let seconds = args.seconds.unwrap_or(600.0);
            long_horizon(peer, &tally, args.rate, seconds, args, hook).await?
        }
        Scenario::Rescue => match args.role {
            Some(Role::Victim) => victim(peer, &tally, args.events, hook).await?,
            _ => {
                let killed_at = args
                    .killed_at
                    .ok_or_else(|| anyhow!("--role rescuer needs --killed-at EPOCH_MS"))?;
                rescuer(peer, &tally, args.events, killed_at, args.timeout, hook).await?
            }
        },
    };
    result["system"] = json!(P::SYSTEM);
    result["version"] = json!(P::VERSION);
    Ok(result)
}

/// Waits for `until` (or `deadline`): `Ok(false)` at the deadline, an error
/// when a worker failed first.
async fn wait(
    tally: &Tally,
    until: &tokio::sync::Notify,
    deadline: tokio::time::Instant,
) -> Result<bool> {
    if let Some(why) = tally.failure() {
        bail!(why);
    }
    tokio::select! {
        _ = until.notified() => Ok(true),
        _ = tally.failed.notified() => Err(anyhow!(tally.failure().unwrap_or_default())),
        _ = tokio::time::sleep_until(deadline) => Ok(false),
    }
}

/// Sleeps `for_`, ending early with the failure of a worker.
async fn idle_for(tally: &Tally, for_: Duration) -> Result<()> {
    let never = tokio::sync::Notify::new();
    wait(tally, &never, tokio::time::Instant::now() + for_)
        .await
        .map(|_| ())
}

async fn stop<P: Peer>(peer: P, tally: &Tally) -> Result<()> {
    tally.stopping();
    peer.stop().await?;
    match tally.failure() {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

async fn store<P: Peer>(peer: &P, count: u64, due: Due) -> Result<()> {
    let mut from = 0;
    while from < count {
        let to = (from + STORE_CHUNK).min(count);
        peer.store(from..to, due).await?;
        from = to;
    }
    Ok(())
}

async fn drain<P: Peer>(
    mut peer: P,
    tally: &Tally,
    events: u64,
    backlog: u64,
    hook: Option<&str>,
) -> Result<Value> {
    let t = Instant::now();
    store(&peer, backlog, Due::InADay).await?;
    log::<P>(format_args!(
        "{backlog} backlog jobs stored in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    hook::run(hook, "after-backlog").await?;
    let t = Instant::now();
    store(&peer, events, Due::Now).await?;
    log::<P>(format_args!(
        "{events} runnable jobs stored in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    hook::run(hook, "drain-start").await?;

    tally.expect(events.div_ceil(2), events);
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
    let timeout = || {
        anyhow!(
            "drain not done in {} s: {} of {events} jobs ran",
            DRAIN_LIMIT.as_secs(),
            tally.count()
        )
    };
    peer.start().await?;
    if events > 0 && !wait(tally, &tally.half, deadline).await? {
        return Err(timeout());
    }
    let mid = hook::start(hook, "mid-drain")?;
    if events > 0 && !wait(tally, &tally.done, deadline).await? {
        return Err(timeout());
    }
    let seconds = started.elapsed().as_secs_f64();
    log::<P>(format_args!("{} jobs ran in {seconds:.3} s", tally.count()));
    // What mid-drain started (the mid-analyze case's ANALYZE) ends inside
    // the timed phases, so the readings at drain-end hold all its CPU.
    hook::finish(mid).await?;
    hook::run(hook, "drain-end").await?;

    let knobs = peer.knobs();
    let left = peer.left_runnable().await?;
    if let Some(n) = left.filter(|n| *n > 0) {
        bail!("the drain counted {events} runs, but the system says {n} runnable jobs are left");
    }
    stop(peer, tally).await?;
    Ok(json!({
        "scenario": "drain",
        "events": events,
        "backlog": backlog,
        "seconds": round3(seconds),
        "events_per_s": if seconds > 0.0 { (events as f64 / seconds).round() } else { 0.0 },
        "left_runnable": left,
        "knobs": knobs,
    }))
}

/// What the paced producer did.
struct Offered {
    offered: u64,
    /// Seconds of offering.
    offering: f64,
    /// Epoch µs at which offering began.
    t0_us: i64,
}

/// The latency and long-horizon runs up to `run-end`: starts the workers,
/// settles, runs `run-start`, offers `rate` jobs a second for `seconds`,
/// waits for the last offered one to run (or [`LATENCY_GRACE`]) and runs
/// `run-end`.
async fn paced<P: Peer>(
    peer: &mut P,
    tally: &Tally,
    rate: u64,
    seconds: f64,
    hook: Option<&str>,
) -> Result<Offered> {
    if rate == 0 || seconds <= 0.0 {
        bail!("--rate and --seconds must be positive");
    }
    let due = (rate as f64 * seconds).round() as u64;
    peer.start().await?;
    idle_for(tally, SETTLE).await?;
    hook::run(hook, "run-start").await?;

    // One insert call per job, each started at its time, at most IN_FLIGHT
    // at once: a slow insert delays the next ones rather than piling up.
    // Offering ends with its window: a system that cannot take `rate` is
    // offered fewer jobs (the achieved rate says how many), not for longer.
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let offer_start = tokio::time::Instant::now();
    let t0_us = crate::epoch_micros();
    let window_end = offer_start + Duration::from_secs_f64(seconds);
    let mut offered = 0u64;
    {
        let peer_ref = &*peer;
        let inserts = futures::stream::iter(0..due)
            .then(|seq| async move {
                tokio::time::sleep_until(offer_start + period.mul_f64(seq as f64)).await;
                seq
            })
            .take_while(|_| std::future::ready(tokio::time::Instant::now() <= window_end))
            .map(|seq| async move {
                peer_ref
                    .insert(Job {
                        seq,
                        t_us: crate::epoch_micros(),
                    })
                    .await
            })
            .buffer_unordered(IN_FLIGHT);
        futures::pin_mut!(inserts);
        while let Some(inserted) = inserts.next().await {
            inserted?;
            offered += 1;
            if let Some(why) = tally.failure() {
                bail!(why);
            }
        }
    }
    let offering = offer_start.elapsed().as_secs_f64();
    tally.expect(0, offered);
    let achieved_rate = offered as f64 / offering;
    log::<P>(format_args!(
        "offered {offered} jobs in {offering:.3} s ({achieved_rate:.1}/s)"
    ));

    if tally.count() < offered
        && !wait(
            tally,
            &tally.done,
            tokio::time::Instant::now() + LATENCY_GRACE,
        )
        .await?
    {
        log::<P>(format_args!(
            "warning: {} of {offered} offered jobs ran within {} s of offering's end",
            tally.count(),
            LATENCY_GRACE.as_secs()
        ));
    }
    hook::run(hook, "run-end").await?;
    Ok(Offered {
        offered,
        offering,
        t0_us,
    })
}

async fn latency<P: Peer>(
    mut peer: P,
    tally: &Tally,
    rate: u64,
    seconds: f64,
    hook: Option<&str>,
) -> Result<Value> {
    let run = paced(&mut peer, tally, rate, seconds, hook).await?;
    let completed = tally.count();
    let knobs = peer.knobs();
    stop(peer, tally).await?;
    let lat = tally.latencies_sorted();
    Ok(json!({
        "scenario": "latency",
        "seconds": seconds,
        "knobs": knobs,
        "offered": run.offered,
        "completed": completed,
        "rate": rate,
        "achieved_rate": round3(run.offered as f64 / run.offering),
        "latency_ms": percentiles(&lat),
    }))
}

/// The latency scenario's producer for a long time, to handlers that work
/// `--work-ms` after recording their start, with per-window figures.
async fn long_horizon<P: Peer>(
    mut peer: P,
    tally: &Tally,
    rate: u64,
    seconds: f64,
    args: &Args,
    hook: Option<&str>,
) -> Result<Value> {
    if !(args.window > 0.0 && args.window.is_finite()) {
        bail!("--window must be positive");
    }
    let run = paced(&mut peer, tally, rate, seconds, hook).await?;
    let completed = tally.count();
    let mut knobs = peer.knobs();
    stop(peer, tally).await?;
    if let Some(k) = knobs.as_object_mut() {
        k.insert("window_s".into(), json!(args.window));
    }
    let lat = tally.latencies_sorted();
    let windows = tally.windows(run.t0_us, args.window);
    log::<P>(format_args!(
        "{completed} of {} ran; {} windows of {} s",
        run.offered,
        windows.len(),
        args.window
    ));
    Ok(json!({
        "scenario": "long-horizon",
        "rate": rate,
        "seconds": seconds,
        "work_ms": args.work_ms,
        "offered": run.offered,
        "completed": completed,
        "achieved_rate": round3(run.offered as f64 / run.offering),
        "latency_ms": percentiles(&lat),
        "windows": windows,
        "knobs": knobs,
    }))
}

/// The rescue's victim: stores `events` jobs, starts workers whose handlers
/// never return, says on stdout how many it holds once they are all busy,
/// and waits to be killed.
async fn victim<P: Peer>(
    mut peer: P,
    tally: &Tally,
    events: u64,
    hook: Option<&str>,
) -> Result<Value> {
    use std::io::Write as _;
    if events == 0 {
        bail!("--events must be positive");
    }
    let t = Instant::now();
    store(&peer, events, Due::Now).await?;
    log::<P>(format_args!(
        "{events} runnable jobs stored in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    peer.start().await?;
    let started = Instant::now();
    let (mut seen, mut since) = (0, Instant::now());
    let running = loop {
        if let Some(why) = tally.failure() {
            bail!(why);
        }
        let n = tally.count();
        if n >= events || (n > 0 && n == seen && since.elapsed() >= VICTIM_STEADY) {
            break n;
        }
        if n != seen {
            (seen, since) = (n, Instant::now());
        }
        if started.elapsed() >= VICTIM_LIMIT {
            bail!("no job started in {} s", VICTIM_LIMIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    log::<P>(format_args!("{running} of {events} jobs held"));
    hook::run(hook, "victim-running").await?;
    let line = json!({
        "system": P::SYSTEM,
        "version": P::VERSION,
        "scenario": "rescue",
        "role": "victim",
        "running": running,
        "events": events,
        "knobs": peer.knobs(),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    drop(out);
    idle_for(tally, VICTIM_LIMIT).await?;
    bail!(
        "the victim was not killed within {} s",
        VICTIM_LIMIT.as_secs()
    )
}

/// The rescue's rescuer: on the victim's database, runs workers until every
/// one of the `events` jobs has run once (or `timeout` seconds), and says
/// how long after the kill (`killed_at`, epoch ms) the system ran them.
async fn rescuer<P: Peer>(
    mut peer: P,
    tally: &Tally,
    events: u64,
    killed_at: i64,
    timeout: f64,
    hook: Option<&str>,
) -> Result<Value> {
    if !(timeout > 0.0 && timeout.is_finite()) {
        bail!("--timeout must be positive");
    }
    hook::run(hook, "rescue-start").await?;
    tally.expect(0, events);
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout);
    peer.start().await?;
    if tally.count() < events {
        wait(tally, &tally.done, deadline).await?;
    }
    let completed = tally.count().min(events);
    let timed_out = completed < events;
    hook::run(hook, "rescue-end").await?;
    log::<P>(format_args!(
        "{completed} of {events} jobs ran ({} runs){}",
        tally.starts(),
        if timed_out { ", timed out" } else { "" }
    ));
    let knobs = peer.knobs();
    stop(peer, tally).await?;
    let since_kill = |us: i64| round3((us as f64 / 1000.0 - killed_at as f64) / 1000.0);
    Ok(json!({
        "scenario": "rescue",
        "role": "rescuer",
        "events": events,
        "completed": completed,
        "rescue_s": if timed_out { None } else { tally.last_new_us().map(since_kill) },
        "first_s": tally.first_us().map(since_kill),
        "timed_out": timed_out,
        "timeout_s": timeout,
        "knobs": knobs,
    }))
}

async fn idle<P: Peer>(
    mut peer: P,
    tally: &Tally,
    seconds: f64,
    hook: Option<&str>,
) -> Result<Value> {
    if seconds < 0.0 {
        bail!("--seconds must not be negative");
    }
    peer.start().await?;
    idle_for(tally, IDLE_WARMUP).await?;
    hook::run(hook, "idle-start").await?;
    idle_for(tally, Duration::from_secs_f64(seconds)).await?;
    hook::run(hook, "idle-end").await?;
    let knobs = peer.knobs();
    stop(peer, tally).await?;
    Ok(json!({ "scenario": "idle", "seconds": seconds, "knobs": knobs }))
}

pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// `{"p50", "p99", "max"}` of sorted microseconds, in milliseconds (nulls
/// for no sample).
pub(crate) fn percentiles(sorted_us: &[i64]) -> Value {
    json!({
        "p50": percentile_ms(sorted_us, 0.50),
        "p99": percentile_ms(sorted_us, 0.99),
        "max": percentile_ms(sorted_us, 1.0),
    })
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile_ms(sorted_us: &[i64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = (q * sorted_us.len() as f64).ceil() as usize;
    Some(round3(
        sorted_us[rank.clamp(1, sorted_us.len()) - 1] as f64 / 1000.0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let us: Vec<i64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_ms(&us, 0.50), Some(50.0));
        assert_eq!(percentile_ms(&us, 0.99), Some(99.0));
        assert_eq!(percentile_ms(&us, 1.0), Some(100.0));
        assert_eq!(percentile_ms(&[1500], 0.5), Some(1.5));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }

    #[test]
    fn the_new_scenarios_parse_with_their_defaults() {
        use clap::Parser as _;
        let a = Args::try_parse_from(["p", "--url", "u", "--scenario", "long-horizon"]).unwrap();
        assert_eq!(a.scenario, Scenario::LongHorizon);
        assert_eq!((a.work_ms, a.window, a.timeout), (1.0, 10.0, 120.0));
        let a = Args::try_parse_from([
            "p",
            "--url",
            "u",
            "--scenario",
            "rescue",
            "--role",
            "rescuer",
            "--killed-at",
            "1700000000000",
            "--timeout",
            "20",
        ])
        .unwrap();
        assert_eq!(a.role, Some(Role::Rescuer));
        assert_eq!(a.killed_at, Some(1_700_000_000_000));
        assert_eq!(a.timeout, 20.0);
    }
}
