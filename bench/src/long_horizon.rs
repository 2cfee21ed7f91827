//! The long-horizon run (issue 11): a fixed-rate producer and one worker
//! on PostgreSQL for minutes, sampled every `--sample` seconds: completions
//! per second, claim latency (emit to handler start) p50/p99, queue depth,
//! the events table's dead tuples and size (table, indexes and TOAST), and
//! when autovacuum and autoanalyze ran. Phases: clean; a transaction held
//! open for `--hold` seconds from `--hold-at`; recovery. Writes a CSV and an
//! SVG chart, and prints a summary: the 10-second windows below 90% of the
//! offered rate beside the autovacuum/autoanalyze runs, the largest dead
//! tuple count and size, claim p99 per phase.
//!
//! Meant for a throwaway cluster configured like a production server
//! (`bench/long-horizon.sh` makes one); the shared server runs with
//! autovacuum off, which is no place for this.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use herald::{Client, Context, EmitOptions, EmitRequest, MemoryQueue, Store, Worker};
use herald_postgres::PgStore;
use plotters::prelude::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

#[derive(Parser)]
struct Args {
    /// The database (a throwaway cluster's).
    #[arg(long)]
    store: String,
    /// herald's schema (dropped first; kept afterwards for inspection).
    #[arg(long, default_value = "herald")]
    schema: String,
    /// Events offered per second.
    #[arg(long, default_value_t = 9000)]
    rate: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 300)]
    duration: u64,
    /// Handlers running at once.
    #[arg(long, default_value_t = 32)]
    handlers: usize,
    /// Events the worker claims ahead of free handler slots (default: the
    /// worker's, as many as `--handlers`; 0: claim only for free slots).
    #[arg(long)]
    claim_ahead: Option<usize>,
    /// Milliseconds each handler takes.
    #[arg(long, default_value_t = 1)]
    work_ms: u64,
    /// Events per emit.
    #[arg(long, default_value_t = 128)]
    emit_batch: usize,
    /// Payload bytes.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// When the held transaction starts, in seconds (default: a third in).
    #[arg(long)]
    hold_at: Option<u64>,
    /// How long the transaction is held, in seconds (0: no hold phase).
    #[arg(long, default_value_t = 120)]
    hold: u64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 5)]
    sample: u64,
    /// Connections in the store's pool.
    #[arg(long, default_value_t = 16)]
    pool: u32,
    /// Where the CSV goes.
    #[arg(long, default_value = "long-horizon.csv")]
    csv: PathBuf,
    /// Where the chart goes (SVG).
    #[arg(long, default_value = "long-horizon.svg")]
    chart: PathBuf,
    /// A label for the chart's title (for example the commit).
    #[arg(long, default_value = "")]
    label: String,
}

/// One sample.
#[derive(Clone, Debug, Default)]
struct Sample {
    t: f64,
    phase: &'static str,
    offered: f64,
    completed: f64,
    p50_ms: f64,
    p99_ms: f64,
    depth: i64,
    dead_tuples: i64,
    live_tuples: i64,
    size_mb: f64,
    autovacuums: i64,
    autoanalyzes: i64,
    last_autovacuum: String,
    last_autoanalyze: String,
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// The value at quantile `q` of sorted `v` (0 when empty).
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The events table as pg_stat_user_tables and the size functions see it:
/// every leaf of it summed, the newest autovacuum of any.
async fn table_stats(
    conn: &mut PgConnection,
    schema: &str,
) -> (i64, i64, f64, i64, i64, String, String) {
    sqlx::query_as(
        "SELECT sum(n_dead_tup)::int8, sum(n_live_tup)::int8, \
                sum(pg_total_relation_size(relid))::float8 / 1048576, \
                sum(autovacuum_count)::int8, sum(autoanalyze_count)::int8, \
                coalesce(to_char(max(last_autovacuum), 'HH24:MI:SS'), ''), \
                coalesce(to_char(max(last_autoanalyze), 'HH24:MI:SS'), '') \
         FROM pg_stat_user_tables WHERE relid IN \
           (SELECT relid FROM pg_partition_tree(format('%I.events', $1::text)::regclass))",
    )
    .bind(schema)
    .fetch_one(conn)
    .await
    .expect("events statistics")
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    let options: PgConnectOptions = args.store.parse().expect("a PostgreSQL URL");
    let mut admin = PgConnection::connect_with(&options)
        .await
        .expect("connect to PostgreSQL");
    let quoted = format!("\"{}\"", args.schema.replace('"', "\"\""));
    admin
        .execute(format!("DROP SCHEMA IF EXISTS {quoted} CASCADE").as_str())
        .await
        .expect("drop the schema");
    herald_postgres::migrate(&args.store, &args.schema)
        .await
        .expect("migrate");
    let store = PgStore::connect_with(
        PgPoolOptions::new().max_connections(args.pool),
        options.clone(),
        &args.schema,
    )
    .await
    .expect("connect the store");
    let store: Arc<dyn Store> = Arc::new(store);
    let queue = Arc::new(MemoryQueue::default());
    let client = Client::new(store.clone(), queue.clone());

    // Claim latencies (µs) of the current sample.
    let latencies: Arc<Mutex<Vec<u64>>> = Arc::default();
    let work = Duration::from_millis(args.work_ms);
    let lat = latencies.clone();
    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("work", move |p: serde_json::Value, _cx: Context| {
            let lat = lat.clone();
            async move {
                let emitted = p["t"].as_u64().unwrap_or(0);
                let waited = micros_now().saturating_sub(emitted);
                lat.lock().expect("latencies").push(waited);
                tokio::time::sleep(work).await;
            }
        })
        .configure(|c| {
            c.concurrency = args.handlers;
            c.claim_ahead = args.claim_ahead;
        })
        .start();

    // The producer: a batch every emit_batch / rate seconds, each emit on a
    // task of its own (up to 16 at once) so that a slow emit does not lower
    // the offered rate.
    let offered = Arc::new(AtomicU64::new(0));
    let emit_errors = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_secs(args.duration);
    let producer = {
        let client = client.clone();
        let offered = offered.clone();
        let emit_errors = emit_errors.clone();
        let batch = args.emit_batch;
        let pad = "x".repeat(args.payload_bytes.saturating_sub(40));
        let every = Duration::from_secs_f64(batch as f64 / args.rate as f64);
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(16));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let start = Instant::now();
            while start.elapsed() < run_for {
                tick.tick().await;
                let t = micros_now();
                let requests: Vec<EmitRequest> = (0..batch)
                    .map(|_| EmitRequest {
                        tenant: "bench".into(),
                        handler: "work".into(),
                        payload: format!(r#"{{"t":{t},"pad":"{pad}"}}"#),
                        options: EmitOptions::default(),
                    })
                    .collect();
                offered.fetch_add(batch as u64, Ordering::Relaxed);
                let permit = slots.clone().acquire_owned().await.expect("semaphore");
                let client = client.clone();
                let emit_errors = emit_errors.clone();
                tokio::spawn(async move {
                    if client.emit_batch(requests).await.is_err() {
                        emit_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(permit);
                });
            }
        })
    };

    let hold_at = Duration::from_secs(args.hold_at.unwrap_or(args.duration / 3));
    let hold_for = Duration::from_secs(args.hold);
    let mut held: Option<PgConnection> = None;
    let mut samples: Vec<Sample> = Vec::new();
    let start = Instant::now();
    let mut last = (0.0f64, 0u64, 0u64);
    let mut tick = tokio::time::interval(Duration::from_secs(args.sample));
    tick.tick().await;
    println!("t_s,phase,offered_per_s,completed_per_s,claim_p50_ms,claim_p99_ms,queue_depth,dead_tuples,live_tuples,events_mb,autovacuum_count,autoanalyze_count,last_autovacuum,last_autoanalyze");
    while start.elapsed() < run_for {
        tick.tick().await;
        let now = start.elapsed();
        if args.hold > 0 && held.is_none() && now >= hold_at && now < hold_at + hold_for {
            let mut c = PgConnection::connect_with(&options).await.expect("connect");
            c.execute("BEGIN").await.expect("begin");
            sqlx::query("SELECT txid_current()")
                .execute(&mut c)
                .await
                .expect("txid_current");
            eprintln!("{:.0}s: holding a transaction open", now.as_secs_f64());
            held = Some(c);
        }
        if now >= hold_at + hold_for {
            if let Some(mut c) = held.take() {
                c.execute("ROLLBACK").await.expect("rollback");
                let _ = c.close().await;
                eprintln!("{:.0}s: released the held transaction", now.as_secs_f64());
            }
        }
        let phase = if held.is_some() {
            "held"
        } else if now < hold_at || args.hold == 0 {
            "clean"
        } else {
            "recovery"
        };
        let t = now.as_secs_f64();
        let offered_now = offered.load(Ordering::Relaxed);
        let done = worker.stats().done;
        let mut lat = std::mem::take(&mut *latencies.lock().expect("latencies"));
        lat.sort_unstable();
        let (dead, live, mb, av, aa, lav, laa) = table_stats(&mut admin, &args.schema).await;
        let dt = t - last.0;
        let s = Sample {
            t,
            phase,
            offered: (offered_now - last.1) as f64 / dt,
            completed: (done - last.2) as f64 / dt,
            p50_ms: quantile(&lat, 0.5) as f64 / 1000.0,
            p99_ms: quantile(&lat, 0.99) as f64 / 1000.0,
            depth: offered_now as i64 - done as i64,
            dead_tuples: dead,
            live_tuples: live,
            size_mb: mb,
            autovacuums: av,
            autoanalyzes: aa,
            last_autovacuum: lav,
            last_autoanalyze: laa,
        };
        last = (t, offered_now, done);
        println!(
            "{:.1},{},{:.0},{:.0},{:.2},{:.2},{},{},{},{:.1},{},{},{},{}",
            s.t,
            s.phase,
            s.offered,
            s.completed,
            s.p50_ms,
            s.p99_ms,
            s.depth,
            s.dead_tuples,
            s.live_tuples,
            s.size_mb,
            s.autovacuums,
            s.autoanalyzes,
            s.last_autovacuum,
            s.last_autoanalyze
        );
        samples.push(s);
    }
    if let Some(mut c) = held.take() {
        let _ = c.execute("ROLLBACK").await;
    }
    let _ = producer.await;
    worker.shutdown(Duration::from_secs(10)).await;
    write_csv(&args.csv, &samples);
    draw(&args.chart, &samples, &args).expect("draw the chart");
    summary(
        &samples,
        args.rate as f64,
        args.sample,
        emit_errors.load(Ordering::Relaxed),
    );
    let _ = admin.close().await;
}

fn write_csv(path: &PathBuf, samples: &[Sample]) {
    let mut out = String::from("t_s,phase,offered_per_s,completed_per_s,claim_p50_ms,claim_p99_ms,queue_depth,dead_tuples,live_tuples,events_mb,autovacuum_count,autoanalyze_count,last_autovacuum,last_autoanalyze\n");
    for s in samples {
        out.push_str(&format!(
            "{:.1},{},{:.0},{:.0},{:.2},{:.2},{},{},{},{:.1},{},{},{},{}\n",
            s.t,
            s.phase,
            s.offered,
            s.completed,
            s.p50_ms,
            s.p99_ms,
            s.depth,
            s.dead_tuples,
            s.live_tuples,
            s.size_mb,
            s.autovacuums,
            s.autoanalyzes,
            s.last_autovacuum,
            s.last_autoanalyze
        ));
    }
    std::fs::write(path, out).expect("write the CSV");
}

/// The run's findings against the issue's targets.
fn summary(samples: &[Sample], rate: f64, sample_s: u64, emit_errors: u64) {
    let per_window = (10 / sample_s.max(1)).max(1) as usize;
    println!("== summary (offered {rate:.0}/s; emit errors {emit_errors})");
    let mut dips = 0;
    for w in samples.windows(per_window) {
        let completed: f64 = w.iter().map(|s| s.completed).sum::<f64>() / w.len() as f64;
        if completed < 0.9 * rate {
            dips += 1;
            let last = w.last().expect("a window");
            println!(
                "dip: 10 s ending at {:.0}s ({}): {:.0}/s ({:.0}% of offered); last autovacuum {} (count {}), last autoanalyze {} (count {})",
                last.t,
                last.phase,
                completed,
                100.0 * completed / rate,
                last.last_autovacuum,
                last.autovacuums,
                last.last_autoanalyze,
                last.autoanalyzes
            );
        }
    }
    println!("10-second windows below 90% of offered: {dips}");
    for phase in ["clean", "held", "recovery"] {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.phase == phase).collect();
        if of.is_empty() {
            continue;
        }
        let max = |f: &dyn Fn(&Sample) -> f64| of.iter().map(|s| f(s)).fold(0.0, f64::max);
        println!(
            "{phase}: samples {}, claim p99 max {:.1} ms, p50 max {:.1} ms, dead tuples max {:.0}, events MB max {:.1}, queue depth max {:.0}, completed/s mean {:.0}",
            of.len(),
            max(&|s| s.p99_ms),
            max(&|s| s.p50_ms),
            max(&|s| s.dead_tuples as f64),
            max(&|s| s.size_mb),
            max(&|s| s.depth as f64),
            of.iter().map(|s| s.completed).sum::<f64>() / of.len() as f64
        );
    }
    if let Some(s) = samples.last() {
        println!(
            "autovacuum runs {} (last {}), autoanalyze runs {} (last {})",
            s.autovacuums, s.last_autovacuum, s.autoanalyzes, s.last_autoanalyze
        );
    }
}

/// Four panels over time: completed and offered per second; claim p50/p99;
/// dead tuples and queue depth; events MB. Autovacuum runs are marked on
/// each (a vertical line where the count grew).
fn draw(path: &PathBuf, samples: &[Sample], args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 1100)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "herald long horizon: {}/s, {} handlers of {} ms, hold {} s {}",
        args.rate, args.handlers, args.work_ms, args.hold, args.label
    );
    let (top, body) = root.split_vertically(40);
    top.titled(&title, ("sans-serif", 20))?;
    let panels = body.split_evenly((4, 1));
    let t_max = samples.last().map_or(1.0, |s| s.t);
    let vacuums: Vec<f64> = samples
        .windows(2)
        .filter(|w| w[1].autovacuums > w[0].autovacuums)
        .map(|w| w[1].t)
        .collect();
    let analyzes: Vec<f64> = samples
        .windows(2)
        .filter(|w| w[1].autoanalyzes > w[0].autoanalyzes)
        .map(|w| w[1].t)
        .collect();
    type Series<'a> = Vec<(&'a str, RGBColor, Box<dyn Fn(&Sample) -> f64>)>;
    let specs: Vec<(&str, Series)> = vec![
        (
            "events/s",
            vec![
                ("completed/s", BLUE, Box::new(|s: &Sample| s.completed)),
                ("offered/s", BLACK, Box::new(|s: &Sample| s.offered)),
            ],
        ),
        (
            "claim latency ms",
            vec![
                ("p99", RED, Box::new(|s: &Sample| s.p99_ms)),
                ("p50", BLUE, Box::new(|s: &Sample| s.p50_ms)),
            ],
        ),
        (
            "rows",
            vec![
                (
                    "dead tuples",
                    RED,
                    Box::new(|s: &Sample| s.dead_tuples as f64),
                ),
                ("queue depth", BLUE, Box::new(|s: &Sample| s.depth as f64)),
            ],
        ),
        (
            "events MB (table+indexes+TOAST)",
            vec![("MB", MAGENTA, Box::new(|s: &Sample| s.size_mb))],
        ),
    ];
    for (area, (caption, series)) in panels.iter().zip(specs) {
        let y_max = series
            .iter()
            .flat_map(|(_, _, f)| samples.iter().map(f))
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
        chart.configure_mesh().x_desc("s").draw()?;
        for &t in &vacuums {
            chart.draw_series(LineSeries::new([(t, 0.0), (t, y_max)], GREEN.mix(0.6)))?;
        }
        for &t in &analyzes {
            chart.draw_series(LineSeries::new([(t, 0.0), (t, y_max)], CYAN.mix(0.6)))?;
        }
        for (name, color, f) in series {
            chart
                .draw_series(LineSeries::new(samples.iter().map(|s| (s.t, f(s))), color))?
                .label(name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
