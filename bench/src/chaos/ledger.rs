//! The ledger the handler script appends to, read as it grows, and the
//! liveness of every run's process: a run killed without its `E` line is
//! known by the last instant its process was seen alive.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// One run of a handler, as the ledger and `/proc` tell it.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) event: String,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) token: String,
    pub(crate) server_id: String,
    pub(crate) pid: u32,
    pub(crate) ppid: u32,
    pub(crate) handler: String,
    pub(crate) begin: f64,
    /// Length and `cksum` of what it read on stdin.
    pub(crate) read: Option<(u64, u32)>,
    /// When it ended by itself, and its exit code (or `signal`).
    pub(crate) end: Option<(f64, String)>,
    /// The last instant its process was seen alive (at least `begin`).
    pub(crate) last_alive: f64,
    /// Its process is gone (or was never seen).
    pub(crate) gone: bool,
    starttime: Option<String>,
}

impl Run {
    /// When it stopped running: its `E` line, or the last sight of its process.
    pub(crate) fn finish(&self) -> f64 {
        match &self.end {
            Some((t, _)) => *t,
            None => self.last_alive,
        }
    }
}

/// The runs so far.
pub(crate) struct Ledger {
    pub(crate) path: PathBuf,
    pub(crate) runs: Vec<Run>,
    by_run: HashMap<String, usize>,
    live: Vec<usize>,
    offset: u64,
    partial: String,
    /// Lines that could not be read (a torn or unknown line).
    pub(crate) bad_lines: Vec<String>,
}

impl Ledger {
    pub(crate) fn new(path: PathBuf) -> Ledger {
        Ledger {
            path,
            runs: Vec::new(),
            by_run: HashMap::new(),
            live: Vec::new(),
            offset: 0,
            partial: String::new(),
            bad_lines: Vec::new(),
        }
    }

    /// Reads what was appended, then looks at every live run's process.
    pub(crate) fn poll(&mut self, now: f64) {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.path) {
            if f.seek(SeekFrom::Start(self.offset)).is_ok() {
                let mut bytes = Vec::new();
                if f.read_to_end(&mut bytes).is_ok() {
                    self.offset += bytes.len() as u64;
                    text = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
        }
        if !text.is_empty() {
            let mut all = std::mem::take(&mut self.partial);
            all.push_str(&text);
            let complete = all.ends_with('\n');
            let mut lines: Vec<&str> = all.split('\n').collect();
            let rest = if complete {
                ""
            } else {
                lines.pop().unwrap_or("")
            }
            .to_string();
            for line in lines.into_iter().filter(|l| !l.is_empty()) {
                self.line(line);
            }
            self.partial = rest;
        }
        let mut still = Vec::with_capacity(self.live.len());
        for &i in &self.live {
            let run = &mut self.runs[i];
            if run.end.is_some() {
                run.gone = true;
                continue;
            }
            let stat = process_start(run.pid);
            let alive = match (&stat, &run.starttime) {
                (Some(s), None) => {
                    run.starttime = Some(s.clone());
                    true
                }
                (Some(s), Some(known)) => s == known,
                (None, _) => false,
            };
            if alive {
                run.last_alive = run.last_alive.max(now);
                still.push(i);
            } else {
                run.gone = true;
            }
        }
        self.live = still;
    }

    fn line(&mut self, line: &str) {
        let f: Vec<&str> = line.split(' ').collect();
        let ok = match f.as_slice() {
            ["B", t, event, attempt, max, token, server, pid, ppid, handler] => {
                match (
                    t.parse(),
                    attempt.parse(),
                    max.parse(),
                    pid.parse(),
                    ppid.parse(),
                ) {
                    (Ok(begin), Ok(attempt), Ok(max_attempts), Ok(pid), Ok(ppid)) => {
                        let i = self.runs.len();
                        self.runs.push(Run {
                            event: event.to_string(),
                            attempt,
                            max_attempts,
                            token: token.to_string(),
                            server_id: server.to_string(),
                            pid,
                            ppid,
                            handler: handler.to_string(),
                            begin,
                            read: None,
                            end: None,
                            last_alive: begin,
                            gone: false,
                            starttime: None,
                        });
                        self.by_run.insert(format!("{event} {token}"), i);
                        self.live.push(i);
                        true
                    }
                    _ => false,
                }
            }
            ["R", _, event, token, len, sum] => match (
                self.by_run.get(&format!("{event} {token}")),
                len.parse(),
                sum.parse(),
            ) {
                (Some(&i), Ok(len), Ok(sum)) => {
                    self.runs[i].read = Some((len, sum));
                    true
                }
                _ => false,
            },
            ["E", t, event, token, code] => match (
                self.by_run.get(&format!("{event} {token}")),
                t.parse::<f64>(),
            ) {
                (Some(&i), Ok(t)) => {
                    let run = &mut self.runs[i];
                    run.end = Some((t, code.to_string()));
                    run.last_alive = run.last_alive.max(t);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !ok {
            self.bad_lines.push(line.to_string());
        }
    }

    /// Pids of runs whose process is still alive (no `E` line).
    pub(crate) fn live_pids(&self) -> Vec<u32> {
        self.live
            .iter()
            .filter(|&&i| !self.runs[i].gone)
            .map(|&i| self.runs[i].pid)
            .collect()
    }

    /// How many runs are still going.
    pub(crate) fn live_count(&self) -> usize {
        self.live.len()
    }
}

/// The process's start time (field 22 of `/proc/PID/stat`), which tells a
/// reused pid apart; `None` when there is no such process or it is a zombie.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    // Field 22 overall is the 20th after the command's closing parenthesis.
    fields.get(19).map(|s| s.to_string())
}

/// The POSIX `cksum` CRC of `data`, as `cksum` prints it.
pub(crate) fn cksum(data: &[u8]) -> u32 {
    fn step(crc: u32, byte: u8) -> u32 {
        let mut c = crc ^ ((byte as u32) << 24);
        for _ in 0..8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04C1_1DB7
            } else {
                c << 1
            };
        }
        c
    }
    let mut crc = data.iter().fold(0u32, |c, &b| step(c, b));
    let mut len = data.len();
    while len > 0 {
        crc = step(crc, (len & 0xff) as u8);
        len >>= 8;
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn cksum_agrees_with_the_posix_tool() {
        // `printf 'hello\n' | cksum` → 3015617425 6
        assert_eq!(super::cksum(b"hello\n"), 3015617425);
        // `printf '' | cksum` → 4294967295 0
        assert_eq!(super::cksum(b""), 4294967295);
    }
}
