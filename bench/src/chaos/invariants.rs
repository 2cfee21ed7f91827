//! The invariants, judged from the ledger, the servers' history, the
//! faults, the producer's record and the store's final state. Each
//! returns how many things it checked and one line of evidence per failure.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::deployment::Mode;
use crate::faults::{Fault, Kind};
use crate::ledger::Run;
use crate::producer::{Emitted, REQUEST_TIMEOUT};
use crate::servers::Incarnation;

/// An event as the store has it at the end (pending or dead; done events
/// are deleted).
#[derive(Clone, Debug)]
pub(crate) struct FinalEvent {
    pub(crate) id: String,
    pub(crate) handler: String,
    pub(crate) state: String,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
}

/// How soon after a kill its server's runs start again elsewhere: the
/// lease lapses (`lease`), the reconciler's next pass re-notifies the
/// event (passes start `lease / 3` apart), then one second for the pass
/// itself, the publish, the delivery, the claim and the gate
/// (docs/guarantees.md, "Rescue after a dead worker").
pub(crate) fn rescue_bound(lease: f64) -> f64 {
    lease + lease / 3.0 + 1.0
}

/// One invariant's verdict.
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) checked: usize,
    pub(crate) failures: Vec<String>,
}

/// Everything the invariants look at.
pub(crate) struct Evidence<'a> {
    pub(crate) runs: &'a [Run],
    pub(crate) incarnations: &'a [Incarnation],
    pub(crate) faults: &'a [Fault],
    pub(crate) produced: &'a [Emitted],
    pub(crate) extra_sums: &'a [(u64, u32)],
    pub(crate) final_events: &'a [FinalEvent],
    pub(crate) lease: f64,
    pub(crate) unexpected_exits: &'a [String],
    pub(crate) integrity: Option<String>,
    pub(crate) leftover_pids: &'a [u32],
}

fn t(x: f64) -> String {
    format!("{x:.3}")
}

impl Evidence<'_> {
    /// The incarnation that ran `run`: its parent, or the server id that
    /// another run of a known parent carried.
    fn incarnation_of(&self, run: &Run, by_server_id: &HashMap<&str, usize>) -> Option<usize> {
        self.incarnations
            .iter()
            .rposition(|i| i.pid == run.ppid)
            .or_else(|| by_server_id.get(run.server_id.as_str()).copied())
    }

    fn server_ids(&self) -> HashMap<&str, usize> {
        let mut m = HashMap::new();
        for r in self.runs {
            if let Some(i) = self.incarnations.iter().rposition(|i| i.pid == r.ppid) {
                m.insert(r.server_id.as_str(), i);
            }
        }
        m
    }

    fn fault_near(&self, from: f64, to: f64, except: usize) -> Option<&Fault> {
        self.faults
            .iter()
            .enumerate()
            .find(|(i, f)| *i != except && f.start <= to && f.end >= from)
            .map(|(_, f)| f)
    }

    /// Every check, in report order.
    pub(crate) fn check_all(&self) -> Vec<Check> {
        let mut out = vec![
            self.acknowledged_finished(),
            self.nothing_stuck(),
            self.no_overlapping_runs(),
            self.runs_end_with_their_server(),
            self.payload_intact(),
            self.attempts_bounded(),
            self.one_event_per_key(),
            self.emits_answer(),
            self.servers_stay_up(),
        ];
        if let Some(result) = &self.integrity {
            out.push(Check {
                name: "sqlite integrity_check ok",
                checked: 1,
                failures: if result.trim() == "ok" {
                    Vec::new()
                } else {
                    vec![result.clone()]
                },
            });
        }
        out
    }

    /// Every acknowledged event finished as its handler ends: done (a run
    /// exited 0 and the store deleted it) or dead.
    fn acknowledged_finished(&self) -> Check {
        let finals: HashMap<&str, &FinalEvent> = self
            .final_events
            .iter()
            .map(|e| (e.id.as_str(), e))
            .collect();
        let succeeded: HashSet<&str> = self
            .runs
            .iter()
            .filter(|r| r.end.as_ref().is_some_and(|(_, c)| c == "0"))
            .map(|r| r.event.as_str())
            .collect();
        let mut runs_of: HashMap<&str, Vec<&Run>> = HashMap::new();
        for r in self.runs {
            runs_of.entry(r.event.as_str()).or_default().push(r);
        }
        // Dead because faults used up its attempts: every run of it was
        // killed, failed by design, or succeeded with its result lost (the
        // event is not done: refused after its lease lapsed while the
        // store was away, or its server died before the settle), and some
        // were killed. Attempts count claims; a claim that never started
        // is not in the ledger at all.
        let killed_out = |id: &str, mode: Mode| {
            let runs = runs_of.get(id).map(Vec::as_slice).unwrap_or_default();
            runs.iter().any(|r| r.end.is_none())
                && runs.iter().all(|r| {
                    r.end.is_none()
                        || r.attempt <= mode.designed_failures()
                        || r.end.as_ref().is_some_and(|(_, c)| c == "0")
                })
        };
        let mut checked = 0;
        let mut failures = Vec::new();
        for e in self.produced {
            let ids: HashSet<(&str, &str)> = e
                .acks
                .iter()
                .flatten()
                .map(|(h, id)| (h.as_str(), id.as_str()))
                .collect();
            for (handler, id) in ids {
                checked += 1;
                let dead = e.mode.ends_dead();
                match finals.get(id) {
                    Some(f) if f.state == "dead" && dead => {}
                    Some(f) if f.state == "dead" && killed_out(id, e.mode) => {}
                    Some(f) if f.state == "dead" => failures.push(format!(
                        "{id} ({handler}, key {}) is dead, expected done (attempt {}/{})",
                        e.key, f.attempt, f.max_attempts
                    )),
                    Some(f) => failures.push(format!(
                        "{id} ({handler}, key {}) is still {} (attempt {}/{})",
                        e.key, f.state, f.attempt, f.max_attempts
                    )),
                    None if !dead && succeeded.contains(id) => {}
                    None if dead => failures.push(format!(
                        "{id} ({handler}, key {}) is gone from the store, expected dead",
                        e.key
                    )),
                    None => failures.push(format!(
                        "{id} ({handler}, key {}) is gone from the store without a run that exited 0 (lost)",
                        e.key
                    )),
                }
            }
        }
        Check {
            name: "acknowledged events finished",
            checked,
            failures,
        }
    }

    /// No event is left pending once the soak is quiet.
    fn nothing_stuck(&self) -> Check {
        let failures = self
            .final_events
            .iter()
            .filter(|e| e.state == "pending")
            .map(|e| {
                format!(
                    "{} ({}) pending at the end, attempt {}/{}",
                    e.id, e.handler, e.attempt, e.max_attempts
                )
            })
            .collect();
        Check {
            name: "nothing left pending",
            checked: self.final_events.len(),
            failures,
        }
    }

    /// Two runs of one event never run at once, unless the earlier one's
    /// server was stopped (SIGSTOP: it cannot act) and the run ended soon
    /// after SIGCONT.
    fn no_overlapping_runs(&self) -> Check {
        let ids = self.server_ids();
        let mut by_event: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
        for r in self.runs {
            by_event.entry(r.event.as_str()).or_default().push(r);
        }
        let mut checked = 0;
        let mut failures = Vec::new();
        for (event, mut runs) in by_event {
            runs.sort_by(|a, b| a.begin.total_cmp(&b.begin));
            for (j, b) in runs.iter().enumerate().skip(1) {
                checked += 1;
                for a in &runs[..j] {
                    if a.finish() <= b.begin {
                        continue;
                    }
                    let inc = self.incarnation_of(a, &ids).map(|i| &self.incarnations[i]);
                    let why = match inc {
                        Some(i) if i.ended.is_some_and(|e| e <= b.begin) => format!(
                            "its server (pid {}) was {} at {} and the run outlived it",
                            i.pid,
                            if i.killed { "SIGKILLed" } else { "dead" },
                            t(i.ended.unwrap_or_default())
                        ),
                        // A stopped server's watchdog kills its commands
                        // at their lease deadline: no overlap is allowed.
                        Some(i) => match i.stopped_at(b.begin) {
                            Some(cont) => format!(
                                "its server (pid {}) was SIGSTOPped and its run watchdog did not end the run by its lease deadline (it ended {:.3} s after SIGCONT)",
                                i.pid,
                                a.finish() - cont
                            ),
                            None => format!(
                                "its server (pid {}) was alive: the run outlived its lease{}",
                                i.pid,
                                self.fault_near(b.begin - 3.0 * self.lease, b.begin, usize::MAX)
                                    .map(|f| format!(" (fault before: {} at {})", f.kind.name(), t(f.start)))
                                    .unwrap_or_default()
                            ),
                        },
                        None => "its server is unknown".to_string(),
                    };
                    failures.push(format!(
                        "event {event} ({}): attempt {} (pid {}, token {}, {}–{}{}) still ran when attempt {} (pid {}) began at {}: {why}",
                        a.handler,
                        a.attempt,
                        a.pid,
                        a.token,
                        t(a.begin),
                        t(a.finish()),
                        if a.end.is_some() { "" } else { ", killed" },
                        b.attempt,
                        b.pid,
                        t(b.begin)
                    ));
                }
            }
        }
        Check {
            name: "no overlapping runs of one event",
            checked,
            failures,
        }
    }

    /// A run's process dies with its server: within 1 s of a SIGKILL, and
    /// none is left at the end.
    fn runs_end_with_their_server(&self) -> Check {
        let ids = self.server_ids();
        let mut checked = 0;
        let mut failures = Vec::new();
        for r in self.runs {
            let Some(i) = self.incarnation_of(r, &ids) else {
                continue;
            };
            let inc = &self.incarnations[i];
            let Some(died) = inc.ended.filter(|_| inc.killed) else {
                continue;
            };
            if r.finish() < died {
                continue;
            }
            checked += 1;
            if r.end.is_some() && r.finish() > died + 1.0
                || r.end.is_none() && r.last_alive > died + 1.0
            {
                failures.push(format!(
                    "event {} ({}) attempt {} pid {} began at {} ({:+.3} s from the SIGKILL of its server pid {} at {}) and ran until {}{}",
                    r.event,
                    r.handler,
                    r.attempt,
                    r.pid,
                    t(r.begin),
                    r.begin - died,
                    inc.pid,
                    t(died),
                    t(r.finish()),
                    match r.read {
                        Some((len, _)) => format!(", read {len} bytes of stdin"),
                        None => String::new(),
                    }
                ));
            }
        }
        for pid in self.leftover_pids {
            failures.push(format!(
                "run pid {pid} still alive after every server was killed"
            ));
        }
        Check {
            name: "runs end with their server",
            checked,
            failures,
        }
    }

    /// Every run read the payload that was emitted.
    fn payload_intact(&self) -> Check {
        let by_id: HashMap<&str, (u64, u32)> = self
            .produced
            .iter()
            .flat_map(|e| {
                e.acks
                    .iter()
                    .flatten()
                    .map(move |(_, id)| (id.as_str(), e.sum))
            })
            .collect();
        let known: HashSet<(u64, u32)> = self
            .produced
            .iter()
            .map(|e| e.sum)
            .chain(self.extra_sums.iter().copied())
            .collect();
        let mut sched: HashMap<(u64, u32), usize> = HashMap::new();
        let mut checked = 0;
        let mut failures = Vec::new();
        for r in self.runs {
            let Some(got) = r.read else { continue };
            checked += 1;
            if r.handler == "sched" {
                *sched.entry(got).or_default() += 1;
                continue;
            }
            let ok = match by_id.get(r.event.as_str()) {
                Some(want) => *want == got,
                None => known.contains(&got),
            };
            if !ok {
                failures.push(format!(
                    "event {} ({}) attempt {} pid {} read {} bytes (cksum {}){}",
                    r.event,
                    r.handler,
                    r.attempt,
                    r.pid,
                    got.0,
                    got.1,
                    match by_id.get(r.event.as_str()) {
                        Some(w) => format!(", emitted {} bytes (cksum {})", w.0, w.1),
                        None => ", not a payload the producer sent".to_string(),
                    }
                ));
            }
        }
        // The schedule's runs all read its one payload.
        if sched.len() > 1 || sched.keys().any(|(len, _)| *len == 0) {
            failures.push(format!(
                "the schedule's runs read different payloads: {sched:?}"
            ));
        }
        Check {
            name: "every run read its payload",
            checked,
            failures,
        }
    }

    /// No run's attempt, and no stored attempt count, exceeds max_attempts.
    fn attempts_bounded(&self) -> Check {
        let mut failures: Vec<String> = self
            .runs
            .iter()
            .filter(|r| r.attempt > r.max_attempts || r.attempt == 0)
            .map(|r| {
                format!(
                    "event {} ({}) ran attempt {} of {}",
                    r.event, r.handler, r.attempt, r.max_attempts
                )
            })
            .collect();
        failures.extend(
            self.final_events
                .iter()
                .filter(|e| e.attempt > e.max_attempts)
                .map(|e| {
                    format!(
                        "event {} stored attempt {} of {}",
                        e.id, e.attempt, e.max_attempts
                    )
                }),
        );
        Check {
            name: "attempts <= max_attempts",
            checked: self.runs.len() + self.final_events.len(),
            failures,
        }
    }

    /// One event per idempotency key and handler: over every
    /// acknowledgement and every run that read the key's payload.
    fn one_event_per_key(&self) -> Check {
        let by_sum: HashMap<(u64, u32), usize> = self
            .produced
            .iter()
            .enumerate()
            .map(|(i, e)| (e.sum, i))
            .collect();
        let mut ids: Vec<BTreeMap<String, HashSet<String>>> =
            vec![BTreeMap::new(); self.produced.len()];
        for (i, e) in self.produced.iter().enumerate() {
            for (h, id) in e.acks.iter().flatten() {
                ids[i].entry(h.clone()).or_default().insert(id.clone());
            }
        }
        for r in self.runs {
            if let Some(&i) = r.read.as_ref().and_then(|s| by_sum.get(s)) {
                ids[i]
                    .entry(r.handler.clone())
                    .or_default()
                    .insert(r.event.clone());
            }
        }
        let mut failures = Vec::new();
        for (i, per) in ids.iter().enumerate() {
            for (h, set) in per {
                if set.len() > 1 {
                    let e = &self.produced[i];
                    failures.push(format!(
                        "key {} ({h}) has {} events {:?}; its requests: {}",
                        e.key,
                        set.len(),
                        set,
                        e.attempts
                            .iter()
                            .map(|a| format!("{}@{}", a.outcome, t(a.start)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        Check {
            name: "one event per idempotency key",
            checked: self.produced.iter().filter(|e| !e.acks.is_empty()).count(),
            failures,
        }
    }

    /// After each SIGKILL, the killed server's runs start again within
    /// [`rescue_bound`]: kills with no other fault until the next run
    /// began; the storm tenant's events, which the storms may hold, left
    /// out.
    pub(crate) fn rescues(&self) -> (Vec<f64>, Vec<String>) {
        let bound = rescue_bound(self.lease);
        let ids = self.server_ids();
        let mut times = Vec::new();
        let mut over = Vec::new();
        for (fi, f) in self.faults.iter().enumerate() {
            let Some(k) = f.kill_at else { continue };
            let Some(slot) = f.slot else { continue };
            for r in self.runs {
                let Some(i) = self.incarnation_of(r, &ids) else {
                    continue;
                };
                let inc = &self.incarnations[i];
                if inc.slot != slot || inc.ended != Some(k) || r.begin > k {
                    continue;
                }
                if r.end.as_ref().is_some_and(|(e, _)| *e <= k) || r.handler == "stormy" {
                    continue;
                }
                if r.attempt >= r.max_attempts {
                    continue; // buried, not run again
                }
                let next = self
                    .runs
                    .iter()
                    .filter(|n| n.event == r.event && n.begin > k)
                    .map(|n| n.begin)
                    .min_by(f64::total_cmp);
                if let Some(n) = next {
                    // Any other fault before the next run began leaves the
                    // kill out: the store or the broker away delays every
                    // rescue, and a server killed or stopped may be the
                    // one that had claimed the rescued event (a run killed
                    // behind its gate leaves no ledger line, so the next
                    // run seen can be a later rescue's).
                    let until = n.max(k + bound);
                    let disturbed = self.faults.iter().enumerate().any(|(i, g)| {
                        i != fi
                            && !matches!(g.kind, Kind::PauseStorm | Kind::ForgedNotifications)
                            && g.start <= until
                            && g.end >= k - 0.5
                    });
                    if disturbed {
                        continue;
                    }
                    let rescue = n - k;
                    times.push(rescue);
                    if rescue > bound {
                        over.push(format!(
                            "event {} ({}) attempt {} on server pid {} killed at {} ({}): next run after {:.3} s > {:.3} s",
                            r.event, r.handler, r.attempt, inc.pid, t(k), f.kind.name(), rescue, bound
                        ));
                    }
                }
            }
        }
        (times, over)
    }

    /// Every emit request is answered within the producer's timeout, unless
    /// its server was stopped or killed meanwhile.
    fn emits_answer(&self) -> Check {
        let mut checked = 0;
        let mut failures = Vec::new();
        for e in self.produced {
            for a in &e.attempts {
                checked += 1;
                if a.outcome != "timeout" {
                    continue;
                }
                let excused = self.incarnations.iter().any(|i| {
                    i.slot == a.slot
                        && (i.ended.is_some_and(|x| x >= a.start - 0.5 && x <= a.end)
                            || i.stops.iter().any(|(s, c)| *s <= a.end && *c >= a.start))
                });
                if !excused {
                    failures.push(format!(
                        "emit of key {} to server slot {} at {} got no answer in {:?}{}",
                        e.key,
                        a.slot,
                        t(a.start),
                        REQUEST_TIMEOUT,
                        self.fault_near(a.start - 1.0, a.end, usize::MAX)
                            .map(|f| format!(
                                " (during: {} {}–{})",
                                f.kind.name(),
                                t(f.start),
                                t(f.end)
                            ))
                            .unwrap_or_default()
                    ));
                }
            }
            if let Some(r) = &e.refused {
                failures.push(format!("emit of key {} refused: {r}", e.key));
            }
        }
        Check {
            name: "emits answered (no hang)",
            checked,
            failures,
        }
    }

    fn servers_stay_up(&self) -> Check {
        Check {
            name: "servers exit only when killed",
            checked: self.incarnations.len(),
            failures: self.unexpected_exits.to_vec(),
        }
    }
}
