//! The command handler: run a program for each event.
//!
//! `program args…` runs with the event's payload on stdin (a file holding the
//! whole payload from the program's start) and
//! its metadata in the environment (on top of herald's own):
//!
//! | variable | value |
//! |---|---|
//! | `HERALD_EVENT_ID` | the event id (the same on every attempt) |
//! | `HERALD_TENANT` | the tenant |
//! | `HERALD_HANDLER` | the handler name |
//! | `HERALD_ATTEMPT` | this attempt, from 1 |
//! | `HERALD_MAX_ATTEMPTS` | the attempt limit |
//! | `HERALD_LEASE_TOKEN` | this run's lease token (unique per run of the event) |
//! | `HERALD_SERVER_ID` | the id of the server that runs it (see [`super::leftovers`]) |
//!
//! stdout is discarded; the last 2 KiB of stderr are kept for the event's
//! error.
//!
//! | the command | outcome |
//! |---|---|
//! | exits 0 | done |
//! | exits `snooze_exit_code` (default 75, `EX_TEMPFAIL`) | snooze for `snooze_for` (default 30 s); the attempt is given back |
//! | exits `fail_exit_code`, when set | fail: dead at once |
//! | exits with any other status | retry with backoff: `command exited with status 3: <stderr tail>` |
//! | is killed by a signal | retry: `command killed by signal SIGSEGV: <stderr tail>` |
//! | runs past `timeout` | its process group is killed; retry: `command timed out after 5m` |
//! | cannot be started | retry (see [`CommandHandler::run`]) |
//!
//! # Process groups
//!
//! The command runs in a process group of its own, so that everything it
//! starts can be stopped with it. When the run times out or is cancelled
//! (shutdown past its grace period, a lost lease), the whole group gets
//! `SIGKILL`. When the command exits by itself, whatever it left running in
//! its group (a forgotten `cmd &`) is killed too: a run's processes end with
//! the run. The group is signalled before the command itself is reaped, so
//! its id cannot have been reused by then. A process that leaves the group
//! (`setsid`, a daemon) is out of reach; such commands should not be run
//! here.
//!
//! A run's group also ends when the server dies, however it dies: the
//! server reports each group to its [run watchdog](super::watchdog), which
//! kills the live ones when the server is gone. The program itself starts
//! behind a [gate](super::gate) only once the watchdog has its group and
//! the whole payload is in hand, so a server killed at the spawn leaves no
//! program running and none runs on part of its payload.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use super::gate;
use super::leftovers::SERVER_ID_VAR;
use super::watchdog::{Registration, RunWatch};
use super::{show, ConfigError, EventMeta};
use herald::escape::escaped;
use herald::{Context, Outcome};

/// The most of stderr kept for the event's error: its last bytes.
const STDERR_TAIL: usize = 2048;
/// After the command's group is gone, how long to wait for the end of its
/// stderr (only a process that left the group can keep it open).
const STDERR_DRAIN: Duration = Duration::from_millis(500);
/// How often to look for the command's exit if no `SIGCHLD` arrives (a
/// safety net: each `SIGCHLD` already triggers a look).
const EXIT_POLL: Duration = Duration::from_secs(1);

/// `kind = "command"`: the settings of a command handler.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program: a path, or a name looked up in `PATH`.
    pub program: String,
    /// Its arguments. No shell is involved: to use one, set `program =
    /// "/bin/sh"` and `args = ["-c", "..."]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// How long one run may take before its process group is killed.
    /// Default 5 minutes.
    #[serde(
        default = "default_timeout",
        deserialize_with = "super::human_duration"
    )]
    pub timeout: Duration,
    /// The exit status that means "not now": the event is snoozed for
    /// `snooze_for` without using an attempt. Default 75 (`EX_TEMPFAIL`).
    #[serde(default = "default_snooze_exit_code")]
    pub snooze_exit_code: u8,
    /// How long a snooze lasts. Default 30 s.
    #[serde(
        default = "default_snooze_for",
        deserialize_with = "super::human_duration"
    )]
    pub snooze_for: Duration,
    /// The exit status that means "never": the event goes dead at once.
    /// Unset by default (65, `EX_DATAERR`, is a natural choice).
    #[serde(default)]
    pub fail_exit_code: Option<u8>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

fn default_snooze_exit_code() -> u8 {
    75
}

fn default_snooze_for() -> Duration {
    Duration::from_secs(30)
}

/// Runs a program for each event; see the [module docs](self).
pub struct CommandHandler {
    program: String,
    args: Vec<String>,
    timeout: Duration,
    snooze_exit_code: i32,
    snooze_for: Duration,
    fail_exit_code: Option<i32>,
    watch: RunWatch,
}

impl CommandHandler {
    /// Checks `config` (for handler `name`, which errors name) and makes
    /// the handler. The program must exist and be executable now, so that
    /// a typo stops the server at start rather than retrying every event.
    pub fn new(name: &str, config: &CommandConfig) -> Result<Self, ConfigError> {
        if config.program.is_empty() {
            return Err(ConfigError::key(name, "program", "is empty"));
        }
        find_program(&config.program).map_err(|e| ConfigError::key(name, "program", e))?;
        if config.timeout.is_zero() {
            return Err(ConfigError::key(name, "timeout", "must be more than zero"));
        }
        if config.snooze_exit_code == 0 {
            return Err(ConfigError::key(
                name,
                "snooze_exit_code",
                "0 means done; pick 1 to 255",
            ));
        }
        match config.fail_exit_code {
            Some(0) => {
                return Err(ConfigError::key(
                    name,
                    "fail_exit_code",
                    "0 means done; pick 1 to 255",
                ))
            }
            Some(c) if c == config.snooze_exit_code => {
                return Err(ConfigError::key(
                    name,
                    "fail_exit_code",
                    format!("{c} is already the snooze_exit_code"),
                ))
            }
            _ => {}
        }
        Ok(CommandHandler {
            program: config.program.clone(),
            args: config.args.clone(),
            timeout: config.timeout,
            snooze_exit_code: config.snooze_exit_code.into(),
            snooze_for: config.snooze_for,
            fail_exit_code: config.fail_exit_code.map(Into::into),
            watch: RunWatch::none(),
        })
    }

    /// Reports each run's process group to `watch`, so that runs end with
    /// the server; runs carry its server id as `HERALD_SERVER_ID`.
    pub fn watched_by(mut self, watch: RunWatch) -> Self {
        self.watch = watch;
        self
    }

    /// Runs the command for one event.
    ///
    /// When `cancelled` resolves, the process group is killed and the run
    /// gives up with `Snooze(0)` (the attempt is given back, as for any
    /// cancelled run). If this future is dropped instead (the worker drops
    /// a cancelled handler), the group is killed all the same.
    ///
    /// **A command that cannot be started retries** (with backoff, using
    /// attempts) rather than failing for good. Why: the program was checked
    /// when the handler was built, so a spawn failure later says something
    /// about this host at this moment (the program being replaced by a
    /// deploy, out of processes or file descriptors, a full disk), not about
    /// the event; the same event would run fine once the host is fixed.
    /// Failing would send every event of the handler dead at once for a
    /// host's problem.
    #[cfg(test)]
    pub(crate) async fn run(
        &self,
        payload: &str,
        meta: &EventMeta,
        cancelled: impl Future<Output = ()>,
    ) -> Outcome {
        self.run_until(payload, meta, cancelled, None).await
    }

    /// [`Self::run`], with the run's lease deadline (see
    /// [`Context::lease_deadline`]) passed on to the run watchdog, which
    /// kills the group at that instant unless it moves on, even while the
    /// server is stopped.
    pub(crate) async fn run_until(
        &self,
        payload: &str,
        meta: &EventMeta,
        cancelled: impl Future<Output = ()>,
        mut lease_deadline: Option<watch::Receiver<Instant>>,
    ) -> Outcome {
        // Listen for SIGCHLD before the child exists, so its exit cannot be missed.
        let sigchld = signal(SignalKind::child())
            .inspect_err(|e| tracing::warn!("cannot listen for SIGCHLD ({e}); polling instead"))
            .ok();
        // The whole payload, before anything starts.
        let stdin = match gate::payload_file(payload.as_bytes()) {
            Ok(fd) => fd,
            Err(e) => return Outcome::retry(format!("cannot hold the payload: {e}")),
        };
        // Watched, the program starts behind the gate, which waits until
        // the watchdog has the group; unwatched (nothing to register), at
        // once.
        let (mut command, latch) = if self.watch.is_watching() {
            let (latch, waits_on) = match gate::Latch::new() {
                Ok(l) => l,
                Err(e) => return Outcome::retry(format!("cannot make the gate's pipe: {e}")),
            };
            let gate = gate::command(Path::new(&self.program), &self.args, waits_on);
            (gate, Some(latch))
        } else {
            let mut direct = tokio::process::Command::new(&self.program);
            direct.args(&self.args).stdout(Stdio::null());
            (direct, None)
        };
        command
            .process_group(0)
            .stdin(Stdio::from(stdin))
            .stderr(Stdio::piped())
            .env("HERALD_EVENT_ID", &meta.event_id)
            .env("HERALD_TENANT", &meta.tenant)
            .env("HERALD_HANDLER", &meta.handler)
            .env("HERALD_ATTEMPT", meta.attempt.to_string())
            .env("HERALD_MAX_ATTEMPTS", meta.max_attempts.to_string())
            .env("HERALD_LEASE_TOKEN", &meta.lease_token);
        if let Some(id) = self.watch.server_id() {
            command.env(SERVER_ID_VAR, id);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return Outcome::retry(format!("cannot start command {}: {e}", self.program)),
        };
        let mut stderr = child.stderr.take();
        let Some(mut group) = ProcessGroup::new(child, self.watch.clone()) else {
            return Outcome::retry(format!("command {} vanished at start", self.program));
        };
        let pid = group.pgid;
        if let Some(d) = lease_deadline.as_mut() {
            self.watch.deadline(pid.as_raw(), *d.borrow_and_update());
        }
        tokio::pin!(cancelled);
        if let Some(registration) = group.registration.take() {
            // Until the watchdog has the group, the gate holds the program
            // back: a server killed meanwhile leaves nothing running.
            tokio::select! {
                r = registration => if r.is_err() {
                    return Outcome::retry("the run watchdog is gone: command not started");
                },
                _ = &mut cancelled => return Outcome::Snooze(Duration::ZERO),
            }
        }
        if let Some(latch) = latch {
            if let Err(e) = latch.open() {
                // The gate is gone: its exit (waited for below) says why.
                tracing::debug!("cannot open the gate: {e}");
            }
        }
        let mut tail = Tail::default();
        let (end, status) = {
            let read_stderr = read_tail(stderr.as_mut(), &mut tail);
            let exited = wait_exited(pid, sigchld);
            let deadline = tokio::time::sleep(self.timeout);
            tokio::pin!(read_stderr, exited, deadline);
            let mut stderr_done = false;
            let end = loop {
                tokio::select! {
                    // In this task, so that no deadline can follow the
                    // group's end to the watchdog.
                    at = renewed(&mut lease_deadline) => self.watch.deadline(pid.as_raw(), at),
                    _ = &mut read_stderr, if !stderr_done => stderr_done = true,
                    r = &mut exited => break r.map_or_else(End::WaitFailed, |()| End::Exited),
                    _ = &mut deadline => break End::TimedOut,
                    _ = &mut cancelled => break End::Cancelled,
                }
            };
            if let End::WaitFailed(e) = end {
                // Someone else reaped it: the group id may be anyone's now.
                group.disarm();
                return Outcome::retry(format!("cannot wait for command {}: {e}", self.program));
            }
            // The leader has exited (or is about to be killed) and is not yet
            // reaped, so the group id is still this run's.
            group.kill();
            let status = group.reap().await;
            if !stderr_done {
                let _ = tokio::time::timeout(STDERR_DRAIN, &mut read_stderr).await;
            }
            (end, status)
        };
        let tail = tail.text();
        let with_tail = |head: String| {
            if tail.is_empty() {
                head
            } else {
                format!("{head}: {tail}")
            }
        };
        let outcome = match (end, status) {
            (End::Cancelled, _) => Outcome::Snooze(Duration::ZERO),
            (End::TimedOut, _) => Outcome::retry(with_tail(format!(
                "command timed out after {}",
                show(self.timeout)
            ))),
            (_, Err(e)) => Outcome::retry(format!("cannot wait for command {}: {e}", self.program)),
            (_, Ok(status)) => self.judge(status, with_tail),
        };
        tracing::debug!(
            handler = %escaped(&meta.handler), event = %meta.event_id, attempt = meta.attempt, ?outcome,
            "command ran"
        );
        outcome
    }

    /// What an exit status means.
    fn judge(&self, status: ExitStatus, with_tail: impl Fn(String) -> String) -> Outcome {
        match (status.code(), status.signal()) {
            (Some(0), _) => Outcome::Done,
            (Some(c), _) if c == self.snooze_exit_code => Outcome::Snooze(self.snooze_for),
            (Some(c), _) if Some(c) == self.fail_exit_code => {
                Outcome::fail(with_tail(format!("command exited with status {c}")))
            }
            (Some(c), _) => Outcome::retry(with_tail(format!("command exited with status {c}"))),
            (None, Some(sig)) => {
                let name =
                    Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.to_string());
                Outcome::retry(with_tail(format!("command killed by signal {name}")))
            }
            (None, None) => Outcome::retry(with_tail(format!("command ended with {status}"))),
        }
    }
}

#[async_trait]
impl herald::Handler for CommandHandler {
    async fn call(&self, payload: &str, cx: Context) -> Outcome {
        self.run_until(
            payload,
            &EventMeta::from(&cx),
            cx.cancelled(),
            Some(cx.lease_deadline()),
        )
        .await
    }
}

/// Why the wait for the command ended.
enum End {
    Exited,
    TimedOut,
    Cancelled,
    WaitFailed(Errno),
}

/// The command's process group. Until the command is reaped, dropping this
/// kills the whole group: a run that is dropped halfway leaves nothing
/// behind. The watchdog hears of the group when this is made and when the
/// group is killed or no longer ours.
struct ProcessGroup {
    // Dropped after `Drop::drop` has run, so the group is killed before
    // tokio may reap the command.
    child: Child,
    pgid: Pid,
    armed: bool,
    watch: RunWatch,
    /// Whether the watchdog was told of this group and not yet of its end.
    watched: bool,
    /// Resolves once the watchdog has the group (`None`: unwatched, or
    /// already taken).
    registration: Option<Registration>,
}

impl ProcessGroup {
    /// Takes the spawned `child` and reports its group to `watch`.
    fn new(child: Child, watch: RunWatch) -> Option<Self> {
        let pid = i32::try_from(child.id()?).ok()?;
        let registration = watch.started(pid);
        Some(ProcessGroup {
            child,
            pgid: Pid::from_raw(pid),
            armed: true,
            watched: registration.is_some(),
            watch,
            registration,
        })
    }

    /// `SIGKILL` to every process of the group.
    fn kill(&mut self) {
        if !self.armed {
            return;
        }
        match killpg(self.pgid, Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::warn!(pgid = %self.pgid, "cannot kill a command's process group: {e}")
            }
        }
        // Every member has a SIGKILL pending now (the kernel makes a fork
        // racing the signal fail), so the group is as good as gone: the
        // watchdog may forget it before the id is freed by the reap, and
        // can never kill a reused id.
        self.unwatch();
    }

    fn unwatch(&mut self) {
        if std::mem::take(&mut self.watched) {
            self.watch.ended(self.pgid.as_raw());
        }
    }

    /// Reaps the command. After this the group id is no longer ours.
    async fn reap(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        self.armed = false;
        status
    }

    fn disarm(&mut self) {
        self.armed = false;
        self.unwatch();
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The next lease deadline, once a renewal moves it; never once the
/// runtime stops renewing (or there is none to follow).
async fn renewed(deadline: &mut Option<watch::Receiver<Instant>>) -> Instant {
    loop {
        match deadline {
            Some(d) => match d.changed().await {
                Ok(()) => return *d.borrow_and_update(),
                Err(_) => *deadline = None,
            },
            None => std::future::pending::<()>().await,
        }
    }
}

/// Resolves when process `pid` (our child) has exited, without reaping it,
/// so its process group id stays reserved until we have signalled the group.
async fn wait_exited(
    pid: Pid,
    mut sigchld: Option<tokio::signal::unix::Signal>,
) -> Result<(), Errno> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
        match sigchld.as_mut() {
            Some(s) => {
                let _ = tokio::time::timeout(EXIT_POLL, s.recv()).await;
            }
            None => tokio::time::sleep(EXIT_POLL).await,
        }
    }
}

/// The last [`STDERR_TAIL`] bytes of a stream, and whether any came before.
#[derive(Default)]
struct Tail {
    bytes: std::collections::VecDeque<u8>,
    cut: bool,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend(chunk);
        let over = self.bytes.len().saturating_sub(STDERR_TAIL);
        if over > 0 {
            self.bytes.drain(..over);
            self.cut = true;
        }
    }

    /// As text: trimmed, from a character boundary, `…` in front when cut.
    fn text(&mut self) -> String {
        let bytes = self.bytes.make_contiguous();
        let mut start = 0;
        if self.cut {
            // Skip the rest of a UTF-8 character cut in half.
            while start < bytes.len().min(3) && bytes[start] & 0b1100_0000 == 0b1000_0000 {
                start += 1;
            }
        }
        let text = String::from_utf8_lossy(&bytes[start..]);
        let text = text.trim();
        if self.cut && !text.is_empty() {
            format!("…{text}")
        } else {
            text.to_string()
        }
    }
}

/// Reads `stderr` to its end, keeping the tail.
async fn read_tail(stderr: Option<&mut ChildStderr>, tail: &mut Tail) {
    let Some(stderr) = stderr else { return };
    let mut buf = vec![0u8; 8192];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => tail.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Where `program` would be found: itself when it has a `/`, else the first
/// executable of that name on `PATH`.
fn find_program(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        let path = Path::new(program);
        return executable(path).map(|()| path.to_path_buf());
    }
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .map(|dir| dir.join(program))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| format!("no executable {program:?} on PATH"))
}

fn executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a file", path.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{}: not executable", path.display()));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use super::*;

    fn meta() -> EventMeta {
        EventMeta {
            event_id: herald::EventId::new().to_string(),
            tenant: "acme".into(),
            handler: "resize".into(),
            attempt: 3,
            max_attempts: 7,
            lease_token: herald::LeaseToken::new().0.to_string(),
        }
    }

    /// `/bin/sh -c script`, with the test's directory as `$1`.
    fn sh(script: &str, dir: &Path) -> CommandConfig {
        CommandConfig {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                script.into(),
                "sh".into(),
                dir.display().to_string(),
            ],
            timeout: Duration::from_secs(20),
            snooze_exit_code: 75,
            snooze_for: Duration::from_secs(30),
            fail_exit_code: None,
        }
    }

    async fn run(config: &CommandConfig, payload: &str) -> Outcome {
        CommandHandler::new("resize", config)
            .unwrap()
            .run(payload, &meta(), std::future::pending())
            .await
    }

    /// Whether `pid` is a live process (a zombie counts as dead: in a
    /// container whose init does not reap, killed orphans stay zombies).
    pub(crate) fn alive(pid: i32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let state = stat[stat.rfind(')').unwrap() + 1..]
            .trim_start()
            .chars()
            .next();
        !matches!(state, Some('Z' | 'X'))
    }

    /// Waits (a little) for every pid in `dir/pids` to be dead.
    async fn assert_all_dead(dir: &Path, expected: usize) {
        let text = std::fs::read_to_string(dir.join("pids")).unwrap();
        let pids: Vec<i32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(pids.len(), expected, "pids: {text:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|&p| alive(p)) {
            assert!(
                Instant::now() < deadline,
                "still alive: {:?}",
                pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for `dir/pids` to hold `n` pids (the script is running).
    async fn wait_for_pids(dir: &Path, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
            if text.split_whitespace().count() >= n {
                return;
            }
            assert!(Instant::now() < deadline, "the script never wrote its pids");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn exit_0_is_done_with_the_payload_on_stdin_and_the_metadata_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let config = sh(
            r#"cat > "$1/payload"; env | grep '^HERALD_' | sort > "$1/env""#,
            dir.path(),
        );
        let payload = r#"{"image": "cat.png", "sizes": [64, 128]}"#;
        let meta = meta();
        let out = CommandHandler::new("resize", &config)
            .unwrap()
            .run(payload, &meta, std::future::pending())
            .await;
        assert_eq!(out, Outcome::Done);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("payload")).unwrap(),
            payload
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("env")).unwrap(),
            format!(
                "HERALD_ATTEMPT=3\nHERALD_EVENT_ID={}\nHERALD_HANDLER=resize\nHERALD_LEASE_TOKEN={}\nHERALD_MAX_ATTEMPTS=7\nHERALD_TENANT=acme\n",
                meta.event_id, meta.lease_token
            )
        );
    }

    #[tokio::test]
    async fn the_whole_payload_is_on_stdin_as_a_file_when_the_program_begins() {
        // A pipe would show size 0 at the start, and a payload written into
        // it by a server that dies halfway would end early.
        let payload = "x".repeat(300_000);
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let config = sh(
                r#"stat -L -c %s /dev/stdin > "$1/size"; wc -c < /dev/stdin > "$1/read""#,
                dir.path(),
            );
            let mut handler = CommandHandler::new("resize", &config).unwrap();
            let held = if watched {
                let (watch, held) = RunWatch::held("0123456789abcdef");
                handler = handler.watched_by(watch);
                Some(std::thread::spawn(move || {
                    // Acknowledge every registration, as a live watchdog would.
                    while let Some((_, ack)) = held.next(Duration::from_secs(20)) {
                        if let Some(ack) = ack {
                            let _ = ack.send(());
                        }
                    }
                }))
            } else {
                None
            };
            let out = handler.run(&payload, &meta(), std::future::pending()).await;
            assert_eq!(out, Outcome::Done, "watched: {watched}");
            for file in ["size", "read"] {
                let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
                assert_eq!(text.trim(), "300000", "{file}, watched: {watched}");
            }
            drop(handler);
            if let Some(t) = held {
                t.join().unwrap();
            }
        }
    }

    #[tokio::test]
    async fn a_watched_program_begins_only_once_the_watchdog_has_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let config = sh(r#"echo $$ > "$1/began""#, dir.path());
        let (watch, held) = RunWatch::held("0123456789abcdef");
        let handler = CommandHandler::new("resize", &config)
            .unwrap()
            .watched_by(watch);
        let began = dir.path().join("began");
        let checker = {
            let began = began.clone();
            std::thread::spawn(move || {
                let (line, ack) = held.next(Duration::from_secs(20)).expect("a registration");
                assert!(line.starts_with('+'), "{line}");
                let pgid: i32 = line[1..].parse().unwrap();
                // The group exists (its gate runs) but the program has not
                // begun: a server killed now would leave nothing running.
                std::thread::sleep(Duration::from_millis(500));
                assert!(alive(pgid), "the gate is running");
                assert!(!began.exists(), "the program began before its registration");
                ack.expect("a registration waits").send(()).unwrap();
                let (line, _) = held.next(Duration::from_secs(20)).expect("its end");
                assert_eq!(line, format!("-{pgid}"));
                pgid
            })
        };
        let out = handler.run("{}", &meta(), std::future::pending()).await;
        assert_eq!(out, Outcome::Done);
        let pgid = checker.join().unwrap();
        let text = std::fs::read_to_string(&began).unwrap();
        assert_eq!(
            text.trim(),
            pgid.to_string(),
            "the program is the gate's process"
        );
    }

    #[tokio::test]
    async fn the_snooze_exit_code_snoozes_for_snooze_for() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            run(&sh("exit 75", dir.path()), "{}").await,
            Outcome::Snooze(Duration::from_secs(30))
        );
        let config = CommandConfig {
            snooze_exit_code: 42,
            snooze_for: Duration::from_millis(1500),
            ..sh("exit 42", dir.path())
        };
        assert_eq!(
            run(&config, "{}").await,
            Outcome::Snooze(Duration::from_millis(1500))
        );
    }

    #[tokio::test]
    async fn another_exit_status_retries_with_the_tail_of_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            &sh(
                "echo starting; echo 'resize: disk full' >&2; exit 3",
                dir.path(),
            ),
            "{}",
        )
        .await;
        assert_eq!(
            out,
            Outcome::retry("command exited with status 3: resize: disk full")
        );
        // Without stderr, no trailing colon.
        let out = run(&sh("exit 1", dir.path()), "{}").await;
        assert_eq!(out, Outcome::retry("command exited with status 1"));
    }

    #[tokio::test]
    async fn the_fail_exit_code_fails_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let config = CommandConfig {
            fail_exit_code: Some(65),
            ..sh("echo 'not an image' >&2; exit 65", dir.path())
        };
        assert_eq!(
            run(&config, "{}").await,
            Outcome::fail("command exited with status 65: not an image")
        );
    }

    #[tokio::test]
    async fn a_command_killed_by_a_signal_retries_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            &sh("echo bye >&2; kill -TERM $$; sleep 5", dir.path()),
            "{}",
        )
        .await;
        assert_eq!(out, Outcome::retry("command killed by signal SIGTERM: bye"));
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group_grandchildren_included() {
        let dir = tempfile::tempdir().unwrap();
        let config = CommandConfig {
            timeout: Duration::from_millis(500),
            ..sh(
                r#"echo $$ > "$1/pids"; sleep 1000 & echo $! >> "$1/pids"; sleep 1000"#,
                dir.path(),
            )
        };
        let started = Instant::now();
        let out = run(&config, "{}").await;
        assert_eq!(out, Outcome::retry("command timed out after 500ms"));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_all_dead(dir.path(), 2).await;
    }

    #[tokio::test]
    async fn what_a_command_leaves_running_in_its_group_is_killed_when_it_exits() {
        let dir = tempfile::tempdir().unwrap();
        // The background sleep also holds stderr open: the run must not wait for it.
        let started = Instant::now();
        let out = run(
            &sh(r#"sleep 1000 & echo $! > "$1/pids"; exit 0"#, dir.path()),
            "{}",
        )
        .await;
        assert_eq!(out, Outcome::Done);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_all_dead(dir.path(), 1).await;
    }

    #[tokio::test]
    async fn cancellation_kills_the_group_and_gives_the_attempt_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = sh(
            r#"echo $$ > "$1/pids"; sleep 1000 & echo $! >> "$1/pids"; sleep 1000"#,
            dir.path(),
        );
        let h = CommandHandler::new("resize", &config).unwrap();
        let path = dir.path().to_path_buf();
        let cancelled = async move { wait_for_pids(&path, 2).await };
        let out = h.run("{}", &meta(), cancelled).await;
        assert_eq!(out, Outcome::Snooze(Duration::ZERO));
        assert_all_dead(dir.path(), 2).await;
    }

    #[tokio::test]
    async fn a_run_dropped_halfway_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let config = sh(
            r#"echo $$ > "$1/pids"; sleep 1000 & echo $! >> "$1/pids"; sleep 1000"#,
            dir.path(),
        );
        let h = CommandHandler::new("resize", &config).unwrap();
        let meta = meta();
        let run = h.run("{}", &meta, std::future::pending());
        tokio::select! {
            _ = run => panic!("the command ended by itself"),
            _ = wait_for_pids(dir.path(), 2) => {}
        }
        // `run` is dropped here, as the worker drops a cancelled handler.
        assert_all_dead(dir.path(), 2).await;
    }

    #[tokio::test]
    async fn a_program_that_cannot_be_started_retries() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("resize");
        std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = CommandConfig {
            program: program.display().to_string(),
            args: vec![],
            ..sh("", dir.path())
        };
        let h = CommandHandler::new("resize", &config).unwrap();
        assert_eq!(
            h.run("{}", &meta(), std::future::pending()).await,
            Outcome::Done
        );
        // Removed after the handler was built (a deploy halfway through).
        std::fs::remove_file(&program).unwrap();
        let out = h.run("{}", &meta(), std::future::pending()).await;
        assert_eq!(
            out,
            Outcome::retry(format!(
                "cannot start command {}: No such file or directory (os error 2)",
                program.display()
            ))
        );
    }

    #[test]
    fn a_program_that_does_not_exist_is_refused_when_the_handler_is_built() {
        let dir = tempfile::tempdir().unwrap();
        let error = |program: &str| {
            let config = CommandConfig {
                program: program.into(),
                ..sh("", dir.path())
            };
            CommandHandler::new("resize", &config)
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            error("/usr/local/bin/no-such-resize"),
            "handlers.resize.program: /usr/local/bin/no-such-resize: No such file or directory (os error 2)"
        );
        assert_eq!(
            error("no-such-resize-on-path"),
            r#"handlers.resize.program: no executable "no-such-resize-on-path" on PATH"#
        );
        let plain = dir.path().join("notes.txt");
        std::fs::write(&plain, "x").unwrap();
        assert_eq!(
            error(plain.to_str().unwrap()),
            format!(
                "handlers.resize.program: {}: not executable",
                plain.display()
            )
        );
        assert_eq!(
            error(dir.path().to_str().unwrap()),
            format!(
                "handlers.resize.program: {}: not a file",
                dir.path().display()
            )
        );
        assert_eq!(error(""), "handlers.resize.program: is empty");
        // A bare name is found on PATH.
        assert!(CommandHandler::new(
            "resize",
            &CommandConfig {
                program: "sh".into(),
                ..sh("", dir.path())
            }
        )
        .is_ok());
    }

    #[tokio::test]
    async fn a_huge_stderr_is_cut_to_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            &sh(
                "head -c 5000000 /dev/zero | tr '\\0' x >&2; echo ' the end' >&2; exit 3",
                dir.path(),
            ),
            "{}",
        )
        .await;
        let Outcome::Retry { error, after: None } = out else {
            panic!("{out:?}")
        };
        let tail = error
            .strip_prefix("command exited with status 3: …")
            .unwrap();
        assert!(tail.ends_with("xxx the end"), "{tail}");
        assert!(tail.len() <= STDERR_TAIL, "{}", tail.len());
        assert!(tail.len() >= STDERR_TAIL - 10, "{}", tail.len());
    }

    #[tokio::test]
    async fn a_command_that_does_not_read_a_large_payload_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        let payload = format!(r#"{{"blob":"{}"}}"#, "z".repeat(4 << 20));
        let started = Instant::now();
        assert_eq!(
            run(&sh("exit 0", dir.path()), &payload).await,
            Outcome::Done
        );
        // And one that reads only part of it.
        assert_eq!(
            run(&sh("head -c 10 > /dev/null; exit 0", dir.path()), &payload).await,
            Outcome::Done
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn the_tail_starts_on_a_character_boundary() {
        let mut tail = Tail::default();
        tail.push("é".repeat(STDERR_TAIL).as_bytes());
        let text = tail.text();
        assert!(text.starts_with("…é"), "{text}");
        assert!(!text.contains('\u{fffd}'));
        let mut short = Tail::default();
        short.push(b"  short  \n");
        assert_eq!(short.text(), "short");
    }

    #[test]
    fn exit_codes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let error = |config: CommandConfig| {
            CommandHandler::new("resize", &config)
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            error(CommandConfig {
                snooze_exit_code: 0,
                ..sh("", dir.path())
            }),
            "handlers.resize.snooze_exit_code: 0 means done; pick 1 to 255"
        );
        assert_eq!(
            error(CommandConfig {
                fail_exit_code: Some(75),
                ..sh("", dir.path())
            }),
            "handlers.resize.fail_exit_code: 75 is already the snooze_exit_code"
        );
        assert_eq!(
            error(CommandConfig {
                timeout: Duration::ZERO,
                ..sh("", dir.path())
            }),
            "handlers.resize.timeout: must be more than zero"
        );
    }
}
