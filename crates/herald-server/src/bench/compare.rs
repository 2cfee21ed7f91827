//! `herald bench report DIR`: the runs that `bench/compare.sh` left in
//! `DIR/runs/` (each system's JSON line, and the marks its hook took at
//! each phase) turned into one Markdown table, `DIR/report.md`, and charts:
//! the clean drain's events/s per system and emit-to-start p50 against
//! the offered rate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chart;
use super::BenchError;

/// Options of `herald bench report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The directory `bench/compare.sh` wrote (its `OUT`).
    dir: PathBuf,
}

/// One reading of the hook: running totals at a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mark {
    /// Wall clock, ms.
    pub wall_ms: f64,
    /// PostgreSQL's server CPU, ms.
    pub pg_cpu_ms: f64,
    /// Statements counted by pg_stat_statements in the run's database.
    pub statements: f64,
    /// The system's own process CPU, ms.
    pub peer_cpu_ms: f64,
    /// The nats-server's CPU, ms.
    pub broker_cpu_ms: f64,
}

/// Reads a marks file (`PHASE WALL PG STATEMENTS PEER BROKER` per line);
/// the last reading of each phase wins.
pub fn parse_marks(text: &str) -> BTreeMap<String, Mark> {
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
            },
        );
    }
    marks
}

/// What one run measured between its timed phases.
#[derive(Debug)]
struct Row {
    system: String,
    case: String,
    result: Value,
    /// Events in the timed phase (drained, or offered).
    events: f64,
    delta: Option<Mark>,
}

impl Row {
    fn per_1k(&self, v: f64) -> String {
        if self.events > 0.0 {
            format!("{:.1}", v * 1000.0 / self.events)
        } else {
            "–".into()
        }
    }
}

fn timed_phases(scenario: &str) -> (&'static str, &'static str) {
    match scenario {
        "latency" => ("run-start", "run-end"),
        "idle" => ("idle-start", "idle-end"),
        _ => ("drain-start", "drain-end"),
    }
}

fn read_run(dir: &Path) -> Option<Row> {
    let run = std::fs::read_to_string(dir.join("run.txt")).ok()?;
    let mut lines = run.lines();
    let system = lines.next()?.to_string();
    let case = lines.next()?.to_string();
    if dir.join("failed").exists() {
        return Some(Row {
            system,
            case,
            result: Value::Null,
            events: 0.0,
            delta: None,
        });
    }
    let stdout = std::fs::read_to_string(dir.join("stdout")).ok()?;
    let result: Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    let scenario = result["scenario"].as_str().unwrap_or("drain");
    let marks = parse_marks(&std::fs::read_to_string(dir.join("marks")).unwrap_or_default());
    let (from, to) = timed_phases(scenario);
    let delta = match (marks.get(from), marks.get(to)) {
        (Some(a), Some(b)) => Some(Mark {
            wall_ms: b.wall_ms - a.wall_ms,
            pg_cpu_ms: b.pg_cpu_ms - a.pg_cpu_ms,
            statements: b.statements - a.statements,
            peer_cpu_ms: b.peer_cpu_ms - a.peer_cpu_ms,
            broker_cpu_ms: b.broker_cpu_ms - a.broker_cpu_ms,
        }),
        _ => None,
    };
    let events = match scenario {
        "latency" => result["offered"].as_f64().unwrap_or(0.0),
        "idle" => 0.0,
        _ => result["events"].as_f64().unwrap_or(0.0),
    };
    Some(Row {
        system,
        case,
        result,
        events,
        delta,
    })
}

/// Writes `report.md` and the charts into `args.dir`.
pub fn run(args: ReportArgs) -> Result<(), BenchError> {
    let runs = args.dir.join("runs");
    let entries = std::fs::read_dir(&runs).map_err(|e| BenchError::Write {
        path: runs.clone(),
        reason: e.to_string(),
    })?;
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    dirs.sort();
    let rows: Vec<Row> = dirs.iter().filter_map(|d| read_run(d)).collect();
    let mut md = String::new();
    if let Ok(machine) = std::fs::read_to_string(args.dir.join("machine.txt")) {
        md.push_str("```\n");
        md.push_str(&machine);
        md.push_str("```\n\n");
    }
    md.push_str(
        "| system | case | events/s | p50 / p99 / max ms | PG CPU ms per 1k | statements per event | system CPU ms per 1k | broker CPU ms per 1k | idle queries/s |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let Some(d) = r.delta else {
            md.push_str(&format!(
                "| {} | {} | failed (see runs/) | | | | | | |\n",
                r.system, r.case
            ));
            continue;
        };
        let scenario = r.result["scenario"].as_str().unwrap_or("");
        let rate = match scenario {
            "latency" => format!(
                "{:.0} offered",
                r.result["achieved_rate"].as_f64().unwrap_or(0.0)
            ),
            "idle" => "–".into(),
            _ => format!("{:.0}", r.result["events_per_s"].as_f64().unwrap_or(0.0)),
        };
        let latency = match &r.result["latency_ms"] {
            Value::Object(l) => format!(
                "{:.1} / {:.1} / {:.1}",
                l["p50"].as_f64().unwrap_or(0.0),
                l["p99"].as_f64().unwrap_or(0.0),
                l["max"].as_f64().unwrap_or(0.0)
            ),
            _ => "–".into(),
        };
        let statements = if r.events > 0.0 {
            format!("{:.2}", d.statements / r.events)
        } else {
            "–".into()
        };
        let idle = if scenario == "idle" && d.wall_ms > 0.0 {
            format!(
                "{:.2} ({:.1} ms PG CPU/s)",
                d.statements * 1000.0 / d.wall_ms,
                d.pg_cpu_ms * 1000.0 / d.wall_ms
            )
        } else {
            "–".into()
        };
        md.push_str(&format!(
            "| {} | {} | {rate} | {latency} | {} | {statements} | {} | {} | {idle} |\n",
            r.system,
            r.case,
            r.per_1k(d.pg_cpu_ms),
            r.per_1k(d.peer_cpu_ms),
            if matches!(r.system.as_str(), "herald-nats" | "herald-pubsub") {
                r.per_1k(d.broker_cpu_ms)
            } else {
                "–".into()
            },
        ));
    }
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
    let drains: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.case == "clean")
        .filter_map(|r| Some((r.system.clone(), r.result["events_per_s"].as_f64()?)))
        .collect();
    if !drains.is_empty() {
        let path = args.dir.join("drain.svg");
        chart::bars(&path, "no-op drain, events/s", "events/s", &drains)
            .map_err(|reason| BenchError::Write { path, reason })?;
        md.push_str("\n![drain](drain.svg)\n");
    }
    let mut curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.case == "latency") {
        if let (Some(x), Some(y)) = (
            r.result["achieved_rate"].as_f64(),
            r.result["latency_ms"]["p50"].as_f64(),
        ) {
            curves.entry(r.system.clone()).or_default().push((x, y));
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
        .map_err(|reason| BenchError::Write { path, reason })?;
        md.push_str("\n![latency](latency.svg)\n");
    }
    let path = args.dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| BenchError::Write {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    print!("{md}");
    Ok(())
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
        let run = dir.path().join("runs").join("skip-locked.clean");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("run.txt"), "skip-locked\nclean\nbin --url x\n").unwrap();
        std::fs::write(
            run.join("stdout"),
            "log line\n{\"system\":\"skip-locked\",\"version\":\"1\",\"scenario\":\"drain\",\"events\":2000,\"events_per_s\":1000,\"knobs\":{\"workers\":4}}\n",
        )
        .unwrap();
        std::fs::write(
            run.join("marks"),
            "drain-start 1000 50 7 20 0\ndrain-end 3000 250 4007 120 0\n",
        )
        .unwrap();
        let row = read_run(&run).unwrap();
        let d = row.delta.unwrap();
        assert_eq!(d.pg_cpu_ms, 200.0);
        assert_eq!(d.statements, 4000.0);
        assert_eq!(row.per_1k(d.pg_cpu_ms), "100.0");
        run_report(dir.path());
        let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(
            md.contains("| skip-locked | clean | 1000 | – | 100.0 | 2.00 | 50.0 |"),
            "{md}"
        );
        assert!(dir.path().join("drain.svg").exists());
    }

    fn run_report(dir: &Path) {
        run(ReportArgs {
            dir: dir.to_path_buf(),
        })
        .unwrap();
    }
}
