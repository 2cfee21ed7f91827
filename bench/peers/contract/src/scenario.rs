//! The contract's flags and its three scenarios (drain, latency, idle), the
//! paced producer and the result line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use futures::StreamExt as _;
use serde_json::{json, Value};

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

/// Which scenario to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
    Drain,
    Latency,
    Idle,
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
    /// drain: runnable no-op jobs.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// drain: jobs stored a day ahead, before the runnable ones.
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// latency: jobs offered per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// latency: seconds of offering (default 20); idle: seconds idle (default 60).
    #[arg(long)]
    seconds: Option<f64>,
    /// Run `sh -c "CMD PHASE"` at each phase.
    #[arg(long)]
    hook: Option<String>,
}

pub(crate) async fn run<P: Peer>(args: &Args) -> Result<Value> {
    let tally = Arc::new(Tally::default());
    let peer = P::install(&args.url, tally.clone()).await?;
    let hook = args.hook.as_deref();
    let mut result = match args.scenario {
        Scenario::Drain => drain(peer, &tally, args.events, args.backlog, hook).await?,
        Scenario::Latency => {
            latency(peer, &tally, args.rate, args.seconds.unwrap_or(20.0), hook).await?
        }
        Scenario::Idle => idle(peer, &tally, args.seconds.unwrap_or(60.0), hook).await?,
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
    hook::run(hook, "drain-end").await?;
    hook::finish(mid).await?;

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

async fn latency<P: Peer>(
    mut peer: P,
    tally: &Tally,
    rate: u64,
    seconds: f64,
    hook: Option<&str>,
) -> Result<Value> {
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
    let window_end = offer_start + Duration::from_secs_f64(seconds);
    let mut offered = 0u64;
    {
        let peer_ref = &peer;
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
    let completed = tally.count();
    let knobs = peer.knobs();
    stop(peer, tally).await?;
    let lat = tally.latencies_sorted();
    Ok(json!({
        "scenario": "latency",
        "seconds": seconds,
        "knobs": knobs,
        "offered": offered,
        "completed": completed,
        "rate": rate,
        "achieved_rate": round3(achieved_rate),
        "latency_ms": {
            "p50": percentile_ms(&lat, 0.50),
            "p99": percentile_ms(&lat, 0.99),
            "max": percentile_ms(&lat, 1.0),
        },
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

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
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
}
