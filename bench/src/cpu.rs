//! CPU time of processes, in clock ticks, read from `/proc`.

use std::path::Path;
use std::process::Command;

/// PostgreSQL's server CPU so far, in clock ticks, from the `pg-cpu` tool
/// (`pg-cpu --now`); `None` without a tool or when it fails.
pub fn pg_ticks(tool: Option<&Path>) -> Option<u64> {
    let out = Command::new(tool?).arg("--now").output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// A process's CPU time so far, in clock ticks (user + system), from
/// `/proc/PID/stat`; `pid` may be `"self"`.
pub fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The machine's CPU ticks so far, all cores: `(busy, total)`, from
/// `/proc/stat` (busy is everything but idle and iowait).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 if that fails).
pub fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// Ticks between two readings, in milliseconds; `None` if either is missing.
pub fn ms_between(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?) * 1000 / ticks_per_second())
}

/// The 1-minute load average (`/proc/loadavg`), to tell a quiet machine
/// from a busy one in a benchmark's output.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
