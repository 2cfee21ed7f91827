//! What the binary's integration tests share: a clean `herald` command and
//! a running `herald serve` that is killed on drop.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod proxy;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The SHA-256 of a token as hex, as `herald.toml` holds it. `sha256sum`
/// (coreutils) is on every machine that runs these tests.
pub fn sha256_hex(token: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(token.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// The `herald` binary, run in `dir`, inheriting no `HERALD_…` variable
/// from the test's environment.
pub fn herald(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_herald"));
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            c.env_remove(k);
        }
    }
    c
}

/// A fresh PostgreSQL schema at `url`, migrated by `herald migrate` run in
/// `dir`; dropped with the returned guard.
pub fn migrated_schema(dir: &Path, url: &str) -> herald_postgres::testing::TestSchema {
    use herald_postgres::testing::TestSchema;
    let schema = TestSchema::adopt(TestSchema::random_name());
    let migrate = herald(dir)
        .args(["migrate", "--store", url, "--schema", schema.name()])
        .output()
        .expect("run herald migrate");
    assert!(
        migrate.status.success(),
        "herald migrate: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    schema
}

/// A running `herald serve`, killed on drop.
pub struct Server {
    pub child: Child,
    /// `http://ADDR`, from its "listening on" line.
    pub base: String,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `cmd` (a `herald serve …` command) and waits for its
    /// "listening on" line.
    pub fn start(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start herald serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let Some(Ok(first)) = lines.next() else {
            let status = child.wait().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "herald serve printed nothing ({status}); stderr:\n{}",
                stderr.lock().unwrap()
            );
        };
        std::thread::spawn(move || for _ in lines {});
        let base = first
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_string();
        Server {
            child,
            base,
            stderr,
        }
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a signal (`-TERM`, `-INT`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Waits for the process to exit; kills it and panics past `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50));
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "herald serve did not exit within {limit:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
