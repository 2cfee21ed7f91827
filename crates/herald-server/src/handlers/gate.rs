//! The gate: a command's program begins only once its run is registered
//! with the [run watchdog](super::watchdog) and its whole payload is in
//! hand.
//!
//! A watched command is not spawned directly. The server spawns
//! `herald exec-run PROGRAM ARGS…` (itself, a hidden subcommand) in the
//! run's new process group, with a pipe on its stdin; the gate blocks
//! reading that pipe. The server then registers the group with the
//! watchdog (the `+PGID` line is in the watchdog's pipe, which outlives the
//! server) and only then writes the payload, framed: its length as 8 bytes
//! (little-endian), then its bytes. The gate reads the whole frame, puts the
//! payload in an anonymous in-memory file (`memfd`) and `exec`s the program
//! with that file as stdin: same pid, same group, same environment.
//!
//! So however the server dies:
//! - before the registration, the gate reads EOF before a whole frame and
//!   exits without running anything (exit status [`NOT_STARTED`]);
//! - after it, the watchdog knows the group and kills it when the server is
//!   gone, whether or not the program has begun.
//!
//! A program therefore never runs unregistered, and never with part of its
//! payload: its stdin is a regular file holding all of it from the first
//! instruction (a program may `stat` or `mmap` it).
//!
//! Why a gate process rather than a hook between `fork` and `exec`: that
//! hook (`pre_exec`) needs `unsafe`, and cannot wait for the watchdog
//! without running code in a forked child of a multi-threaded process.
//! The price is one more `exec` per run (of this binary, already in the
//! page cache).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

use nix::sys::memfd::{memfd_create, MFdFlags};

/// The hidden subcommand that runs the gate.
pub const SUBCOMMAND: &str = "exec-run";

/// The gate's exit status when the frame never came whole (the server died
/// or gave up the run before sending it): the program was not started.
pub const NOT_STARTED: u8 = 124;

/// The gate's exit status when the program could not be `exec`ed (its
/// reason is on stderr), as a shell says for a command it cannot run.
pub const CANNOT_EXEC: u8 = 127;

/// The frame the server writes to the gate: the payload's length, then the
/// payload.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Reads one whole frame from `input`: the payload, or `None` when the
/// input ends first.
fn read_frame(mut input: impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 8];
    input.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    let mut payload = Vec::new();
    // `take` bounds the read by what the frame announced, so a lying
    // length cannot make the gate allocate it up front.
    input.take(len as u64).read_to_end(&mut payload).ok()?;
    (payload.len() == len).then_some(payload)
}

/// The payload as a file: an anonymous in-memory file holding it, its
/// offset back at the start.
pub fn payload_file(payload: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create("herald-payload", MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(payload)?;
    std::io::Seek::rewind(&mut file)?;
    Ok(OwnedFd::from(file))
}

/// For a program that embeds herald's command handlers: handled by
/// [`super::watchdog::run_if_asked`], which such a program calls first.
pub fn run_if_asked() -> Option<ExitCode> {
    let asked = std::env::args_os().nth(1).is_some_and(|a| a == SUBCOMMAND);
    asked.then(|| {
        let mut args = std::env::args_os().skip(2);
        let Some(program) = args.next() else {
            eprintln!("herald {SUBCOMMAND}: no program named");
            return ExitCode::from(CANNOT_EXEC);
        };
        exec_run(program, args.collect())
    })
}

/// `herald exec-run PROGRAM ARGS…`: waits for the frame on stdin, then
/// becomes `PROGRAM ARGS…` with the payload as stdin. Returns only when it
/// does not run the program.
fn exec_run(program: std::ffi::OsString, args: Vec<std::ffi::OsString>) -> ExitCode {
    let Some(payload) = read_frame(std::io::stdin().lock()) else {
        return ExitCode::from(NOT_STARTED);
    };
    let stdin = match payload_file(&payload) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("cannot hold the payload for {program:?}: {e}");
            return ExitCode::from(CANNOT_EXEC);
        }
    };
    drop(payload);
    // `exec` returns only on failure.
    let e = Command::new(&program)
        .args(&args)
        .stdin(Stdio::from(stdin))
        .exec();
    eprintln!("cannot start command {}: {e}", program.to_string_lossy());
    ExitCode::from(CANNOT_EXEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_read_only_whole() {
        let payload = br#"{"to":"ada@example.com"}"#;
        let whole = frame(payload);
        assert_eq!(read_frame(&whole[..]).as_deref(), Some(&payload[..]));
        assert_eq!(read_frame(&frame(b"")[..]).as_deref(), Some(&b""[..]));
        // Cut anywhere: nothing.
        for cut in 0..whole.len() {
            assert_eq!(read_frame(&whole[..cut]), None, "cut at {cut}");
        }
        // A length far past what follows: nothing, and no huge allocation.
        let mut lying = u64::MAX.to_le_bytes().to_vec();
        lying.extend_from_slice(b"abc");
        assert_eq!(read_frame(&lying[..]), None);
    }

    #[test]
    fn the_payload_file_holds_the_payload_from_its_start() {
        let fd = payload_file(b"hello").unwrap();
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
    }
}
