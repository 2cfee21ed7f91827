//! The faults, one at a time, chosen at random from the seed: each is
//! recorded with its start and end so that the invariants can tell what
//! was going on when something happened.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald::{EventId, Notification, Publish};
use herald_bench::fleet::BenchQueue;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::deployment::{STORM_TENANT, TENANT};
use crate::ledger::{cksum, Ledger};
use crate::servers::Servers;
use crate::services::{Nats, Pg};
use crate::wall;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// SIGKILL of a server at a random moment, restarted later.
    Kill,
    /// SIGKILL of a server the moment it spawns a handler's process.
    KillAtSpawn,
    /// SIGKILL of the server while a batch emit is being written.
    KillMidWrite,
    /// SIGSTOP past the lease, then SIGCONT.
    Stop,
    /// SIGKILL of nats-server, started again on the same store.
    NatsRestart,
    /// `pg_ctl -m immediate stop`, then start (crash recovery).
    PgCrash,
    /// `pg_terminate_backend` of every client connection.
    PgTerminate,
    /// A burst of pause/unpause/block/unblock on the storm tenant's handler.
    PauseStorm,
    /// Garbage bytes, a notification of a missing event and one of a real
    /// event, published onto the queue.
    ForgedNotifications,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Kill => "sigkill server",
            Kind::KillAtSpawn => "sigkill server at a handler's spawn",
            Kind::KillMidWrite => "sigkill server mid batch emit",
            Kind::Stop => "sigstop server past the lease",
            Kind::NatsRestart => "nats-server kill + restart",
            Kind::PgCrash => "postgres crash (immediate) + restart",
            Kind::PgTerminate => "pg_terminate_backend",
            Kind::PauseStorm => "pause/block storm",
            Kind::ForgedNotifications => "garbage + forged notifications",
        }
    }
}

/// One fault injected.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) kind: Kind,
    pub(crate) start: f64,
    pub(crate) end: f64,
    /// The server slot it hit, if any.
    pub(crate) slot: Option<usize>,
    /// For kills: the wall time of the SIGKILL.
    pub(crate) kill_at: Option<f64>,
    pub(crate) detail: String,
}

/// Everything the faults act on.
pub(crate) struct Chaos {
    pub(crate) servers: Servers,
    pub(crate) pg: Option<Pg>,
    pub(crate) nats: Option<Nats>,
    pub(crate) queue: Option<BenchQueue>,
    pub(crate) ledger: Arc<Mutex<Ledger>>,
    pub(crate) http: reqwest::Client,
    pub(crate) lease: f64,
    pub(crate) faults: Vec<Fault>,
    /// Payload sums of events emitted outside the producer (mid-write bursts).
    pub(crate) extra_sums: Arc<Mutex<Vec<(u64, u32)>>>,
    /// Problems of the harness's own actions (a restart that failed).
    pub(crate) trouble: Vec<String>,
    /// Whether the server restarts at once after a kill (the embedded shape).
    pub(crate) restart_at_once: bool,
    rng: StdRng,
    bursts: usize,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

impl Chaos {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        servers: Servers,
        pg: Option<Pg>,
        nats: Option<Nats>,
        queue: Option<BenchQueue>,
        ledger: Arc<Mutex<Ledger>>,
        lease: f64,
        restart_at_once: bool,
        seed: u64,
    ) -> Chaos {
        Chaos {
            servers,
            pg,
            nats,
            queue,
            ledger,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            lease,
            faults: Vec::new(),
            extra_sums: Arc::new(Mutex::new(Vec::new())),
            trouble: Vec::new(),
            restart_at_once,
            rng: StdRng::seed_from_u64(seed),
            bursts: 0,
        }
    }

    /// The kinds this deployment can suffer, with their weights.
    fn menu(&self) -> Vec<(Kind, u32)> {
        let mut m = vec![(Kind::Kill, 3), (Kind::KillAtSpawn, 3), (Kind::Stop, 2)];
        m.push((Kind::PauseStorm, 1));
        if self.pg.is_some() {
            m.push((Kind::PgCrash, 2));
            m.push((Kind::PgTerminate, 2));
        } else {
            m.push((Kind::KillMidWrite, 3));
        }
        if self.nats.is_some() {
            m.push((Kind::NatsRestart, 1));
        }
        if self.queue.is_some() {
            m.push((Kind::ForgedNotifications, 1));
        }
        m
    }

    /// Injects faults until `until` (wall time), one at a time with gaps.
    pub(crate) async fn run_until(&mut self, until: f64) {
        let menu = self.menu();
        while wall() < until {
            let kind = menu
                .choose_weighted(&mut self.rng, |(_, w)| *w)
                .expect("a fault")
                .0;
            self.inject(kind).await;
            self.servers.reap_and_restart().await;
            let gap = self.rng.gen_range(1.0..3.0);
            tokio::time::sleep(secs(gap)).await;
        }
    }

    fn up_slot(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.servers.len())
            .filter(|&s| self.servers.is_up(s))
            .collect();
        up.choose(&mut self.rng).copied()
    }

    fn record(
        &mut self,
        kind: Kind,
        start: f64,
        slot: Option<usize>,
        kill_at: Option<f64>,
        detail: String,
    ) {
        self.faults.push(Fault {
            kind,
            start,
            end: wall(),
            slot,
            kill_at,
            detail,
        });
    }

    /// Kills `slot`, waits, starts it again.
    async fn kill_and_restart(&mut self, slot: usize) -> Option<f64> {
        let at = self.servers.kill(slot).await;
        if !self.restart_at_once {
            let down = self.rng.gen_range(1.0..3.0);
            tokio::time::sleep(secs(down)).await;
        }
        self.servers.start(slot).await;
        at
    }

    pub(crate) async fn inject(&mut self, kind: Kind) {
        let start = wall();
        match kind {
            Kind::Kill => {
                let Some(slot) = self.up_slot() else { return };
                // Any phase of the heartbeat.
                let wait = self.rng.gen_range(0.0..self.lease);
                tokio::time::sleep(secs(wait)).await;
                let at = self.kill_and_restart(slot).await;
                self.record(kind, start, Some(slot), at, String::new());
            }
            Kind::KillAtSpawn => {
                let Some(slot) = self.up_slot() else { return };
                let before = self.servers.children(slot);
                let deadline = wall() + 5.0;
                let mut child = None;
                while wall() < deadline {
                    if let Some(c) = self
                        .servers
                        .children(slot)
                        .into_iter()
                        .find(|c| !before.contains(c))
                    {
                        child = Some(c);
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                let at = self.kill_and_restart(slot).await;
                let detail = match child {
                    Some(c) => format!("at the spawn of pid {c}"),
                    None => "no spawn within 5 s; killed anyway".to_string(),
                };
                self.record(kind, start, Some(slot), at, detail);
            }
            Kind::KillMidWrite => {
                let Some(slot) = self.up_slot() else { return };
                let base = self.servers.bases.read().expect("bases")[slot].clone();
                let Some(base) = base else { return };
                self.bursts += 1;
                let mut events = Vec::new();
                for i in 0..200 {
                    let payload = format!(r#"{{"burst":{},"i":{i}}}"#, self.bursts);
                    self.extra_sums
                        .lock()
                        .expect("sums")
                        .push((payload.len() as u64, cksum(payload.as_bytes())));
                    events.push(format!(
                        r#"{{"tenant":"{TENANT}","handler":"ok","payload":{payload}}}"#
                    ));
                }
                let body = format!(r#"{{"events":[{}]}}"#, events.join(","));
                let http = self.http.clone();
                let send = tokio::spawn(async move {
                    http.post(format!("{base}/v1/events/batch"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                });
                let wait = self.rng.gen_range(0.0..0.03);
                tokio::time::sleep(secs(wait)).await;
                let at = self.kill_and_restart(slot).await;
                let answer = send.await.ok().and_then(|r| r.ok());
                self.record(
                    kind,
                    start,
                    Some(slot),
                    at,
                    format!("batch of 200 answered {answer:?}"),
                );
            }
            Kind::Stop => {
                let Some(slot) = self.up_slot() else { return };
                if self.servers.stop(slot) {
                    let held = self.lease + self.rng.gen_range(0.5..self.lease);
                    tokio::time::sleep(secs(held)).await;
                    self.servers.cont(slot);
                    self.record(
                        kind,
                        start,
                        Some(slot),
                        None,
                        format!("stopped {held:.1} s"),
                    );
                }
            }
            Kind::NatsRestart => {
                let down = self.rng.gen_range(0.5..3.0);
                if let Some(n) = self.nats.as_mut() {
                    n.kill().await;
                    tokio::time::sleep(secs(down)).await;
                    if let Err(e) = n.spawn().await {
                        self.trouble.push(e);
                    }
                }
                self.record(kind, start, None, None, format!("down {down:.1} s"));
            }
            Kind::PgCrash => {
                let down = self.rng.gen_range(1.0..(2.0 * self.lease + 1.0));
                let mut detail = format!("down {down:.1} s");
                if let Some(pg) = &self.pg {
                    if let Err(e) = pg.crash().await {
                        detail.push_str(&format!("; crash: {e}"));
                    }
                    tokio::time::sleep(secs(down)).await;
                    if let Err(e) = pg.start().await {
                        self.trouble.push(format!("PostgreSQL restart: {e}"));
                    }
                }
                self.record(kind, start, None, None, detail);
            }
            Kind::PgTerminate => {
                let detail = match &self.pg {
                    Some(pg) => match pg.terminate_backends().await {
                        Ok(n) => format!("{n} backends"),
                        Err(e) => format!("failed: {e}"),
                    },
                    None => String::new(),
                };
                self.record(kind, start, None, None, detail);
            }
            Kind::PauseStorm => {
                let mut sent = 0;
                for i in 0..12 {
                    let rule = if i % 2 == 0 { "pause" } else { "block" };
                    let put = self.rng.gen_bool(0.6);
                    if self.storm_request(rule, put).await {
                        sent += 1;
                    }
                    let wait = self.rng.gen_range(0.05..0.3);
                    tokio::time::sleep(secs(wait)).await;
                }
                // Always end with nothing held, or its events would be stuck.
                for rule in ["pause", "block"] {
                    for _ in 0..100 {
                        if self.storm_request(rule, false).await {
                            break;
                        }
                        tokio::time::sleep(secs(0.3)).await;
                    }
                }
                self.record(
                    kind,
                    start,
                    None,
                    None,
                    format!("{sent} of 12 requests answered"),
                );
            }
            Kind::ForgedNotifications => {
                let mut detail = Vec::new();
                if let Some(q) = &self.queue {
                    let garbage: Vec<u8> = (0..self.rng.gen_range(1..200))
                        .map(|_| self.rng.gen())
                        .collect();
                    let raw = match q {
                        BenchQueue::Nats(n) => n.publish_raw(garbage).await,
                        BenchQueue::Pubsub(p) => p.publish_raw(garbage).await,
                    };
                    detail.push(format!(
                        "garbage: {}",
                        if raw.is_ok() { "sent" } else { "failed" }
                    ));
                    let missing: Option<EventId> = uuid::Uuid::now_v7().to_string().parse().ok();
                    let real: Option<EventId> = {
                        let l = self.ledger.lock().expect("ledger");
                        l.runs.last().and_then(|r| r.event.parse().ok())
                    };
                    for (what, id) in [("missing", missing), ("real", real)] {
                        if let Some(id) = id {
                            let sent = q
                                .queue()
                                .publish(&[Publish {
                                    notification: Notification {
                                        tenant: TENANT.to_string(),
                                        event_ids: vec![id],
                                    },
                                    delay: Duration::ZERO,
                                }])
                                .await;
                            detail.push(format!(
                                "{what} {id}: {}",
                                if sent.is_ok() { "sent" } else { "failed" }
                            ));
                        }
                    }
                }
                self.record(kind, start, None, None, detail.join("; "));
            }
        }
    }

    /// One storm request to any live server; whether it was answered 2xx.
    async fn storm_request(&mut self, rule: &str, put: bool) -> bool {
        let bases: Vec<String> = self
            .servers
            .bases
            .read()
            .expect("bases")
            .iter()
            .flatten()
            .cloned()
            .collect();
        let Some(base) = bases.choose(&mut self.rng).cloned() else {
            return false;
        };
        let url = format!("{base}/v1/tenants/{STORM_TENANT}/handlers/stormy/{rule}");
        let req = if put {
            self.http.put(url)
        } else {
            self.http.delete(url)
        };
        req.send().await.is_ok_and(|r| r.status().is_success())
    }

    /// Brings everything back up (after the last fault).
    pub(crate) async fn heal(&mut self) {
        for slot in 0..self.servers.len() {
            self.servers.cont(slot);
            self.servers.start(slot).await;
        }
        self.servers.reap_and_restart().await;
    }
}
