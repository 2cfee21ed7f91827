//! The producer: emits N events over HTTP, each with its own idempotency
//! key, to whichever server is up; retries timeouts, connection errors
//! and 5xx with the same key; records every request and every id an
//! acknowledgement (2xx) returned.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::deployment::{Mode, CRASH_MAX_ATTEMPTS, STORM_TENANT, TENANT, TOPIC};
use crate::ledger::cksum;
use crate::wall;

/// How long one emit request may take before the producer gives up on it.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the producer keeps retrying one event.
const EVENT_DEADLINE: f64 = 180.0;

/// One HTTP request.
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub(crate) slot: usize,
    pub(crate) start: f64,
    pub(crate) end: f64,
    /// `201`, `503`, `timeout`, `connect: …`.
    pub(crate) outcome: String,
}

/// One event the producer emitted (for `Fan`, one topic emit: two events).
#[derive(Clone, Debug)]
pub(crate) struct Emitted {
    pub(crate) key: String,
    pub(crate) mode: Mode,
    pub(crate) payload: String,
    pub(crate) sum: (u64, u32),
    /// Each acknowledgement's `(handler, id)` pairs.
    pub(crate) acks: Vec<Vec<(String, String)>>,
    pub(crate) attempts: Vec<Attempt>,
    /// A 4xx answer: the producer gave up on the event.
    pub(crate) refused: Option<String>,
}

/// What the producer did.
#[derive(Default)]
pub(crate) struct Produced {
    pub(crate) events: Vec<Emitted>,
}

fn pick_mode(rng: &mut StdRng) -> Mode {
    let total: u32 = Mode::MIX.iter().map(|(_, w)| w).sum();
    let mut x = rng.gen_range(0..total);
    for (m, w) in Mode::MIX {
        if x < w {
            return m;
        }
        x -= w;
    }
    Mode::Ok
}

/// The events to emit: deterministic from the seed.
pub(crate) fn plan(n: usize, seed: u64) -> Vec<Emitted> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005e_ed0f_e4e7);
    (0..n)
        .map(|i| {
            let mode = pick_mode(&mut rng);
            let key = format!("k{i}-{seed}");
            let pad: String = (0..rng.gen_range(0..1500))
                .map(|_| rng.gen_range(b'a'..=b'z') as char)
                .collect();
            let payload = format!(
                r#"{{"key":"{key}","mode":"{}","pad":"{pad}"}}"#,
                mode.name()
            );
            let sum = (payload.len() as u64, cksum(payload.as_bytes()));
            Emitted {
                key,
                mode,
                payload,
                sum,
                acks: Vec::new(),
                attempts: Vec::new(),
                refused: None,
            }
        })
        .collect()
}

fn request(e: &Emitted) -> (String, String) {
    match e.mode {
        Mode::Fan => (
            format!("/v1/tenants/{TENANT}/topics/{TOPIC}/events"),
            format!(
                r#"{{"payload":{},"idempotency_key":"{}"}}"#,
                e.payload, e.key
            ),
        ),
        m => {
            let tenant = if m == Mode::Storm {
                STORM_TENANT
            } else {
                TENANT
            };
            let max = if m == Mode::Crash {
                format!(r#","max_attempts":{CRASH_MAX_ATTEMPTS}"#)
            } else {
                String::new()
            };
            (
                "/v1/events".to_string(),
                format!(
                    r#"{{"tenant":"{tenant}","handler":"{}","payload":{},"idempotency_key":"{}"{max}}}"#,
                    m.name(),
                    e.payload,
                    e.key
                ),
            )
        }
    }
}

fn ids(mode: Mode, body: &serde_json::Value) -> Vec<(String, String)> {
    if mode == Mode::Fan {
        body["events"]
            .as_array()
            .map(|evs| {
                evs.iter()
                    .map(|e| {
                        (
                            e["handler"].as_str().unwrap_or_default().to_string(),
                            e["id"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        vec![(
            mode.name().to_string(),
            body["id"].as_str().unwrap_or_default().to_string(),
        )]
    }
}

/// Emits `plan` over `secs` seconds from `emitters` tasks; returns what happened.
pub(crate) async fn run(
    plan: Vec<Emitted>,
    secs: f64,
    emitters: usize,
    bases: Arc<RwLock<Vec<Option<String>>>>,
    seed: u64,
) -> Produced {
    let n = plan.len();
    let plan = Arc::new(Mutex::new(plan));
    let next = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(0)
        .build()
        .expect("an HTTP client");
    let start = wall();
    let mut tasks = Vec::new();
    for t in 0..emitters {
        let (plan, next, bases, http) = (plan.clone(), next.clone(), bases.clone(), http.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(t as u64 + 1));
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let due = start + secs * i as f64 / n as f64;
                let wait = due - wall();
                if wait > 0.0 {
                    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                }
                let e = plan.lock().expect("plan")[i].clone();
                let (path, body) = request(&e);
                let begun = wall();
                let mut attempts = Vec::new();
                let mut acked = Vec::new();
                let mut refused = None;
                while wall() - begun < EVENT_DEADLINE {
                    let live: Vec<(usize, String)> = bases
                        .read()
                        .expect("bases")
                        .iter()
                        .enumerate()
                        .filter_map(|(s, b)| Some((s, b.clone()?)))
                        .collect();
                    if live.is_empty() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    let (slot, base) = live[rng.gen_range(0..live.len())].clone();
                    let t0 = wall();
                    let res = http
                        .post(format!("{base}{path}"))
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    let (outcome, done) = match res {
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            if status.is_success() {
                                let v: serde_json::Value =
                                    serde_json::from_str(&text).unwrap_or_default();
                                acked.push(ids(e.mode, &v));
                                (status.as_u16().to_string(), true)
                            } else if status.is_client_error() {
                                refused = Some(format!("{status}: {text}"));
                                (status.as_u16().to_string(), true)
                            } else {
                                (status.as_u16().to_string(), false)
                            }
                        }
                        Err(err) if err.is_timeout() => ("timeout".to_string(), false),
                        Err(err) => (format!("error: {err}"), false),
                    };
                    attempts.push(Attempt {
                        slot,
                        start: t0,
                        end: wall(),
                        outcome,
                    });
                    if done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let mut plan = plan.lock().expect("plan");
                plan[i].attempts = attempts;
                plan[i].acks = acked;
                plan[i].refused = refused;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let events = std::mem::take(&mut *plan.lock().expect("plan"));
    Produced { events }
}
