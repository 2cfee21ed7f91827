//! Runs left behind by a server that died together with its watchdog.
//!
//! Each server has an id, which its command runs carry as
//! `HERALD_SERVER_ID`, and holds an exclusive `flock` on
//! `RUNTIME/herald/server-ID.lock` while it lives (`RUNTIME` is
//! `$XDG_RUNTIME_DIR`; without it the directory is `/tmp/herald-UID`). The kernel
//! drops the lock when the process dies, however it dies. At start, a
//! server looks for lock files that nobody holds: their servers are dead.
//! It kills the process group of every process whose environment names one
//! of them, logs what it killed, and removes the lock file.
//!
//! Out of reach: a process that cleared its environment (`env -i`), and
//! the runs of a server whose runtime directory is another one (another
//! user, another `XDG_RUNTIME_DIR`): those are left alone on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The variable that names the server of a run.
pub const SERVER_ID_VAR: &str = "HERALD_SERVER_ID";

/// This server's claim: its id and the lock that says it is alive. The
/// lock file is removed on drop (a clean exit); after a crash the next
/// server removes it.
pub struct ServerLock {
    id: String,
    path: PathBuf,
    _lock: Flock<File>,
}

impl ServerLock {
    /// This server's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for ServerLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The directory of the lock files: `$XDG_RUNTIME_DIR/herald`, or
/// `/tmp/herald-UID`. Created (mode 0700) if missing; refused if it is not
/// a directory of ours (someone else's could hide or plant lock files).
pub fn runtime_dir(xdg_runtime_dir: Option<&str>) -> io::Result<PathBuf> {
    let dir = match xdg_runtime_dir.filter(|d| !d.is_empty()) {
        Some(d) => Path::new(d).join("herald"),
        None => PathBuf::from(format!("/tmp/herald-{}", nix::unistd::getuid())),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(io::Error::other(format!(
            "{} is not a directory owned by this user",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Takes a new id and its lock in `dir`. The lock file appears already
/// locked (locked under a temporary name, then renamed), so that another
/// server's scan never takes a starting server for a dead one.
pub fn claim(dir: &Path) -> io::Result<ServerLock> {
    let id = format!("{:016x}", rand::random::<u64>());
    let temporary = dir.join(format!(".server-{id}.tmp"));
    let file = File::create(&temporary)?;
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        let _ = std::fs::remove_file(&temporary);
        io::Error::from(e)
    })?;
    let path = dir.join(lock_name(&id));
    std::fs::rename(&temporary, &path)?;
    Ok(ServerLock {
        id,
        path,
        _lock: lock,
    })
}

fn lock_name(id: &str) -> String {
    format!("server-{id}.lock")
}

/// The id a lock file's name stands for.
fn id_of_lock(name: &str) -> Option<&str> {
    let id = name.strip_prefix("server-")?.strip_suffix(".lock")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(id)
}

/// The value of `HERALD_SERVER_ID` in a `/proc/PID/environ` (NUL-separated).
fn server_id_in(environ: &[u8]) -> Option<&str> {
    let prefix = format!("{SERVER_ID_VAR}=");
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// The process group id in a `/proc/PID/stat` line.
fn pgid_in(stat: &str) -> Option<i32> {
    // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parens.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// What [`kill_leftovers`] did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Killed {
    /// Per dead server id: the pids found, by their process group.
    pub by_server: BTreeMap<String, BTreeMap<i32, Vec<i32>>>,
    /// Lock files of dead servers removed.
    pub stale_locks: usize,
}

/// Kills the runs of every server whose lock file in `dir` nobody holds
/// (`own` is skipped), and removes those lock files.
pub fn kill_leftovers(dir: &Path, own: &str) -> io::Result<Killed> {
    let mut dead: BTreeMap<String, (PathBuf, Flock<File>)> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(id_of_lock) else {
            continue;
        };
        if id == own {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue; // Removed meanwhile by another starting server.
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                dead.insert(id.to_string(), (path, lock));
            }
            Err((_, Errno::EWOULDBLOCK)) => {} // Alive.
            Err((_, e)) => tracing::warn!(path = %path.display(), "cannot test a server lock: {e}"),
        }
    }
    let mut killed = Killed::default();
    if dead.is_empty() {
        return Ok(killed);
    }
    let own_group = nix::unistd::getpgrp().as_raw();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // Other users' processes cannot be read: not ours to kill anyway.
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let Some(id) = server_id_in(&environ).filter(|id| dead.contains_key(*id)) else {
            continue;
        };
        let Some(pgid) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(pgid_in)
        else {
            continue;
        };
        killed
            .by_server
            .entry(id.to_string())
            .or_default()
            .entry(pgid)
            .or_default()
            .push(pid);
    }
    for groups in killed.by_server.values() {
        for &pgid in groups.keys().filter(|&&g| g > 1 && g != own_group) {
            match killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => tracing::warn!(pgid, "cannot kill a leftover process group: {e}"),
            }
        }
    }
    for (path, lock) in dead.into_values() {
        // Removed while still locked, so no other scan can take it for a
        // live server's.
        if std::fs::remove_file(&path).is_ok() {
            killed.stale_locks += 1;
        }
        drop(lock);
    }
    Ok(killed)
}

/// Finds and kills leftovers at start and claims this server's lock,
/// logging what happened. Without a usable runtime directory the server
/// runs on, unprotected against that case, with a warning.
pub fn start(xdg_runtime_dir: Option<&str>) -> Option<ServerLock> {
    let dir = match runtime_dir(xdg_runtime_dir) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("no runtime directory for the server lock ({e}); the commands of a server killed together with its run watchdog will not be found at the next start");
            return None;
        }
    };
    let lock = match claim(&dir) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot take a server lock ({e}); the commands of a server killed together with its run watchdog will not be found at the next start");
            return None;
        }
    };
    match kill_leftovers(&dir, lock.id()) {
        Ok(killed) => {
            for (server, groups) in &killed.by_server {
                let pids: BTreeSet<i32> = groups.values().flatten().copied().collect();
                tracing::warn!(
                    dead_server = %server,
                    groups = ?groups.keys().collect::<Vec<_>>(),
                    ?pids,
                    "killed the command processes a dead server left running"
                );
            }
            if killed.stale_locks > 0 {
                tracing::info!(count = killed.stale_locks, dir = %dir.display(), "removed the lock files of dead servers");
            }
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot look for what dead servers left running: {e}")
        }
    }
    tracing::info!(server_id = lock.id(), "server lock taken");
    Some(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_environments_and_stat_lines_are_read() {
        assert_eq!(id_of_lock("server-00ab.lock"), Some("00ab"));
        for other in [
            "server-.lock",
            ".server-00ab.tmp",
            "server-a/b.lock",
            "x.lock",
        ] {
            assert_eq!(id_of_lock(other), None, "{other}");
        }
        assert_eq!(
            server_id_in(b"PATH=/bin\0HERALD_SERVER_ID=00ab\0HOME=/\0"),
            Some("00ab")
        );
        assert_eq!(server_id_in(b"XHERALD_SERVER_ID=1\0"), None);
        assert_eq!(pgid_in("42 (s h) (x) S 1 40 40 0 -1"), Some(40));
    }

    /// A lock nobody holds is stale and removed; a held one (this
    /// process's) is left alone.
    #[test]
    fn only_unheld_locks_are_taken_for_dead_servers() {
        let dir = tempfile::tempdir().unwrap();
        let alive = claim(dir.path()).unwrap();
        let own = claim(dir.path()).unwrap();
        std::fs::write(dir.path().join(lock_name("dead00")), "").unwrap();
        let killed = kill_leftovers(dir.path(), own.id()).unwrap();
        assert_eq!(killed.stale_locks, 1);
        assert!(killed.by_server.is_empty());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = vec![lock_name(alive.id()), lock_name(own.id())];
        expected.sort();
        assert_eq!(left, expected);
        drop(alive);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
