//! A command's processes end with the `herald serve` that started them,
//! however it dies: `kill -9` of the server (its run watchdog kills them),
//! `kill -9` of the server and its watchdog together (the next server kills
//! the leftovers at start), and a watchdog killed while the server lives
//! (the server starts another one that covers the runs in flight).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::Server;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// The command: a background `sleep` and a foreground one in the run's
/// process group; it writes both pids (the foreground one is the shell
/// itself, `exec`ed) to `$1/pids` once both exist.
const SCRIPT: &str =
    r#"sleep 60 & echo "$! $$" > "$1/pids.tmp" && mv "$1/pids.tmp" "$1/pids"; exec sleep 60"#;

/// A test's directory: `herald.toml`, the store, the runtime directory of
/// the server's lock files (`run/`), and the command's `pids`.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        // Long: no rescue of the event while a test runs.
        Setup::with_lease("1h")
    }

    fn with_lease(lease: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            r#"
store = "sqlite://{db}"
listen = "127.0.0.1:0"
[worker]
lease = "{lease}"
[handlers.slow]
kind = "command"
program = "/bin/sh"
args = ["-c", {script}, "sh", "{dir}"]
timeout = "1h"
"#,
            db = dir.path().join("herald.db").display(),
            script = toml_string(SCRIPT),
            dir = dir.path().display(),
        );
        std::fs::write(dir.path().join("herald.toml"), config).unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        Setup { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn runtime_dir(&self) -> PathBuf {
        self.path().join("run")
    }

    /// Starts `herald serve` on this directory's config, with its lock
    /// files in `run/` (so that tests running at once leave each other
    /// alone).
    fn serve(&self) -> Server {
        let mut cmd = common::herald(self.path());
        cmd.args(["serve", "--config"])
            .arg(self.path().join("herald.toml"))
            .env("HERALD_LOG", "info")
            .env("XDG_RUNTIME_DIR", self.runtime_dir());
        Server::start(cmd)
    }

    /// Emits one event for `slow` and waits for the command's two pids.
    async fn start_run(&self, s: &Server) -> Vec<i32> {
        let r = reqwest::Client::new()
            .post(s.url("/v1/events"))
            .json(&json!({"tenant": "t", "handler": "slow", "payload": {}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let file = self.path().join("pids");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let pids: Vec<i32> = text
                    .split_whitespace()
                    .map(|p| p.parse().unwrap())
                    .collect();
                assert_eq!(pids.len(), 2, "{text:?}");
                assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
                return pids;
            }
            assert!(
                Instant::now() < deadline,
                "the command never started; stderr:\n{}",
                s.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// Whether `pid` is a live process (a zombie counts as dead: in a
/// container whose init does not reap, killed orphans stay zombies).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat[stat.rfind(')').unwrap() + 1..]
        .trim_start()
        .chars()
        .next();
    !matches!(state, Some('Z' | 'X'))
}

/// Waits up to 5 s for every pid to be dead.
async fn assert_all_dead(pids: &[i32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| alive(p)) {
        if Instant::now() > deadline {
            let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
            // Don't leave them behind for the other tests.
            for &p in &left {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            panic!("{what}: still alive 5 s later: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stopped_servers_commands_are_killed_before_their_lease_can_lapse() {
    // A server stopped (SIGSTOP, a frozen VM) cannot cancel its runs; its
    // watchdog kills each at the run's lease deadline, a sixth of the
    // lease before another server could claim the event.
    let setup = Setup::with_lease("3s");
    let server = setup.serve();
    let pids = setup.start_run(&server).await;
    let stopped = Instant::now();
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGSTOP).unwrap();
    let deadline = stopped + Duration::from_secs(3);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline + Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead_at = Instant::now();
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGCONT).unwrap();
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    assert!(
        left.is_empty(),
        "still running with the server stopped: {left:?}"
    );
    assert!(
        dead_at < deadline,
        "killed {:?} after the stop, at or past the 3 s lease",
        dead_at - stopped
    );
}

/// The run watchdog of the server `server`: its child whose command line
/// has `watch-runs`. Waits (a little) for one other than `not`.
async fn watchdog_of(server: u32, not: Option<i32>) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if Some(pid) == not || !alive(pid) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if ppid == Some(server) && cmdline.split(|&b| b == 0).any(|a| a == b"watch-runs") {
                return pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no run watchdog under server {server}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill_9(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}

/// `kill -9` of the server while a command runs: the command and its
/// background child end within seconds, and so does the watchdog.
#[tokio::test]
async fn a_killed_server_takes_its_commands_with_it() {
    let setup = Setup::new();
    let mut s = setup.serve();
    let watchdog = watchdog_of(s.child.id(), None).await;
    let pids = setup.start_run(&s).await;
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert_all_dead(&pids, "the command's processes").await;
    assert_all_dead(&[watchdog], "the watchdog").await;
}

/// `kill -9` of the server and its watchdog at once: the command runs on,
/// until the next server on this runtime directory starts, finds it by its
/// `HERALD_SERVER_ID` (a server whose lock nobody holds) and kills it.
#[tokio::test]
async fn the_next_server_kills_what_a_killed_server_and_watchdog_left() {
    // The watchdog first, so that it cannot act on the server's death. On
    // a busy machine the server may still run between the two kills and
    // start another watchdog, which then does its job: try again.
    let mut tries = 0;
    let (setup, pids) = loop {
        tries += 1;
        let setup = Setup::new();
        let mut s = setup.serve();
        let watchdog = watchdog_of(s.child.id(), None).await;
        let pids = setup.start_run(&s).await;
        kill_9(watchdog);
        kill_9(s.child.id() as i32);
        s.child.wait().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if pids.iter().all(|&p| alive(p)) {
            break (setup, pids);
        }
        assert!(
            s.stderr().contains("starting another one"),
            "the command died without a second watchdog:\n{}",
            s.stderr()
        );
        assert!(tries < 10, "the server replaced its watchdog every time");
    };
    let locks_before: Vec<_> = std::fs::read_dir(setup.runtime_dir().join("herald"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(locks_before.len(), 1, "{locks_before:?}");

    let next = setup.serve();
    assert_all_dead(&pids, "the leftovers").await;
    let stderr = next.stderr();
    for pid in &pids {
        assert!(
            stderr.contains(&pid.to_string()),
            "pid {pid} is not in the log:\n{stderr}"
        );
    }
    let locks_after: Vec<_> = std::fs::read_dir(setup.runtime_dir().join("herald"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        locks_after.len(),
        1,
        "the stale lock file is removed: {locks_after:?}"
    );
    assert_ne!(locks_after, locks_before);
}

/// A watchdog killed while the server lives is replaced, with the runs in
/// flight: a later `kill -9` of the server still takes the command along.
#[tokio::test]
async fn a_killed_watchdog_is_replaced_and_still_covers_the_runs_in_flight() {
    let setup = Setup::new();
    let mut s = setup.serve();
    let first = watchdog_of(s.child.id(), None).await;
    let pids = setup.start_run(&s).await;
    kill_9(first);
    let second = watchdog_of(s.child.id(), Some(first)).await;
    assert_ne!(first, second);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.stderr().contains("run watchdog") || !s.stderr().contains("WARN") {
        assert!(Instant::now() < deadline, "no warning:\n{}", s.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pids.iter().all(|&p| alive(p)), "the run goes on");
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert_all_dead(&pids, "the command's processes").await;
    assert_all_dead(&[second], "the second watchdog").await;
}

/// A watchdog started with the live groups on its command line kills them
/// even when its server dies before writing a line (a replacement's
/// groups are known from its exec on).
#[test]
fn the_watchdog_kills_the_groups_named_on_its_command_line() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let mut group = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap();
    let status = common::herald(dir.path())
        .args(["watch-runs", &format!("+{}", group.id())])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    let status = group.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

/// `herald watch-runs` by itself: it kills the groups it was told about
/// (and not those it was told are gone) when its stdin closes, and
/// SIGTERM/SIGINT/SIGHUP don't stop it before that.
#[test]
fn the_watchdog_kills_the_live_groups_at_eof_and_ignores_termination_signals() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let group = |_: ()| {
        Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let (mut live, mut gone) = (group(()), group(()));
    let mut watchdog = common::herald(dir.path())
        .arg("watch-runs")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = watchdog.stdin.take().unwrap();
    writeln!(stdin, "+{}\n+{}\n-{}", live.id(), gone.id(), gone.id()).unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        kill(Pid::from_raw(watchdog.id() as i32), sig).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        watchdog.try_wait().unwrap().is_none(),
        "a signal stopped it"
    );
    drop(stdin);
    let status = watchdog.wait().unwrap();
    assert!(status.success(), "{status}");
    let status = live.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(gone.try_wait().unwrap().is_none(), "told it was gone");
    gone.kill().unwrap();
    gone.wait().unwrap();
}
