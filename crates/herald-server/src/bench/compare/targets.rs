//! The report's reading of issue 14's drain and hard-case targets from the
//! cells' medians: herald's drain against the best other queue's, and each
//! system's PostgreSQL CPU per event in a hard case against its own clean
//! drain's (also paired run by run within each round of a repeated
//! sitting, in PostgreSQL's whole CPU and in the system's own
//! connections' alone), and the same in shared buffers touched.

use super::{
    buffers_per_event, connections_cpu_per_1k, events_per_s, median, pg_cpu_per_1k,
    pg_cpu_per_1k_without_analyze, Cell, Mark, Row,
};

/// A figure of one run (see [`Cell::median`]).
type Figure = fn(&Row, &Mark) -> Option<f64>;

/// The plain `FOR UPDATE SKIP LOCKED` loop: a floor to compare with, not
/// a queue (no retries, leases, delays or pause), so never "the best
/// other queue".
const BASELINE: &str = "skip-locked";

/// The cases whose PostgreSQL CPU per event is held against the clean
/// drain's.
const HARD_CASES: [&str; 5] = ["delayed", "paused", "hold-tx", "stale", "mid-analyze"];

fn is_herald(system: &str) -> bool {
    system.starts_with("herald-")
}

/// Appends the readings to `md`, when the cells hold what they need.
pub(super) fn targets(cells: &[Cell], md: &mut String) {
    let clean: Vec<(&str, f64)> = cells
        .iter()
        .filter(|c| c.case() == "clean")
        .filter_map(|c| Some((c.system(), c.median(events_per_s)?)))
        .collect();
    let best_peer = clean
        .iter()
        .filter(|(s, _)| !is_herald(s) && *s != BASELINE)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((peer, best)) = best_peer {
        md.push_str(&format!(
            "\nClean drain against the best other queue, {peer} at {best:.0} events/s \
             (medians; {BASELINE} is a floor, not a queue):\n\n"
        ));
        for (system, v) in clean.iter().filter(|(s, _)| is_herald(s)) {
            md.push_str(&format!("- {system}: {v:.0} events/s, {:.2}×\n", v / best));
        }
    }
    let systems: Vec<&str> = clean.iter().map(|(s, _)| *s).collect();
    let cpu = hard_case_lines(
        cells,
        &systems,
        pg_cpu_per_1k,
        Some(pg_cpu_per_1k_without_analyze),
    );
    if !cpu.is_empty() {
        md.push_str(
            "\nPostgreSQL CPU per 1,000 events in each hard case against the system's own \
             clean drain (medians):\n\n\
             | system | clean, ms per 1k | delayed | paused | hold-tx | stale | mid-analyze |\n\
             |---|---|---|---|---|---|---|\n",
        );
        md.push_str(&cpu);
    }
    let paired = paired_lines(
        cells,
        &systems,
        pg_cpu_per_1k,
        pg_cpu_per_1k_without_analyze,
    );
    if !paired.is_empty() {
        md.push_str(
            "\nThe same paired by round: each hard-case run against the clean run of its own \
             round (minutes apart; a slow stretch of the machine falls on both), the median \
             of those ratios and their range (mid-analyze without the ANALYZE's own):\n\n\
             | system | rounds | delayed | paused | hold-tx | stale | mid-analyze |\n\
             |---|---|---|---|---|---|---|\n",
        );
        md.push_str(&paired);
    }
    let own = paired_lines(
        cells,
        &systems,
        connections_cpu_per_1k,
        connections_cpu_per_1k,
    );
    if !own.is_empty() {
        md.push_str(
            "\nThe same paired by round, counting only the CPU of the system's own connections \
             (not autovacuum, which may start inside any drain on this production-like \
             cluster, nor the checkpointer, the WAL writer or a mid-drain ANALYZE's own):\n\n\
             | system | rounds | delayed | paused | hold-tx | stale | mid-analyze |\n\
             |---|---|---|---|---|---|---|\n",
        );
        md.push_str(&own);
    }
    let buffers = hard_case_lines(cells, &systems, buffers_per_event, None);
    if !buffers.is_empty() {
        md.push_str(
            "\nThe same in shared buffers the statements touched per event (medians; the \
             machine's speed does not move these; mid-analyze's include the ANALYZE's own):\n\n\
             | system | clean, per event | delayed | paused | hold-tx | stale | mid-analyze |\n\
             |---|---|---|---|---|---|---|\n",
        );
        md.push_str(&buffers);
    }
}

/// One table line per system that has `f` in its clean drain and in a
/// hard case: the clean median, then each hard case's median as a ratio of
/// it (mid-analyze also by `without_analyze` when given).
fn hard_case_lines(
    cells: &[Cell],
    systems: &[&str],
    f: Figure,
    without_analyze: Option<Figure>,
) -> String {
    let cell = |system: &str, case: &str| {
        cells
            .iter()
            .find(|c| c.system() == system && c.case() == case)
    };
    let mut lines = String::new();
    for system in systems {
        let Some(base) = cell(system, "clean").and_then(|c| c.median(f)) else {
            continue;
        };
        let ratio = |case: &str, f: Figure| {
            cell(system, case)
                .and_then(|c| c.median(f))
                .map(|v| v / base)
        };
        let mut line = format!("| {system} | {base:.1} |");
        let mut any = false;
        for case in HARD_CASES {
            let text = match (ratio(case, f), case, without_analyze) {
                (Some(r), "mid-analyze", Some(w)) => {
                    let without = ratio(case, w).unwrap_or(r);
                    Some(format!(" {r:.2}× ({without:.2}× without the ANALYZE) |"))
                }
                (Some(r), _, _) => Some(format!(" {r:.2}× |")),
                (None, _, _) => None,
            };
            any |= text.is_some();
            line.push_str(text.as_deref().unwrap_or(" – |"));
        }
        if any {
            lines.push_str(&line);
            lines.push('\n');
        }
    }
    lines
}

/// One table line per system with more than one round of its clean drain:
/// for each hard case, the ratio of each of its runs' `f` (mid-analyze's
/// `mid_analyze`) to the clean run's `f` of the same round, as the median
/// and range of those ratios. A ratio of medians mixes rounds; this one
/// compares runs that ran close together.
fn paired_lines(cells: &[Cell], systems: &[&str], f: Figure, mid_analyze: Figure) -> String {
    let runs = |system: &str, case: &str, f: Figure| -> Vec<(u32, f64)> {
        cells
            .iter()
            .filter(|c| c.system() == system && c.case() == case)
            .flat_map(|c| c.measured())
            .filter_map(|(r, d)| Some((r.round, f(r, &d)?)))
            .collect()
    };
    let mut lines = String::new();
    for system in systems {
        let clean = runs(system, "clean", f);
        if clean.len() < 2 {
            continue;
        }
        let mut line = format!("| {system} | {} |", clean.len());
        let mut any = false;
        for case in HARD_CASES {
            let f = if case == "mid-analyze" {
                mid_analyze
            } else {
                f
            };
            let mut ratios: Vec<f64> = runs(system, case, f)
                .iter()
                .filter_map(|(round, v)| {
                    let (_, base) = clean.iter().find(|(k, _)| k == round)?;
                    Some(v / base)
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            let text = match (median(&ratios), ratios.first(), ratios.last()) {
                (Some(m), Some(lo), Some(hi)) => {
                    any = true;
                    format!(" {m:.2}× ({lo:.2}–{hi:.2}, {}) |", ratios.len())
                }
                _ => " – |".to_string(),
            };
            line.push_str(&text);
        }
        if any {
            lines.push_str(&line);
            lines.push('\n');
        }
    }
    lines
}
