//! The report's reading of issue 14's drain and hard-case targets from the
//! cells' medians: herald's drain against the best other queue's, and each
//! system's PostgreSQL CPU per event in a hard case against its own clean
//! drain's.

use super::{events_per_s, pg_cpu_per_1k, pg_cpu_per_1k_without_analyze, Cell};

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

/// Appends both readings to `md`, when the cells hold what they need.
pub(super) fn targets(cells: &[Cell], md: &mut String) {
    let cell = |system: &str, case: &str| {
        cells
            .iter()
            .find(|c| c.system() == system && c.case() == case)
    };
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
    let mut lines = String::new();
    for (system, _) in &clean {
        let Some(base) = cell(system, "clean").and_then(|c| c.median(pg_cpu_per_1k)) else {
            continue;
        };
        let ratio = |case: &str, f: fn(&super::Row, &super::Mark) -> Option<f64>| {
            cell(system, case)
                .and_then(|c| c.median(f))
                .map(|v| v / base)
        };
        let mut line = format!("| {system} | {base:.1} |");
        let mut any = false;
        for case in HARD_CASES {
            let text = match (ratio(case, pg_cpu_per_1k), case) {
                (Some(r), "mid-analyze") => {
                    let without = ratio(case, pg_cpu_per_1k_without_analyze).unwrap_or(r);
                    Some(format!(" {r:.2}× ({without:.2}× without the ANALYZE) |"))
                }
                (Some(r), _) => Some(format!(" {r:.2}× |")),
                (None, _) => None,
            };
            any |= text.is_some();
            line.push_str(text.as_deref().unwrap_or(" – |"));
        }
        if any {
            lines.push_str(&line);
            lines.push('\n');
        }
    }
    if !lines.is_empty() {
        md.push_str(
            "\nPostgreSQL CPU per 1,000 events in each hard case against the system's own \
             clean drain (medians):\n\n\
             | system | clean, ms per 1k | delayed | paused | hold-tx | stale | mid-analyze |\n\
             |---|---|---|---|---|---|---|\n",
        );
        md.push_str(&lines);
    }
}
