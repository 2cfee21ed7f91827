//! `report DIR`: the runs that `bench/compare.sh` left in `DIR/runs/` (each
//! system's JSON line, and the marks its hook took at each phase) turned
//! into one Markdown table, `DIR/report.md`, and SVG charts: the clean
//! drain's events/s per system, emit-to-start p50 against the offered
//! rate, and the long horizon's p99, dead tuples and size over time. A cell
//! run several times (`REPEAT`) is written as its median and range.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use clap::Parser;

mod chart;

/// The Markdown table and charts of a `bench/compare.sh` sitting.
#[derive(Parser, Debug)]
#[command(name = "report")]
struct ReportArgs {
    /// The directory `bench/compare.sh` wrote (its `OUT`).
    dir: PathBuf,
}

/// A file of the report that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
struct WriteError {
    /// The file.
    path: PathBuf,
    /// Why.
    reason: String,
}

fn main() -> std::process::ExitCode {
    match run(ReportArgs::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("report: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One reading of the hook: running totals at a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Mark {
    /// Wall clock, ms.
    wall_ms: f64,
    /// PostgreSQL's server CPU, ms.
    pg_cpu_ms: f64,
    /// Statements counted by pg_stat_statements in the run's database.
    statements: f64,
    /// The system's own process CPU, ms.
    peer_cpu_ms: f64,
    /// The nats-server's CPU, ms.
    broker_cpu_ms: f64,
    /// Shared buffers the counted statements hit or read in (0 in marks
    /// written before the hook counted them).
    buffers: f64,
}

/// Reads a marks file (`PHASE WALL PG STATEMENTS PEER BROKER [BUFFERS]`
/// per line); the last reading of each phase wins.
fn parse_marks(text: &str) -> BTreeMap<String, Mark> {
    let mut marks = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let n = |i: usize| f[i].parse::<f64>().unwrap_or(0.0);
        marks.insert(
            f[0].to_string(),
            Mark {
                wall_ms: n(1),
                pg_cpu_ms: n(2),
                statements: n(3),
                peer_cpu_ms: n(4),
                broker_cpu_ms: n(5),
                buffers: f.get(6).and_then(|v| v.parse().ok()).unwrap_or(0.0),
            },
        );
    }
    marks
}

/// What one run measured between its timed phases.
#[derive(Debug)]
struct Row {
    /// The run directory's name without a repeat's `.runK`: the runs of
    /// one cell share it.
    cell: String,
    system: String,
    case: String,
    result: Value,
    /// Events in the timed phase (drained, or offered).
    events: f64,
    delta: Option<Mark>,
    /// The mid-drain ANALYZE's own backend CPU (`analyze.txt`), when the
    /// case ran one.
    analyze_cpu_ms: Option<f64>,
    /// Long horizon: the driver's samples of the database (`samples.csv`:
    /// seconds, dead tuples, live tuples, bytes, autovacuums, autoanalyzes).
    samples: Vec<[f64; 6]>,
    /// Rescue: the victim's line (how many it held running when killed).
    victim: Value,
    /// herald's paused backlog: parking it, `after-backlog` to
    /// `backlog-parked` (untimed, before the drain).
    parking: Option<Mark>,
}

impl Row {
    /// `v` per 1,000 of the run's events (none for a run without events).
    fn per_1k(&self, v: f64) -> Option<f64> {
        (self.events > 0.0).then(|| v * 1000.0 / self.events)
    }
}

/// A drain's events per second.
fn events_per_s(r: &Row, _: &Mark) -> Option<f64> {
    r.result["events_per_s"].as_f64()
}

/// PostgreSQL's CPU per 1,000 events.
fn pg_cpu_per_1k(r: &Row, d: &Mark) -> Option<f64> {
    r.per_1k(d.pg_cpu_ms)
}

/// How many cores a drain kept busy, everything counted (PostgreSQL, the
/// system's own process, the broker): their CPU over the drain's own
/// seconds as the system timed them (the hook's readings take a few
/// hundred ms of wall time of their own, a large share of a short drain).
/// On a machine of two cores, a drain that keeps 1.5 busy leaves a
/// quarter of the machine unused, whatever its CPU per event.
fn cores_busy(r: &Row, d: &Mark) -> Option<f64> {
    let seconds = r.result["seconds"].as_f64().filter(|s| *s > 0.0)?;
    Some((d.pg_cpu_ms + d.peer_cpu_ms + d.broker_cpu_ms) / (seconds * 1000.0))
}

/// The runs of one cell of the table: a system's case (at one rate, for
/// latency), run once or `REPEAT` times (`SYSTEM.CASE`, `SYSTEM.CASE.run2`…).
struct Cell<'a> {
    runs: Vec<&'a Row>,
}

impl Cell<'_> {
    fn system(&self) -> &str {
        &self.runs[0].system
    }

    fn case(&self) -> &str {
        &self.runs[0].case
    }

    /// The runs that finished, with what their hook measured.
    fn measured(&self) -> Vec<(&Row, Mark)> {
        self.runs
            .iter()
            .filter_map(|r| Some((*r, r.delta?)))
            .collect()
    }

    /// `f` of every finished run that gives a value, sorted.
    fn values(&self, f: impl Fn(&Row, &Mark) -> Option<f64>) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .measured()
            .iter()
            .filter_map(|(r, d)| f(r, d))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The median of `f` over the finished runs.
    fn median(&self, f: impl Fn(&Row, &Mark) -> Option<f64>) -> Option<f64> {
        median(&self.values(f))
    }

    /// `f` written with `precision` decimals: the one run's value, or the
    /// median and the range of several; "–" when no run gives one.
    fn figure(&self, f: impl Fn(&Row, &Mark) -> Option<f64>, precision: usize) -> String {
        let v = self.values(f);
        match (median(&v), v.first(), v.last()) {
            (Some(m), Some(lo), Some(hi)) if v.len() > 1 => {
                format!("{m:.precision$} ({lo:.precision$}–{hi:.precision$})")
            }
            (Some(m), _, _) => format!("{m:.precision$}"),
            _ => "–".into(),
        }
    }
}

/// The median of sorted values.
fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Decimals that show a figure below 1 to two significant digits: a
/// drain's statements per event are thousandths, which `0.00` would
/// print as none.
fn two_significant(v: Option<f64>) -> usize {
    match v {
        Some(v) if v > 0.0 && v < 1.0 => ((-v.log10()).ceil() as usize + 1).min(6),
        _ => 2,
    }
}

/// Rows in report order grouped into cells (the runs of a cell are next
/// to each other in that order).
fn cells(rows: &[Row]) -> Vec<Cell<'_>> {
    let mut cells: Vec<Cell> = Vec::new();
    for r in rows {
        match cells.last_mut() {
            Some(c) if c.runs[0].cell == r.cell => c.runs.push(r),
            _ => cells.push(Cell { runs: vec![r] }),
        }
    }
    cells
}

/// The main table: one line per cell, a repeated cell's figures as the
/// median and range of its runs.
fn table(cells: &[Cell], md: &mut String) {
    md.push_str(
        "| system | case | events/s | p50 / p99 / max ms | PG CPU ms per 1k | statements per event | PG buffers per event | system CPU ms per 1k | broker CPU ms per 1k | cores busy | idle queries/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in cells {
        let done = c.measured();
        let Some(&(first, d)) = done.first() else {
            md.push_str(&format!(
                "| {} | {} | failed (see runs/) | | | | | | | | |\n",
                c.system(),
                c.case()
            ));
            continue;
        };
        let case = match (c.runs.len(), c.runs.len() - done.len()) {
            (1, _) => c.case().to_string(),
            (n, 0) => format!("{} ({n} runs)", c.case()),
            (n, failed) => format!("{} ({n} runs, {failed} failed)", c.case()),
        };
        let scenario = first.result["scenario"].as_str().unwrap_or("");
        let rate = match scenario {
            "latency" | "long-horizon" => format!(
                "{} of {:.0} offered",
                c.figure(|r, _| r.result["achieved_rate"].as_f64(), 0),
                first.result["rate"].as_f64().unwrap_or(0.0)
            ),
            "idle" | "rescue" => "–".into(),
            "emit" => format!(
                "{} single, {} batched",
                c.figure(|r, _| r.result["single_per_s"].as_f64(), 0),
                c.figure(|r, _| r.result["batched_per_s"].as_f64(), 0)
            ),
            _ => c.figure(events_per_s, 0),
        };
        let latency = match &first.result["latency_ms"] {
            Value::Object(_) => {
                let ms =
                    |p: &'static str| c.figure(move |r, _| r.result["latency_ms"][p].as_f64(), 1);
                format!("{} / {} / {}", ms("p50"), ms("p99"), ms("max"))
            }
            _ => "–".into(),
        };
        let per_event = |r: &Row, d: &Mark| (r.events > 0.0).then(|| d.statements / r.events);
        let statements = c.figure(per_event, two_significant(median(&c.values(per_event))));
        let buffers = c.figure(buffers_per_event, 1);
        let idle = if scenario == "idle" && d.wall_ms > 0.0 {
            format!(
                "{:.2} ({:.1} ms PG CPU/s)",
                d.statements * 1000.0 / d.wall_ms,
                d.pg_cpu_ms * 1000.0 / d.wall_ms
            )
        } else {
            "–".into()
        };
        // The ANALYZE's own CPU is the statistics' cost, which any queue
        // pays; what is left is the queue's cost with the new statistics.
        let pg_cpu = match first.analyze_cpu_ms {
            Some(_) => format!(
                "{} ({} without the ANALYZE's own {} ms)",
                c.figure(pg_cpu_per_1k, 1),
                c.figure(pg_cpu_per_1k_without_analyze, 1),
                c.figure(|r, _| r.analyze_cpu_ms, 0)
            ),
            None => c.figure(pg_cpu_per_1k, 1),
        };
        let broker = if matches!(c.system(), "herald-nats" | "herald-pubsub") {
            c.figure(|r, d| r.per_1k(d.broker_cpu_ms), 1)
        } else {
            "–".into()
        };
        let busy = if scenario == "drain" {
            c.figure(cores_busy, 2)
        } else {
            "–".into()
        };
        md.push_str(&format!(
            "| {} | {case} | {rate} | {latency} | {pg_cpu} | {statements} | {buffers} | {} | {broker} | {busy} | {idle} |\n",
            c.system(),
            c.figure(|r, d| r.per_1k(d.peer_cpu_ms), 1),
        ));
    }
}

/// Shared buffers the run's statements touched per event: PostgreSQL's
/// work in a unit the machine's speed does not move (its CPU per event
/// does, by a third between runs on the shared VMs, docs/benchmarks.md).
/// Counted from pg_stat_statements, so a mid-drain ANALYZE's are in it
/// (the drain-end reading waits for the mid-drain hook).
fn buffers_per_event(r: &Row, d: &Mark) -> Option<f64> {
    (r.events > 0.0 && d.buffers > 0.0).then(|| d.buffers / r.events)
}

/// PostgreSQL's CPU per 1,000 events less a mid-drain ANALYZE's own.
fn pg_cpu_per_1k_without_analyze(r: &Row, d: &Mark) -> Option<f64> {
    r.per_1k(d.pg_cpu_ms - r.analyze_cpu_ms.unwrap_or(0.0))
}

fn timed_phases(scenario: &str) -> (&'static str, &'static str) {
    match scenario {
        "latency" | "long-horizon" => ("run-start", "run-end"),
        "idle" => ("idle-start", "idle-end"),
        "rescue" => ("rescue-start", "rescue-end"),
        "emit" => ("single-start", "batched-end"),
        _ => ("drain-start", "drain-end"),
    }
}

fn read_run(dir: &Path) -> Option<Row> {
    let run = std::fs::read_to_string(dir.join("run.txt")).ok()?;
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let cell = round_of(&name).0.to_string();
    let mut lines = run.lines();
    let system = lines.next()?.to_string();
    let case = lines.next()?.to_string();
    if dir.join("failed").exists() {
        return Some(Row {
            cell,
            system,
            case,
            result: Value::Null,
            events: 0.0,
            delta: None,
            analyze_cpu_ms: None,
            samples: Vec::new(),
            victim: Value::Null,
            parking: None,
        });
    }
    let stdout = std::fs::read_to_string(dir.join("stdout")).ok()?;
    let result: Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    let scenario = result["scenario"].as_str().unwrap_or("drain");
    let marks = parse_marks(&std::fs::read_to_string(dir.join("marks")).unwrap_or_default());
    let between = |from: &str, to: &str| match (marks.get(from), marks.get(to)) {
        (Some(a), Some(b)) => Some(Mark {
            wall_ms: b.wall_ms - a.wall_ms,
            pg_cpu_ms: b.pg_cpu_ms - a.pg_cpu_ms,
            statements: b.statements - a.statements,
            peer_cpu_ms: b.peer_cpu_ms - a.peer_cpu_ms,
            broker_cpu_ms: b.broker_cpu_ms - a.broker_cpu_ms,
            buffers: b.buffers - a.buffers,
        }),
        _ => None,
    };
    let (from, to) = timed_phases(scenario);
    let delta = between(from, to);
    let parking = between("after-backlog", "backlog-parked");
    let analyze_cpu_ms = std::fs::read_to_string(dir.join("analyze.txt"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse().ok());
    let samples = std::fs::read_to_string(dir.join("samples.csv"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let v: Vec<f64> = l.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            v.try_into().ok()
        })
        .collect();
    let victim = std::fs::read_to_string(dir.join("victim.stdout"))
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Value>(l).ok())
        })
        .unwrap_or(Value::Null);
    let events = match scenario {
        "latency" | "long-horizon" => result["offered"].as_f64().unwrap_or(0.0),
        "idle" => 0.0,
        _ => result["events"].as_f64().unwrap_or(0.0),
    };
    Some(Row {
        cell,
        system,
        case,
        result,
        events,
        delta,
        analyze_cpu_ms,
        samples,
        victim,
        parking,
    })
}

/// A run directory's place in the report: by its name (`SYSTEM.CASE` or
/// `SYSTEM.CASE.RATE`), a latency run's rate compared as a number, so that
/// 10000 comes after 2500, then by its round (`.runK`), so that the runs
/// of a cell are next to each other.
fn run_order(dir: &Path) -> (String, u64, u32) {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (name, round) = round_of(&name);
    if let Some((head, Ok(rate))) = name.rsplit_once('.').map(|(h, r)| (h, r.parse())) {
        return (head.to_string(), rate, round);
    }
    (name.to_string(), 0, round)
}

/// A run directory's name without a repeat's `.runK`, and K (1 for the
/// first run, which has none).
fn round_of(name: &str) -> (&str, u32) {
    match name.rsplit_once(".run").map(|(head, k)| (head, k.parse())) {
        Some((head, Ok(k))) => (head, k),
        _ => (name, 1),
    }
}

/// Writes `report.md` and the charts into `args.dir`.
fn run(args: ReportArgs) -> Result<(), WriteError> {
    let runs = args.dir.join("runs");
    let entries = std::fs::read_dir(&runs).map_err(|e| WriteError {
        path: runs.clone(),
        reason: e.to_string(),
    })?;
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    dirs.sort_by_key(|d| run_order(d));
    let rows: Vec<Row> = dirs.iter().filter_map(|d| read_run(d)).collect();
    let mut md = String::new();
    if let Ok(machine) = std::fs::read_to_string(args.dir.join("machine.txt")) {
        md.push_str("```\n");
        md.push_str(&machine);
        md.push_str("```\n\n");
    }
    let cells = cells(&rows);
    table(&cells, &mut md);
    let parked: Vec<&Row> = rows.iter().filter(|r| r.parking.is_some()).collect();
    if !parked.is_empty() {
        md.push_str(
            "\nParking the paused backlog before the drain (untimed; what the \
             reconciler's sweeps do once, as the events arrive):\n\n",
        );
        for r in parked {
            let (Some(p), Some(n)) = (r.parking, r.result["backlog"].as_f64()) else {
                continue;
            };
            md.push_str(&format!(
                "- {}: {n:.0} events in {:.1} s, {:.0} ms PG CPU ({:.1} per 1,000), {} statements\n",
                r.system,
                p.wall_ms / 1000.0,
                p.pg_cpu_ms,
                p.pg_cpu_ms * 1000.0 / n.max(1.0),
                p.statements
            ));
        }
    }
    long_horizon(&args.dir, &rows, &mut md)?;
    rescues(&rows, &mut md);
    md.push_str("\nEvery system's knobs, as each run printed them:\n\n");
    let mut knobs = BTreeMap::new();
    for r in &rows {
        if let Some(k) = r.result.get("knobs") {
            let version = r.result["version"].as_str().unwrap_or("?");
            knobs.insert(r.system.clone(), format!("{version}: {k}"));
        }
    }
    for (system, k) in knobs {
        md.push_str(&format!("- **{system}** {k}\n"));
    }
    let drains: Vec<(String, f64)> = cells
        .iter()
        .filter(|c| c.case() == "clean")
        .filter_map(|c| Some((c.system().to_string(), c.median(events_per_s)?)))
        .collect();
    if !drains.is_empty() {
        let path = args.dir.join("drain.svg");
        chart::bars(&path, "no-op drain, events/s", "events/s", &drains)
            .map_err(|reason| WriteError { path, reason })?;
        md.push_str("\n![drain](drain.svg)\n");
    }
    // One point per rate: a repeated rate's medians.
    let mut curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for c in cells.iter().filter(|c| c.case() == "latency") {
        if let (Some(x), Some(y)) = (
            c.median(|r, _| r.result["achieved_rate"].as_f64()),
            c.median(|r, _| r.result["latency_ms"]["p50"].as_f64()),
        ) {
            curves
                .entry(c.system().to_string())
                .or_default()
                .push((x, y));
        }
    }
    if !curves.is_empty() {
        let series: Vec<chart::Series> = curves
            .into_iter()
            .map(|(s, mut p)| {
                p.sort_by(|a, b| a.0.total_cmp(&b.0));
                (s, p)
            })
            .collect();
        let path = args.dir.join("latency.svg");
        chart::lines(
            &path,
            "emit-to-start p50",
            "events/s offered",
            "ms",
            &series,
        )
        .map_err(|reason| WriteError { path, reason })?;
        md.push_str("\n![latency](latency.svg)\n");
    }
    let path = args.dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| WriteError {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    print!("{md}");
    Ok(())
}

/// The long-horizon runs: a table of their worst windows and the
/// database's growth, and three charts over time (p99 per window, dead
/// tuples, size).
fn long_horizon(dir: &Path, rows: &[Row], md: &mut String) -> Result<(), WriteError> {
    let runs: Vec<&Row> = rows.iter().filter(|r| r.case == "long-horizon").collect();
    if runs.is_empty() {
        return Ok(());
    }
    md.push_str(
        "\nLong horizon (a fixed offered rate of a handler that works `work_ms`; \
         windows by handler start; the database sampled by the driver):\n\n\
         | system | offered/s | ran/s | p50 / p99 ms | worst window ran/s | worst window p99 ms | \
         dead tuples, peak | size, peak / end | autovacuums |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut p99s = Vec::new();
    let mut dead = Vec::new();
    let mut size = Vec::new();
    for r in &runs {
        let res = &r.result;
        let windows = res["windows"].as_array().cloned().unwrap_or_default();
        let window_s = windows
            .first()
            .and_then(|w| w["t_s"].as_f64())
            .unwrap_or(10.0)
            .max(1.0);
        // The last window may be cut short by the end of offering.
        let full = &windows[..windows.len().saturating_sub(1)];
        let worst_rate = full
            .iter()
            .filter_map(|w| w["completed"].as_f64())
            .fold(f64::INFINITY, f64::min)
            / window_s;
        let worst_p99 = windows
            .iter()
            .filter_map(|w| w["latency_ms"]["p99"].as_f64())
            .fold(0.0, f64::max);
        let peak = |i: usize| r.samples.iter().map(|s| s[i]).fold(0.0, f64::max);
        let mb = |b: f64| b / 1_048_576.0;
        let last = r.samples.last().copied().unwrap_or([0.0; 6]);
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.1} / {:.1} | {} | {worst_p99:.1} | {:.0} | {:.0} / {:.0} MB | {:.0} |\n",
            r.system,
            res["rate"].as_f64().unwrap_or(0.0),
            res["achieved_rate"].as_f64().unwrap_or(0.0),
            res["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            res["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            if worst_rate.is_finite() { format!("{worst_rate:.0}") } else { "–".into() },
            peak(1),
            mb(peak(3)),
            mb(last[3]),
            last[4] - r.samples.first().map_or(0.0, |s| s[4]),
        ));
        p99s.push((
            r.system.clone(),
            windows
                .iter()
                .filter_map(|w| Some((w["t_s"].as_f64()?, w["latency_ms"]["p99"].as_f64()?)))
                .collect(),
        ));
        dead.push((
            r.system.clone(),
            r.samples.iter().map(|s| (s[0], s[1])).collect(),
        ));
        size.push((
            r.system.clone(),
            r.samples.iter().map(|s| (s[0], mb(s[3]))).collect(),
        ));
    }
    let charts: [(&str, &str, &str, &[chart::Series]); 3] = [
        (
            "long-horizon-p99.svg",
            "long horizon: p99 per window",
            "ms",
            &p99s,
        ),
        (
            "long-horizon-dead.svg",
            "long horizon: dead tuples",
            "dead tuples",
            &dead,
        ),
        (
            "long-horizon-size.svg",
            "long horizon: database size",
            "MB",
            &size,
        ),
    ];
    for (file, title, y, series) in charts {
        let path = dir.join(file);
        chart::lines(&path, title, "seconds", y, series)
            .map_err(|reason| WriteError { path, reason })?;
        md.push_str(&format!("\n![{title}]({file})\n"));
    }
    Ok(())
}

/// The rescue runs: how long the jobs a SIGKILLed process held took to run
/// in another one, beside each system's setting that decides it.
fn rescues(rows: &[Row], md: &mut String) {
    let runs: Vec<&Row> = rows.iter().filter(|r| r.case == "rescue").collect();
    if runs.is_empty() {
        return;
    }
    md.push_str(
        "\nRescue after SIGKILL (a victim holding the jobs is killed; a second process \
         runs them):\n\n\
         | system | jobs | running at the kill | first run after | all run after | \
         rescue setting (s) |\n|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let res = &r.result;
        if res.is_null() {
            md.push_str(&format!("| {} | failed (see runs/) | | | | |\n", r.system));
            continue;
        }
        let secs = |v: &Value| v.as_f64().map_or("–".to_string(), |s| format!("{s:.1} s"));
        let all = if res["timed_out"].as_bool().unwrap_or(false) {
            format!(
                "not within {} s ({} of {} ran)",
                res["timeout_s"], res["completed"], res["events"]
            )
        } else {
            secs(&res["rescue_s"])
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {all} | {} |\n",
            r.system,
            res["events"],
            r.victim["running"],
            secs(&res["first_s"]),
            res["knobs"]["rescue_after_s"],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_keep_the_last_reading_of_each_phase_and_skip_short_lines() {
        let m = parse_marks("drain-start 1000 50 7 20 0\nbroken line\ndrain-end 3000 250 407 120 5\ndrain-end 3500 260 409 121 5\n");
        assert_eq!(m.len(), 2);
        assert_eq!(m["drain-start"].statements, 7.0);
        assert_eq!(m["drain-end"].wall_ms, 3500.0);
    }

    #[test]
    fn a_run_directory_becomes_a_row_with_its_deltas() {
        let dir = tempfile::tempdir().unwrap();
        let run = write_run(
            dir.path(),
            "skip-locked.clean",
            "log line\n{\"system\":\"skip-locked\",\"version\":\"1\",\"scenario\":\"drain\",\"events\":2000,\"seconds\":1.5,\"events_per_s\":1000,\"knobs\":{\"workers\":4}}\n",
            "drain-start 1000 50 7 20 0\ndrain-end 3000 250 4007 120 0\n",
        );
        let row = read_run(&run).unwrap();
        let d = row.delta.unwrap();
        assert_eq!(d.pg_cpu_ms, 200.0);
        assert_eq!(d.statements, 4000.0);
        assert_eq!(row.per_1k(d.pg_cpu_ms), Some(100.0));
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains("| skip-locked | clean | 1000 | – | 100.0 | 2.00 | – | 50.0 |"),
            "{md}"
        );
        // 200 ms of PostgreSQL and 100 of its own over a drain of 1.5 s
        // (the hook's readings 2 s apart).
        assert!(md.contains("| 50.0 | – | 0.20 | – |\n"), "{md}");
        assert!(dir.path().join("drain.svg").exists());
    }

    #[test]
    fn latency_runs_are_in_the_order_of_their_rates() {
        let mut dirs: Vec<PathBuf> = [
            "x.latency.10000",
            "x.latency.2500",
            "x.clean",
            "x.latency.500",
            "a.latency.1000",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        dirs.sort_by_key(|d| run_order(d));
        let names: Vec<&str> = dirs.iter().map(|d| d.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "a.latency.1000",
                "x.clean",
                "x.latency.500",
                "x.latency.2500",
                "x.latency.10000"
            ]
        );
    }

    /// A finished drain run `name` of `events` at `events_per_s`, whose
    /// PostgreSQL spent `pg_ms` between its timed phases.
    fn write_drain(dir: &Path, name: &str, events: f64, events_per_s: f64, pg_ms: f64) {
        write_run(
            dir,
            name,
            &format!(
                "{{\"scenario\":\"drain\",\"events\":{events},\"events_per_s\":{events_per_s}}}\n"
            ),
            &format!("drain-start 0 0 0 0 0\ndrain-end 1000 {pg_ms} {events} 0 0\n"),
        );
    }

    /// The run directory `runs/NAME` (`SYSTEM.CASE…`) as compare.sh leaves
    /// it: its command, its output and its hook's marks.
    fn write_run(dir: &Path, name: &str, stdout: &str, marks: &str) -> PathBuf {
        let run = dir.join("runs").join(name);
        std::fs::create_dir_all(&run).unwrap();
        let mut parts = name.split('.');
        let (system, case) = (parts.next().unwrap(), parts.next().unwrap());
        std::fs::write(run.join("run.txt"), format!("{system}\n{case}\nbin\n")).unwrap();
        std::fs::write(run.join("stdout"), stdout).unwrap();
        std::fs::write(run.join("marks"), marks).unwrap();
        run
    }

    #[test]
    fn repeated_runs_are_one_line_of_medians_and_a_failed_run_says_so() {
        let dir = tempfile::tempdir().unwrap();
        // herald's three clean runs: median 200 events/s, 10 ms per 1,000.
        write_drain(dir.path(), "herald-memory.clean", 1000.0, 300.0, 9.0);
        write_drain(dir.path(), "herald-memory.clean.run2", 1000.0, 100.0, 12.0);
        write_drain(dir.path(), "herald-memory.clean.run3", 1000.0, 200.0, 10.0);
        std::fs::create_dir_all(dir.path().join("runs/pg-boss.clean")).unwrap();
        std::fs::write(
            dir.path().join("runs/pg-boss.clean/run.txt"),
            "pg-boss\nclean\nx\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("runs/pg-boss.clean/failed"), "1").unwrap();
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains("| herald-memory | clean (3 runs) | 200 (100–300) | – | 10.0 (9.0–12.0) |"),
            "{md}"
        );
        assert!(
            md.contains("| pg-boss | clean | failed (see runs/) |"),
            "{md}"
        );
    }

    #[test]
    fn statements_per_event_below_one_show_two_significant_digits() {
        let dir = tempfile::tempdir().unwrap();
        // 640 statements for 200,000 events: 0.0032 per event, not 0.00.
        write_run(
            dir.path(),
            "h.clean",
            "{\"scenario\":\"drain\",\"events\":200000,\"events_per_s\":100000}\n",
            "drain-start 0 0 0 0 0\ndrain-end 2000 1000 640 0 0\n",
        );
        write_drain(dir.path(), "g.clean", 1000.0, 100.0, 10.0);
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(md.contains("| 5.0 | 0.0032 |"), "{md}");
        assert!(md.contains("| 10.0 | 1.00 |"), "{md}");
        assert_eq!(two_significant(Some(0.1)), 2);
        assert_eq!(two_significant(Some(0.099)), 3);
        assert_eq!(two_significant(Some(2.96)), 2);
        assert_eq!(two_significant(None), 2);
    }

    #[test]
    fn buffers_per_event_come_from_the_marks_seventh_field() {
        let m = parse_marks(
            "drain-start 0 0 0 0 0 1000\ndrain-end 1000 20 5 0 0 9000\nold 1 2 3 4 5\n",
        );
        assert_eq!(
            (m["drain-start"].buffers, m["drain-end"].buffers),
            (1000.0, 9000.0)
        );
        assert_eq!(
            m["old"].buffers, 0.0,
            "marks written before the field read as 0"
        );
        let dir = tempfile::tempdir().unwrap();
        let drain = |name: &str, pg_ms: f64, buffers: f64| {
            write_run(
                dir.path(),
                name,
                "{\"scenario\":\"drain\",\"events\":1000,\"events_per_s\":100}\n",
                &format!("drain-start 0 0 0 0 0 0\ndrain-end 1000 {pg_ms} 1000 0 0 {buffers}\n"),
            );
        };
        // 10 ms per 1,000 and 14 buffers an event.
        drain("herald-nats.clean", 10.0, 14_000.0);
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains("| herald-nats | clean | 100 | – | 10.0 | 1.00 | 14.0 |"),
            "{md}"
        );
    }

    #[test]
    fn an_emit_run_reads_both_phases_and_gives_both_rates() {
        let dir = tempfile::tempdir().unwrap();
        write_run(
            dir.path(),
            "herald-sqlite.emit",
            "{\"scenario\":\"emit\",\"events\":3000,\"single_per_s\":1500.4,\"batched_per_s\":40000}\n",
            "single-start 0 0 0 0 0\nsingle-end 500 10 0 30 0\nbatched-start 500 10 0 30 0\nbatched-end 600 30 0 60 0\n",
        );
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains(
                "| herald-sqlite | emit | 1500 single, 40000 batched | – | 10.0 | 0.00 | – | 20.0 |"
            ),
            "{md}"
        );
    }

    #[test]
    fn repeated_latency_rates_are_one_line_of_medians_each_in_rate_order() {
        let dir = tempfile::tempdir().unwrap();
        for (name, rate, achieved, p50) in [
            ("x.latency.10000.run2", 10000, 9500.0, 4.0),
            ("x.latency.1000.run3", 1000, 1000.0, 3.0),
            ("x.latency.1000", 1000, 1000.0, 2.0),
            ("x.latency.10000", 10000, 9000.0, 5.0),
            ("x.latency.1000.run2", 1000, 990.0, 6.0),
        ] {
            let stdout = format!(
                "{{\"system\":\"x\",\"version\":\"1\",\"scenario\":\"latency\",\"offered\":1000,\"rate\":{rate},\"achieved_rate\":{achieved},\"latency_ms\":{{\"p50\":{p50},\"p99\":{p99},\"max\":20.0}},\"knobs\":{{}}}}\n",
                p99 = p50 * 2.0
            );
            write_run(
                dir.path(),
                name,
                &stdout,
                "run-start 1000 0 0 0 0\nrun-end 2000 100 10 50 0\n",
            );
        }
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        let low = "| x | latency (3 runs) | 1000 (990–1000) of 1000 offered | 3.0 (2.0–6.0) / 6.0 (4.0–12.0) / 20.0 (20.0–20.0) |";
        let high = "| x | latency (2 runs) | 9250 (9000–9500) of 10000 offered | 4.5 (4.0–5.0) / 9.0 (8.0–10.0) / 20.0 (20.0–20.0) |";
        let (at_low, at_high) = (md.find(low), md.find(high));
        assert!(at_low.is_some() && at_high.is_some(), "{md}");
        assert!(at_low < at_high, "1000/s before 10000/s: {md}");
        assert!(dir.path().join("latency.svg").exists());
    }

    fn run_report(dir: &Path) {
        run(ReportArgs {
            dir: dir.to_path_buf(),
        })
        .unwrap();
    }
}
