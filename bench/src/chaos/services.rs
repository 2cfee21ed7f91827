//! The soak's own PostgreSQL cluster (started by `bench/chaos.sh`, crashed
//! and restarted here) and its own nats-server (started and restarted
//! here). Every pid started here is appended to the pid file, which the
//! script's trap reads if this program dies first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Appends `pid` to the pid file.
pub(crate) fn note_pid(pidfile: &Path, pid: Option<u32>) {
    if let Some(pid) = pid {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(pidfile)
        {
            let _ = writeln!(f, "{pid}");
        }
    }
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`) to `pid` with kill(1).
pub(crate) fn signal(pid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The soak's PostgreSQL cluster.
pub(crate) struct Pg {
    pub(crate) bin: PathBuf,
    pub(crate) data: PathBuf,
    pub(crate) url: String,
    as_postgres: bool,
}

impl Pg {
    pub(crate) fn new(bin: PathBuf, data: PathBuf, url: String) -> Pg {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        Pg {
            bin,
            data,
            url,
            as_postgres: root,
        }
    }

    async fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let ctl = self.bin.join("pg_ctl");
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&ctl);
            c
        } else {
            Command::new(&ctl)
        };
        let out = cmd
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `pg_ctl -m immediate stop`: a crash, as far as the data knows.
    pub(crate) async fn crash(&self) -> Result<(), String> {
        self.pg_ctl(&["-m", "immediate", "stop"]).await
    }

    /// Starts it again (crash recovery) and waits until it accepts connections.
    pub(crate) async fn start(&self) -> Result<(), String> {
        let log = self
            .data
            .parent()
            .unwrap_or(&self.data)
            .join("restarts.log");
        self.pg_ctl(&["-w", "-t", "60", "-l", &log.display().to_string(), "start"])
            .await
    }

    /// `pg_terminate_backend` of every client connection (herald's).
    pub(crate) async fn terminate_backends(&self) -> Result<u64, String> {
        let out = Command::new("psql")
            .args(["-qAtX", &self.url, "-c"])
            .arg("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
            .output()
            .await
            .map_err(|e| format!("psql: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0))
    }
}

/// The soak's nats-server, with JetStream on its own store directory.
pub(crate) struct Nats {
    pub(crate) port: u16,
    dir: PathBuf,
    log: PathBuf,
    pidfile: PathBuf,
    child: Option<Child>,
}

impl Nats {
    pub(crate) async fn start(port: u16, dir: PathBuf, log: PathBuf, pidfile: PathBuf) -> Nats {
        let mut nats = Nats {
            port,
            dir,
            log,
            pidfile,
            child: None,
        };
        nats.spawn().await.expect("start nats-server");
        nats
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the process and waits until its port answers.
    pub(crate) async fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("nats-server: {e}"))?;
        note_pid(&self.pidfile, child.id());
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("nats-server on port {} did not answer", self.port))
    }

    /// SIGKILL, reaped.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}
