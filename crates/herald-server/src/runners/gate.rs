//! The gate: a command's program begins only once its run is registered
//! with the [run watchdog](super::watchdog), and with its whole payload.
//!
//! The payload goes into an anonymous in-memory file (`memfd`) before
//! anything is spawned, and that file is the program's stdin: the program
//! has all of it from its first instruction.
//!
//! A watched run does not spawn its program directly. It spawns `/bin/sh`
//! in the run's new process group with [`SCRIPT`]: the shell waits for one
//! line on its fd 1, the read end of a pipe whose write end only the server
//! holds, then `exec`s the program (same pid, same group, same
//! environment, stdout back to `/dev/null`). The server registers the group
//! with the watchdog first (the `+PGID` line is in the watchdog's pipe,
//! which outlives the server) and only then writes the line. So however the
//! server dies:
//! - before the registration, the shell reads EOF and exits
//!   [`NOT_STARTED`] without running anything;
//! - after it, the watchdog knows the group and kills it when the server is
//!   gone, whether or not the program has begun.
//!
//! Why a shell rather than a hook between `fork` and `exec`: that hook
//! (`pre_exec`) needs `unsafe`, and cannot wait for the watchdog without
//! running code in a forked child of a multi-threaded process. Why a shell
//! rather than herald itself: `dash` starts in a fraction of the time a
//! large Rust binary takes to load and relocate, and the gate runs once per
//! run (`docs/handlers.md` gives the cost).

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::unistd::pipe2;

/// The shell that runs the gate.
pub const SHELL: &str = "/bin/sh";

/// The gate's script: `sh -c SCRIPT PROGRAM ARGS…`. Waits for the line on
/// fd 1, then becomes the program with stdout on `/dev/null`.
pub const SCRIPT: &str = r#"read -r go <&1 || exit 124; exec "$0" "$@" >/dev/null"#;

/// The gate's exit status when its line never came (the server died or
/// gave up the run first): the program was not started.
pub const NOT_STARTED: i32 = 124;

/// The payload as a file: an anonymous in-memory file holding it, its
/// offset back at the start.
pub fn payload_file(payload: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create("herald-payload", MFdFlags::MFD_CLOEXEC)?;
    let mut file = File::from(fd);
    file.write_all(payload)?;
    std::io::Seek::rewind(&mut file)?;
    Ok(OwnedFd::from(file))
}

/// The gate's command: `sh -c SCRIPT PROGRAM ARGS…`, with `waits_on` (a
/// [`Latch`]'s read end) as its stdout.
pub fn command(program: &Path, args: &[String], waits_on: OwnedFd) -> tokio::process::Command {
    let mut gate = tokio::process::Command::new(SHELL);
    gate.arg("-c")
        .arg(SCRIPT)
        .arg(program)
        .args(args)
        .stdout(std::process::Stdio::from(waits_on));
    gate
}

/// The server's end of the pipe a gate waits on. Both ends are
/// close-on-exec, so no other child inherits this one (which would keep a
/// gate from ever seeing EOF).
pub struct Latch {
    write: File,
}

impl Latch {
    /// A new pipe: the latch, and the read end for the gate.
    pub fn new() -> std::io::Result<(Latch, OwnedFd)> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        Ok((
            Latch {
                write: File::from(write),
            },
            read,
        ))
    }

    /// Lets the gate start its program. A few bytes into a new pipe: never
    /// blocks. An error means the gate is gone (then its exit says so).
    pub fn open(mut self) -> std::io::Result<()> {
        self.write.write_all(b"go\n")
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::process::Stdio;

    use super::*;

    #[test]
    fn the_payload_file_holds_the_payload_from_its_start() {
        let fd = payload_file(b"hello").unwrap();
        let mut text = String::new();
        File::from(fd).read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
    }

    #[tokio::test]
    async fn a_gate_never_opened_runs_nothing() {
        // The server dies (here: drops the latch) before the watchdog has
        // the group: the gate reads EOF and never starts the program.
        let dir = tempfile::tempdir().unwrap();
        let (latch, read) = Latch::new().unwrap();
        let mut gate = command(
            Path::new("/bin/sh"),
            &["-c".into(), format!("touch {}/began", dir.path().display())],
            read,
        )
        .spawn()
        .unwrap();
        drop(latch);
        let status = gate.wait().await.unwrap();
        assert_eq!(status.code(), Some(NOT_STARTED));
        assert!(!dir.path().join("began").exists());
    }

    #[tokio::test]
    async fn an_opened_gate_becomes_the_program_with_its_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let (latch, read) = Latch::new().unwrap();
        let mut gate = command(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                r#"echo "$$ $1 $2" > "$0/ran"; echo to-stdout"#.into(),
                dir.path().display().to_string(),
                "two words".into(),
                "-x".into(),
            ],
            read,
        )
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
        let pid = gate.id().unwrap();
        latch.open().unwrap();
        assert!(gate.wait().await.unwrap().success());
        let text = std::fs::read_to_string(dir.path().join("ran")).unwrap();
        assert_eq!(
            text,
            format!("{pid} two words -x\n"),
            "same pid, arguments kept"
        );
    }
}
