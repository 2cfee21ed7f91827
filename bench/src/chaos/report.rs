//! The report: faults injected, invariants checked (with the evidence of
//! each failure), rescue times, and the final `N passed, M failed` line.

use std::collections::BTreeMap;

use herald_bench::fleet::quantile;

use crate::faults::{Fault, Kind};
use crate::invariants::Check;

/// How many failures of one invariant are printed in full.
const SHOWN: usize = 15;

/// Prints the report; returns the number of failed invariants.
pub(crate) fn print(
    faults: &[Fault],
    checks: &[Check],
    (rescues, over): (&[f64], &[String]),
    lease: f64,
    notes: &[String],
) -> usize {
    let mut kinds: BTreeMap<Kind, usize> = BTreeMap::new();
    for f in faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    println!();
    println!("{:<42} {:>6}", "fault", "count");
    for (k, n) in &kinds {
        println!("{:<42} {:>6}", k.name(), n);
    }
    let mut sorted = rescues.to_vec();
    sorted.sort_by(f64::total_cmp);
    println!();
    if sorted.is_empty() {
        println!("rescue after SIGKILL: no clean kill held a run");
    } else {
        println!(
            "rescue after SIGKILL (measured, not an invariant): {} runs, median {:.3} s, p90 {:.3} s, max {:.3} s; {} over the bound lease + lease/3 + 1 s = {:.3} s",
            sorted.len(),
            quantile(&sorted, 0.5),
            quantile(&sorted, 0.9),
            quantile(&sorted, 1.0),
            over.len(),
            crate::invariants::rescue_bound(lease)
        );
        for line in over.iter().take(5) {
            println!("  - {line}");
        }
    }
    for n in notes {
        println!("{n}");
    }
    println!();
    println!("{:<40} {:>8} {:>9}", "invariant", "checked", "failures");
    for c in checks {
        println!("{:<40} {:>8} {:>9}", c.name, c.checked, c.failures.len());
    }
    for c in checks.iter().filter(|c| !c.failures.is_empty()) {
        println!();
        println!("FAILED {}: {} failure(s)", c.name, c.failures.len());
        for f in c.failures.iter().take(SHOWN) {
            println!("  - {f}");
        }
        if c.failures.len() > SHOWN {
            println!(
                "  … and {} more (all in the log directory's failures.txt)",
                c.failures.len() - SHOWN
            );
        }
    }
    let failed = checks.iter().filter(|c| !c.failures.is_empty()).count();
    println!();
    println!("{} passed, {} failed", checks.len() - failed, failed);
    failed
}
