//! The `herald serve` processes: started, killed, stopped and continued,
//! with the history of every incarnation (which pid, when it lived, when
//! it was stopped) that the invariants judge runs against.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use herald_bench::fleet::{Worker, WorkerSpec};

use crate::services::{note_pid, signal};
use crate::wall;

/// One process of one server slot.
#[derive(Clone, Debug)]
pub(crate) struct Incarnation {
    pub(crate) slot: usize,
    pub(crate) pid: u32,
    /// When it died: SIGKILLed by the soak (`killed`) or by itself.
    pub(crate) ended: Option<f64>,
    pub(crate) killed: bool,
    /// SIGSTOP to SIGCONT.
    pub(crate) stops: Vec<(f64, f64)>,
}

impl Incarnation {
    /// Whether it was stopped at `t`; the SIGCONT's time if so.
    pub(crate) fn stopped_at(&self, t: f64) -> Option<f64> {
        self.stops
            .iter()
            .find(|(a, b)| *a <= t && t <= *b)
            .map(|(_, b)| *b)
    }
}

/// The servers.
pub(crate) struct Servers {
    specs: Vec<WorkerSpec>,
    workers: Vec<Option<Worker>>,
    current: Vec<Option<usize>>,
    pub(crate) incarnations: Vec<Incarnation>,
    /// Each slot's `http://ADDR` while it runs and is not stopped (what the
    /// producer and the storms may call).
    pub(crate) bases: Arc<RwLock<Vec<Option<String>>>>,
    /// Exits nobody asked for: slot, time, status, log tail.
    pub(crate) unexpected_exits: Vec<String>,
    pidfile: std::path::PathBuf,
}

impl Servers {
    pub(crate) fn new(specs: Vec<WorkerSpec>, pidfile: std::path::PathBuf) -> Servers {
        let n = specs.len();
        Servers {
            specs,
            workers: (0..n).map(|_| None).collect(),
            current: vec![None; n],
            incarnations: Vec::new(),
            bases: Arc::new(RwLock::new(vec![None; n])),
            unexpected_exits: Vec::new(),
            pidfile,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.specs.len()
    }

    pub(crate) fn is_up(&self, slot: usize) -> bool {
        self.workers[slot].is_some()
    }

    /// The running pid of `slot`.
    pub(crate) fn pid(&self, slot: usize) -> Option<u32> {
        self.workers[slot].as_ref().and_then(|w| w.pid())
    }

    /// Starts `slot` (if down) and waits for it to listen.
    pub(crate) async fn start(&mut self, slot: usize) {
        if self.workers[slot].is_some() {
            return;
        }
        let launch = self.specs[slot].spawn();
        let worker = launch.listening(Duration::from_secs(90)).await;
        let pid = worker.pid().unwrap_or(0);
        note_pid(&self.pidfile, Some(pid));
        self.incarnations.push(Incarnation {
            slot,
            pid,
            ended: None,
            killed: false,
            stops: Vec::new(),
        });
        self.current[slot] = Some(self.incarnations.len() - 1);
        self.bases.write().expect("bases")[slot] = Some(worker.base.clone());
        self.workers[slot] = Some(worker);
    }

    /// SIGKILL; returns the wall time just before the signal.
    pub(crate) async fn kill(&mut self, slot: usize) -> Option<f64> {
        let mut worker = self.workers[slot].take()?;
        self.bases.write().expect("bases")[slot] = None;
        let at = wall();
        worker.kill().await;
        if let Some(i) = self.current[slot].take() {
            let inc = &mut self.incarnations[i];
            inc.ended = Some(at);
            inc.killed = true;
            if let Some(last) = inc.stops.last_mut() {
                if last.1.is_infinite() {
                    last.1 = at;
                }
            }
        }
        Some(at)
    }

    /// SIGSTOP; it leaves the producer's list while stopped.
    pub(crate) fn stop(&mut self, slot: usize) -> bool {
        let Some(pid) = self.pid(slot) else {
            return false;
        };
        self.bases.write().expect("bases")[slot] = None;
        let at = wall();
        if !signal(pid, "STOP") {
            return false;
        }
        if let Some(i) = self.current[slot] {
            self.incarnations[i].stops.push((at, f64::INFINITY));
        }
        true
    }

    /// SIGCONT.
    pub(crate) fn cont(&mut self, slot: usize) {
        let Some(pid) = self.pid(slot) else {
            return;
        };
        signal(pid, "CONT");
        let at = wall();
        if let Some(i) = self.current[slot] {
            if let Some(last) = self.incarnations[i].stops.last_mut() {
                last.1 = at;
            }
        }
        let base = self.workers[slot].as_ref().map(|w| w.base.clone());
        self.bases.write().expect("bases")[slot] = base;
    }

    /// Notes servers that exited by themselves, and starts them again.
    pub(crate) async fn reap_and_restart(&mut self) {
        for slot in 0..self.len() {
            let status = self.workers[slot].as_mut().and_then(|w| w.exited());
            if let Some(status) = status {
                let at = wall();
                let worker = self.workers[slot].take().expect("it exited");
                self.bases.write().expect("bases")[slot] = None;
                if let Some(i) = self.current[slot].take() {
                    self.incarnations[i].ended = Some(at);
                }
                self.unexpected_exits.push(format!(
                    "{} exited by itself ({status}); its log ends:\n{}",
                    worker.name(),
                    worker.spec.log_tail(8)
                ));
                self.start(slot).await;
            }
        }
    }

    /// Kills every server (the end of the soak).
    pub(crate) async fn kill_all(&mut self) {
        for slot in 0..self.len() {
            self.cont(slot);
            self.kill(slot).await;
        }
    }

    /// The children of `slot`'s process now (its run watchdog, its runs).
    pub(crate) fn children(&self, slot: usize) -> Vec<u32> {
        let Some(pid) = self.pid(slot) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                    out.extend(
                        text.split_whitespace()
                            .filter_map(|p| p.parse::<u32>().ok()),
                    );
                }
            }
        }
        out
    }
}
