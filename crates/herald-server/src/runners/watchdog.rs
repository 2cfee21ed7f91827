//! The run watchdog: command runs end when the server that started them
//! dies, however it dies.
//!
//! At start, `herald serve` spawns `herald watch-runs` (itself, a hidden
//! subcommand) with a pipe to its stdin, and writes one line per change:
//! `+PGID` when a command's process group starts (before its program may
//! begin: see [the gate](super::gate)), `=PGID:MS` with the run's lease
//! deadline (milliseconds of `CLOCK_MONOTONIC`) at the start and at each
//! renewal, `-PGID` when it is gone. The watchdog keeps the live groups
//! and their deadlines. When its stdin reaches EOF, the server is gone (an
//! exit, a panic, `kill -9`: the kernel closes the pipe in every case), so
//! it sends `SIGKILL` to every live group and exits. When a group's
//! deadline passes without a later one, the server could not renew its
//! lease (it is stopped: `SIGSTOP`, a frozen VM, or the store is away and
//! its own cancel is late), so the watchdog kills that group: a run of a
//! stopped server never overlaps the run of another server that claims
//! the event once the lease lapses. It runs in a process group of its own (a signal to the server's
//! group does not reach it) and ignores SIGINT, SIGTERM and SIGHUP: it ends
//! only after the server has.
//!
//! If the watchdog dies while the server lives, the server notices (the
//! watchdog's stdout, which only it holds, reaches EOF; or a write fails),
//! logs a warning and starts another one with the live set on its command
//! line (`watch-runs +PGID…`: known from its exec on, so a server killed
//! an instant later still leaves a watchdog that kills them). A server and
//! watchdog killed together leave their runs behind: the next server finds
//! and kills them at start ([`super::leftovers`]).
//!
//! Why not `PR_SET_PDEATHSIG` on each command: it needs `unsafe` (a
//! `pre_exec` hook), and it fires when the *thread* that spawned the child
//! ends, not the process: with tokio, commands are spawned from worker and
//! blocking-pool threads that come and go, so a healthy server would kill
//! its own runs. And why one watchdog per server rather than one supervisor
//! per run: a supervisor process per run costs a fork and exec on every
//! run (285 runs/s against 1,020 with the watchdog in an earlier
//! measurement; see `docs/handlers.md`).

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;

/// The hidden subcommand that runs the watchdog.
pub const SUBCOMMAND: &str = "watch-runs";
/// How long to wait before trying again when a watchdog cannot be started.
const RESPAWN_PAUSE: Duration = Duration::from_secs(1);

/// One line of the server's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// `+PGID`: a run's group started.
    Started(i32),
    /// `-PGID`: it is gone (or has been sent `SIGKILL`).
    Ended(i32),
    /// `=PGID:MS`: kill it at `MS` (milliseconds of `CLOCK_MONOTONIC`,
    /// which every process of the machine shares) unless told a later
    /// time first: when the server gives the run up unless its lease is
    /// renewed.
    Deadline(i32, u64),
}

/// The live groups, each with its deadline if it has one.
type Live = BTreeMap<i32, Option<u64>>;

impl Change {
    fn parse(line: &str) -> Option<Change> {
        let line = line.trim();
        let (sign, rest) = line.split_at_checked(1)?;
        // A group id is a positive pid; 0 or a negative one would make
        // killpg hit the watchdog's own group or every process.
        let group = |number: &str| number.parse::<i32>().ok().filter(|&p| p > 1);
        match sign {
            "+" => Some(Change::Started(group(rest)?)),
            "-" => Some(Change::Ended(group(rest)?)),
            "=" => {
                let (pgid, ms) = rest.split_once(':')?;
                Some(Change::Deadline(group(pgid)?, ms.parse().ok()?))
            }
            _ => None,
        }
    }

    fn line(self) -> String {
        match self {
            Change::Started(p) => format!("+{p}\n"),
            Change::Ended(p) => format!("-{p}\n"),
            Change::Deadline(p, ms) => format!("={p}:{ms}\n"),
        }
    }

    fn apply(self, live: &mut Live) {
        match self {
            Change::Started(p) => {
                live.insert(p, None);
            }
            Change::Ended(p) => {
                live.remove(&p);
            }
            // Only for a group still live: a deadline after its end (the
            // lines of one run come in order) names nobody.
            Change::Deadline(p, ms) => {
                if let Some(d) = live.get_mut(&p) {
                    *d = Some(ms);
                }
            }
        }
    }

    /// The lines that make a new watchdog know `live`.
    fn describe(live: &Live) -> Vec<String> {
        live.iter()
            .flat_map(|(&p, &d)| {
                let started = Change::Started(p).line();
                let deadline = d.map(|ms| Change::Deadline(p, ms).line());
                std::iter::once(started).chain(deadline)
            })
            .map(|l| l.trim_end().to_string())
            .collect()
    }
}

/// Now, in milliseconds of `CLOCK_MONOTONIC`.
fn monotonic_ms() -> u64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64) * 1000 + (t.tv_nsec() as u64) / 1_000_000,
        // Cannot fail on Linux; 0 would only make deadlines look far.
        Err(_) => 0,
    }
}

/// `at` (an instant of this process) in milliseconds of `CLOCK_MONOTONIC`:
/// the clock `Instant` reads on Linux, so another process can compare it.
fn monotonic_ms_of(at: Instant) -> u64 {
    let now = Instant::now();
    let ahead = at.saturating_duration_since(now).as_millis() as u64;
    let behind = now.saturating_duration_since(at).as_millis() as u64;
    (monotonic_ms() + ahead).saturating_sub(behind)
}

fn kill_group(pgid: i32) {
    match killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid, "run watchdog: cannot kill a process group: {e}"),
    }
}

/// For a program that embeds herald's command handlers: the watchdog is
/// this same executable started as `PROGRAM watch-runs`, so such a program
/// calls this first thing in `main`, before any thread starts, and returns
/// the exit code it gives:
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     if let Some(code) = herald_server::runners::watchdog::run_if_asked() {
///         return code;
///     }
///     // … the program, which may start a RunWatch …
///     std::process::ExitCode::SUCCESS
/// }
/// ```
pub fn run_if_asked() -> Option<ExitCode> {
    let asked = std::env::args_os().nth(1).is_some_and(|a| a == SUBCOMMAND);
    asked.then(|| {
        let groups: Vec<String> = std::env::args().skip(2).collect();
        watch_runs(&groups)
    })
}

/// `herald watch-runs [+PGID…]`: takes the groups named on its command
/// line, reads `+PGID`/`-PGID` lines from stdin until EOF, then kills
/// every group still live. Call before any other thread exists:
/// the signal mask set here is the calling thread's.
pub fn watch_runs(groups: &[String]) -> ExitCode {
    // Blocked, these signals stay pending and never act: the watchdog must
    // outlive the server, which a service manager may signal together
    // with it. SIGKILL still ends it (and the next server cleans up).
    let mut quiet = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        quiet.add(s);
    }
    if let Err(e) = quiet.thread_block() {
        tracing::warn!("run watchdog: cannot block SIGINT/SIGTERM/SIGHUP: {e}");
    }
    let mut live = Live::new();
    // The groups live when this watchdog was started, then the changes.
    for arg in groups {
        match Change::parse(arg) {
            Some(change) => change.apply(&mut live),
            None => tracing::warn!("run watchdog: ignoring the argument {arg:?}"),
        }
    }
    // Lines come from a thread of their own, so that deadlines pass while
    // none arrive (a stopped server writes nothing).
    let (tx, lines) = mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("herald-watch-runs-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = reader {
        tracing::error!("run watchdog: cannot start its reader thread: {e}");
        return ExitCode::FAILURE;
    }
    loop {
        let next = live.values().flatten().min().copied();
        let wait = next.map_or(Duration::from_secs(3600), |ms| {
            Duration::from_millis(ms.saturating_sub(monotonic_ms()))
        });
        match lines.recv_timeout(wait) {
            Ok(line) => match Change::parse(&line) {
                Some(change) => change.apply(&mut live),
                None => tracing::warn!("run watchdog: ignoring the line {line:?}"),
            },
            Err(RecvTimeoutError::Timeout) => {
                let now = monotonic_ms();
                let due: Vec<i32> = live
                    .iter()
                    .filter(|(_, d)| d.is_some_and(|ms| ms <= now))
                    .map(|(&p, _)| p)
                    .collect();
                for pgid in due {
                    tracing::warn!(
                        pgid,
                        "run watchdog: the server did not renew this run's lease in time (is it stopped?); killing its process group before the lease can lapse"
                    );
                    kill_group(pgid);
                    live.remove(&pgid);
                }
            }
            // EOF: the server is gone.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if !live.is_empty() {
        tracing::warn!(
            groups = ?live.keys().collect::<Vec<_>>(),
            "run watchdog: the server is gone; killing the process groups of its running commands"
        );
    }
    for &pgid in live.keys() {
        kill_group(pgid);
    }
    ExitCode::SUCCESS
}

/// What the server reports about its command runs, for the watchdog.
/// Cheap to clone; reporting never blocks (a thread of its own talks to
/// the watchdog). [`RunWatch::none`] reports nowhere (for tests of the
/// handlers alone).
#[derive(Clone)]
pub struct RunWatch {
    inner: Option<Arc<Watched>>,
}

struct Watched {
    to_keeper: Sender<Message>,
    server_id: String,
}

enum Message {
    /// A change, and who waits until a live watchdog has it.
    Change(Change, Option<Registered>),
    /// The watchdog of this generation is gone (its stdout closed).
    Gone(u64),
}

impl RunWatch {
    /// Starts the watchdog and the thread that keeps it fed. `server_id`
    /// is what command runs get as `HERALD_SERVER_ID`. Fails when the
    /// first watchdog cannot be started.
    pub fn start(server_id: String) -> std::io::Result<RunWatch> {
        let (to_keeper, inbox) = mpsc::channel();
        let first = Watchdog::spawn(0, &Live::new(), to_keeper.clone())?;
        tracing::info!(pid = first.child.id(), "run watchdog started");
        let feedback = to_keeper.clone();
        std::thread::Builder::new()
            .name("herald-run-watch".into())
            .spawn(move || keep(first, inbox, feedback))?;
        Ok(RunWatch {
            inner: Some(Arc::new(Watched {
                to_keeper,
                server_id,
            })),
        })
    }

    /// A watch that reports nowhere.
    pub fn none() -> RunWatch {
        RunWatch { inner: None }
    }

    /// A watch whose reports the test reads and acknowledges itself, as the
    /// keeper thread would once a watchdog has them.
    #[cfg(test)]
    pub(crate) fn held(server_id: &str) -> (RunWatch, HeldReports) {
        let (to_keeper, inbox) = mpsc::channel();
        let watch = RunWatch {
            inner: Some(Arc::new(Watched {
                to_keeper,
                server_id: server_id.to_string(),
            })),
        };
        (watch, HeldReports(inbox))
    }

    /// The id runs carry as `HERALD_SERVER_ID`, if watched.
    pub fn server_id(&self) -> Option<&str> {
        self.inner.as_ref().map(|w| w.server_id.as_str())
    }

    /// Whether runs are reported to a watchdog (else they need no gate).
    pub fn is_watching(&self) -> bool {
        self.inner.is_some()
    }

    /// A command's process group `pgid` has started: reports it, and
    /// returns what resolves once a live watchdog has the group (its
    /// `+PGID` line is in the watchdog's pipe, or on the command line of a
    /// watchdog started since), from when the group is killed if the
    /// server dies. It resolves to an error if that never happens (the
    /// watch's thread is gone). Without a watchdog ([`RunWatch::none`]),
    /// `None`: nothing to wait for.
    pub fn started(&self, pgid: i32) -> Option<Registration> {
        let w = self.inner.as_ref()?;
        let (registered, ack) = tokio::sync::oneshot::channel();
        // A failed send drops `registered`: `ack` then resolves to an error.
        let _ = w
            .to_keeper
            .send(Message::Change(Change::Started(pgid), Some(registered)));
        Some(ack)
    }

    /// Process group `pgid` is to be killed at `at` unless a later
    /// deadline comes first, even if the server is stopped meanwhile.
    pub fn deadline(&self, pgid: i32, at: Instant) {
        if let Some(w) = &self.inner {
            let change = Change::Deadline(pgid, monotonic_ms_of(at));
            let _ = w.to_keeper.send(Message::Change(change, None));
        }
    }

    /// Process group `pgid` is gone (or has been sent `SIGKILL`).
    pub fn ended(&self, pgid: i32) {
        if let Some(w) = &self.inner {
            // Fails only if the keeper thread is gone, which it is not
            // while a sender exists: it has one itself.
            let _ = w.to_keeper.send(Message::Change(Change::Ended(pgid), None));
        }
    }
}

/// Told when a live watchdog has a change.
type Registered = tokio::sync::oneshot::Sender<()>;

/// Resolves once a live watchdog has a started group; see
/// [`RunWatch::started`].
pub type Registration = tokio::sync::oneshot::Receiver<()>;

/// What a [`RunWatch::held`] reported, for a test to take in order.
#[cfg(test)]
pub(crate) struct HeldReports(Receiver<Message>);

#[cfg(test)]
impl HeldReports {
    /// The next report within `wait`: `+PGID` or `-PGID`, and the
    /// acknowledgement a registration waits for.
    pub(crate) fn next(&self, wait: Duration) -> Option<(String, Option<Registered>)> {
        match self.0.recv_timeout(wait).ok()? {
            Message::Change(change, registered) => {
                Some((change.line().trim_end().to_string(), registered))
            }
            Message::Gone(_) => None,
        }
    }
}

/// One running `herald watch-runs`.
struct Watchdog {
    child: Child,
    stdin: ChildStdin,
    generation: u64,
}

impl Watchdog {
    /// Starts a watchdog and tells it about `live`. A thread waits for
    /// the end of its stdout and then sends `Gone(generation)`.
    fn spawn(generation: u64, live: &Live, feedback: Sender<Message>) -> std::io::Result<Watchdog> {
        let exe = std::env::current_exe()?;
        // The groups already live go on the command line, not down the
        // pipe: a server killed right after the exec, before it could
        // write, must still leave a watchdog that knows them.
        let known = Change::describe(live);
        // /proc/self/exe is this very binary even when a deploy has
        // replaced the file at `exe` (then `exe` ends in " (deleted)").
        let mut child = Command::new("/proc/self/exe")
            .arg0(&exe)
            .arg(SUBCOMMAND)
            .args(&known)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .or_else(|_| {
                Command::new(&exe)
                    .arg(SUBCOMMAND)
                    .args(&known)
                    .process_group(0)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
            })?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        std::thread::Builder::new()
            .name("herald-run-watch-eof".into())
            .spawn(move || {
                // The watchdog never writes: this read ends when it dies.
                let mut sink = [0u8; 64];
                while matches!(stdout.read(&mut sink), Ok(n) if n > 0) {}
                let _ = feedback.send(Message::Gone(generation));
            })?;
        Ok(Watchdog {
            child,
            stdin,
            generation,
        })
    }

    /// Ends this watchdog (if it still runs) and reaps it. Its stdin is
    /// closed last, so that it cannot kill the live groups on its way out.
    fn end(mut self) -> String {
        let _ = self.child.kill();
        let status = self.child.wait();
        drop(self.stdin);
        match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        }
    }
}

/// The keeper thread: applies each change to the live set and passes it
/// on; replaces a watchdog that died.
fn keep(first: Watchdog, inbox: Receiver<Message>, feedback: Sender<Message>) {
    let mut live = Live::new();
    let mut current = Some(first);
    let mut generation = 0;
    // Registrations made while no watchdog runs: told once one does.
    let mut waiting: Vec<Registered> = Vec::new();
    loop {
        let message = if current.is_some() {
            match inbox.recv() {
                Ok(m) => Some(m),
                // Cannot happen while this thread holds `feedback`.
                Err(_) => return,
            }
        } else {
            match inbox.recv_timeout(RESPAWN_PAUSE) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut lost: Option<String> = None;
        match message {
            Some(Message::Change(change, registered)) => {
                change.apply(&mut live);
                let written = match current.as_mut() {
                    Some(w) => match w.stdin.write_all(change.line().as_bytes()) {
                        Ok(()) => true,
                        Err(e) => {
                            lost = Some(format!("writing to it failed: {e}"));
                            false
                        }
                    },
                    None => false,
                };
                match registered {
                    // The receiver may be gone (a run given up): no matter.
                    Some(r) if written => drop(r.send(())),
                    Some(r) => waiting.push(r),
                    None => {}
                }
            }
            Some(Message::Gone(g)) if current.as_ref().is_some_and(|w| w.generation == g) => {
                lost = Some("it exited".into());
            }
            // A watchdog already replaced, or a pause before trying again.
            Some(Message::Gone(_)) | None => {}
        }
        if let Some(why) = lost {
            if let Some(w) = current.take() {
                let status = w.end();
                tracing::warn!(
                    groups = live.len(),
                    "run watchdog lost ({why}: {status}); starting another one"
                );
            }
        }
        if current.is_none() {
            generation += 1;
            match Watchdog::spawn(generation, &live, feedback.clone()) {
                Ok(w) => {
                    tracing::info!(pid = w.child.id(), groups = live.len(), "run watchdog started");
                    current = Some(w);
                    // The new watchdog has every live group on its command line.
                    for r in waiting.drain(..) {
                        let _ = r.send(());
                    }
                }
                Err(e) => tracing::error!(
                    "cannot start a run watchdog ({e}); trying again in {RESPAWN_PAUSE:?}; until then, new commands wait to start"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_strictly() {
        assert_eq!(Change::parse("+123"), Some(Change::Started(123)));
        assert_eq!(Change::parse("-123\n"), Some(Change::Ended(123)));
        assert_eq!(
            Change::parse("=123:4567"),
            Some(Change::Deadline(123, 4567))
        );
        for bad in [
            "", "+", "123", "*5", "+0", "+1", "+-5", "--5", "+x", "+5 6", "=5", "=5:", "=1:5",
            "=5:-1", "=5:x",
        ] {
            assert_eq!(Change::parse(bad), None, "{bad:?}");
        }
        let mut live = Live::new();
        for line in ["+5", "+7", "-5", "+9", "-11", "=9:100", "=5:200"] {
            Change::parse(line).unwrap().apply(&mut live);
        }
        assert_eq!(live, Live::from([(7, None), (9, Some(100))]));
        assert_eq!(Change::Started(7).line(), "+7\n");
        assert_eq!(Change::describe(&live), ["+7", "+9", "=9:100"]);
    }
}
