//! What the servers run: the handlers (one shell script with modes, each
//! run appending to the ledger) and their `herald.toml` tables.

use std::path::Path;

use herald_bench::fleet::toml_string;

/// The tenant of every event but the pause/block storms'.
pub(crate) const TENANT: &str = "chaos";
/// The tenant whose `stormy` handler the storms pause and block.
pub(crate) const STORM_TENANT: &str = "storm";
/// The topic fanned out to `fan_a` and `fan_b`.
pub(crate) const TOPIC: &str = "fan";
/// The schedule's name (tenant [`TENANT`], handler `sched`).
pub(crate) const SCHEDULE: &str = "tick";
/// `max_attempts` of the crash-looping events.
pub(crate) const CRASH_MAX_ATTEMPTS: u32 = 3;
/// How long a `slow` run sleeps (more than the lease: it lives on heartbeats).
pub(crate) const SLOW_SECS: u64 = 5;

/// What a handler does, and what the producer emits to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// Succeeds.
    Ok,
    /// Fails on attempts 1 and 2, then succeeds.
    Flaky,
    /// Sleeps past the lease, then succeeds.
    Slow,
    /// Snoozes once (exit 75), then succeeds.
    Snooze,
    /// Killed by a signal on every attempt: dead after its max attempts.
    Crash,
    /// Exits with `fail_exit_code`: dead at once.
    Fail,
    /// Emitted to the topic: one event for `fan_a`, one for `fan_b`.
    Fan,
    /// Succeeds; its tenant's handler is paused and blocked by the storms.
    Storm,
}

impl Mode {
    /// Every mode the producer emits, with its weight.
    pub(crate) const MIX: [(Mode, u32); 8] = [
        (Mode::Ok, 35),
        (Mode::Flaky, 12),
        (Mode::Slow, 8),
        (Mode::Snooze, 10),
        (Mode::Crash, 5),
        (Mode::Fail, 5),
        (Mode::Fan, 15),
        (Mode::Storm, 10),
    ];

    /// Its name in payloads and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Ok => "ok",
            Mode::Flaky => "flaky",
            Mode::Slow => "slow",
            Mode::Snooze => "snooze",
            Mode::Crash => "crash",
            Mode::Fail => "fail",
            Mode::Fan => "fan",
            Mode::Storm => "stormy",
        }
    }

    /// How many of its first attempts fail by design.
    pub(crate) fn designed_failures(self) -> u32 {
        match self {
            Mode::Flaky => 2,
            _ => 0,
        }
    }

    /// Whether its events end dead rather than done.
    pub(crate) fn ends_dead(self) -> bool {
        matches!(self, Mode::Crash | Mode::Fail)
    }
}

/// The handler script: `chaos-handler.sh MODE LEDGER`. Three ledger lines
/// per run, each one `write` in append mode (atomic for lines this short):
/// `B` as it starts (before reading stdin), `R` with the length and POSIX
/// `cksum` of stdin, `E` with its exit code (missing when the run was
/// killed). A run is known by its event and lease token (unique per run). Times are `$EPOCHREALTIME`: no process per line.
const SCRIPT: &str = r#"#!/bin/bash
mode=$1 ledger=$2
printf 'B %s %s %s %s %s %s %s %s %s\n' "$EPOCHREALTIME" "$HERALD_EVENT_ID" "$HERALD_ATTEMPT" \
  "$HERALD_MAX_ATTEMPTS" "$HERALD_LEASE_TOKEN" "${HERALD_SERVER_ID:-none}" "$$" "$PPID" "$HERALD_HANDLER" >>"$ledger"
read -r sum len < <(cksum)
printf 'R %s %s %s %s %s\n' "$EPOCHREALTIME" "$HERALD_EVENT_ID" "$HERALD_LEASE_TOKEN" "$len" "$sum" >>"$ledger"
code=0
case $mode in
  flaky) [ "$HERALD_ATTEMPT" -lt 3 ] && code=1 ;;
  slow) sleep __SLOW__ ;;
  snooze) mkdir "$ledger.snoozed/$HERALD_EVENT_ID" 2>/dev/null && code=75 ;;
  crash)
    printf 'E %s %s %s signal\n' "$EPOCHREALTIME" "$HERALD_EVENT_ID" "$HERALD_LEASE_TOKEN" >>"$ledger"
    kill -KILL $$ ;;
  fail) code=65 ;;
esac
printf 'E %s %s %s %s\n' "$EPOCHREALTIME" "$HERALD_EVENT_ID" "$HERALD_LEASE_TOKEN" "$code" >>"$ledger"
exit $code
"#;

/// Writes the script into `dir`; returns its path.
pub(crate) fn write_script(dir: &Path, ledger: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("chaos-handler.sh");
    std::fs::write(&path, SCRIPT.replace("__SLOW__", &SLOW_SECS.to_string()))
        .expect("write the handler script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make the handler script executable");
    std::fs::create_dir_all(format!("{}.snoozed", ledger.display()))
        .expect("the snooze markers' directory");
    path
}

/// The `[worker]` keys of every server.
pub(crate) fn worker_keys(lease_secs: u64) -> Vec<(&'static str, String)> {
    vec![
        ("lease", toml_string(&format!("{lease_secs}s"))),
        ("concurrency", "32".into()),
        ("shutdown_grace", "\"2s\"".into()),
    ]
}

/// The `[worker.retry]`, handler, subscription and schedule tables.
pub(crate) fn handler_tables(script: &Path, ledger: &Path) -> String {
    let command = |name: &str, mode: &str, extra: &str| {
        format!(
            "[handlers.{name}]\nkind = \"command\"\nprogram = {}\nargs = [{}, {}]\ntimeout = \"30s\"\n{extra}\n",
            toml_string(&script.display().to_string()),
            toml_string(mode),
            toml_string(&ledger.display().to_string()),
        )
    };
    let mut text = String::from(
        "[worker.retry]\nbase = \"500ms\"\nmax = \"4s\"\nfactor = 2.0\njitter = 0.2\n\n",
    );
    for mode in [
        "ok", "flaky", "slow", "crash", "stormy", "sched", "fan_a", "fan_b",
    ] {
        let script_mode = match mode {
            "stormy" | "sched" | "fan_a" | "fan_b" => "ok",
            m => m,
        };
        text.push_str(&command(mode, script_mode, ""));
    }
    text.push_str(&command("snooze", "snooze", "snooze_for = \"1s\"\n"));
    text.push_str(&command("fail", "fail", "fail_exit_code = 65\n"));
    for h in ["fan_a", "fan_b"] {
        text.push_str(&format!(
            "[[subscriptions]]\ntopic = {}\nhandler = {}\n\n",
            toml_string(TOPIC),
            toml_string(h)
        ));
    }
    text.push_str(&format!(
        "[[schedules]]\ntenant = {}\nname = {}\nhandler = \"sched\"\nevery = \"2s\"\npayload = {{ kind = \"tick\" }}\n",
        toml_string(TENANT),
        toml_string(SCHEDULE)
    ));
    text
}
