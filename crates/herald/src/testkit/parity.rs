//! The claim condition against the decision: a store's one-statement claim
//! must take an event exactly when [`decision::admit`] says
//! [`Verdict::Claim`] for it, since the runtime asks `admit` only after a
//! claim took nothing. Runs in the store suite ([`crate::store_suite!`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::backend::{Finish, Settle, Store};
use crate::decision::{self, Policy, Verdict};
use crate::model::{EventId, EventState, LeaseToken, Millis, NewEvent, Rule, RuleKind, RunAt};

use super::store::{LEASE, PAST_SHORT, SHORT};

/// The lease an event holds when it is claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    None,
    Live,
    Expired,
}

/// One generated event state, and the claim's handler list.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// `None`: no such event.
    state: Option<EventState>,
    /// `run_at` in the past (else an hour ahead).
    due: bool,
    held: Held,
    max_attempts: u32,
    /// One failed attempt before (released, attempt kept).
    tried: bool,
    pause: bool,
    block: bool,
    /// Whether the claim's handlers include the event's.
    handler_known: bool,
}

/// Every reachable shape: a lease only on a pending, due event with
/// attempts left; an earlier attempt only with attempts to spend on it.
fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    let states = [
        None,
        Some(EventState::Pending),
        Some(EventState::Dead),
        Some(EventState::Done),
    ];
    for state in states {
        for due in [true, false] {
            for held in [Held::None, Held::Live, Held::Expired] {
                for max_attempts in [0, 1, 3] {
                    for tried in [false, true] {
                        let claims = u32::from(tried) + u32::from(held != Held::None);
                        let reachable = match state {
                            // One shape of a missing event is enough.
                            None => due && held == Held::None && max_attempts == 3 && !tried,
                            Some(EventState::Pending) => {
                                claims <= max_attempts && (held == Held::None || due)
                            }
                            Some(_) => held == Held::None && claims <= max_attempts,
                        };
                        if !reachable {
                            continue;
                        }
                        for (pause, block) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            for handler_known in [true, false] {
                                out.push(Shape {
                                    state,
                                    due,
                                    held,
                                    max_attempts,
                                    tried,
                                    pause,
                                    block,
                                    handler_known,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Claims `ids` all at once with `lease`; each must be taken.
async fn claim_all(store: &dyn Store, ids: &[EventId], lease: Duration) -> LeaseToken {
    let token = LeaseToken::new();
    if ids.is_empty() {
        return token;
    }
    let got = store
        // No tenants hint: each row is checked against the rules on its own.
        .claim(
            &crate::testkit::leases(ids, token),
            &["h".to_string()],
            &[],
            lease,
        )
        .await
        .expect("claim");
    assert_eq!(got.len(), ids.len(), "setting up: every claim is taken");
    token
}

/// Ends runs of `ids` (fenced by `token`) with `finish`; each must hold.
async fn settle_all(store: &dyn Store, ids: &[EventId], token: Option<LeaseToken>, finish: Finish) {
    let batch: Vec<Settle> = ids
        .iter()
        .map(|&id| Settle {
            id,
            token,
            finish: finish.clone(),
        })
        .collect();
    let held = store.settle(&batch).await.expect("settle");
    assert!(
        held.held.iter().all(|&h| h),
        "setting up: every settle holds"
    );
}

/// The tenant of shape `i` in the copy `copy` of the shapes.
fn tenant(copy: &str, i: usize) -> String {
    format!("{copy}{i}")
}

/// Writes each shape as an event of its own tenant. Returns the ids, in
/// the order of `shapes`.
async fn write(store: &dyn Store, shapes: &[Shape], copy: &str) -> Vec<EventId> {
    let now = Millis::now();
    let ids: Vec<EventId> = shapes.iter().map(|_| EventId::new()).collect();
    let events: Vec<NewEvent> = shapes
        .iter()
        .enumerate()
        .filter(|(_, s)| s.state.is_some())
        .map(|(i, s)| NewEvent {
            singleton: None,
            concurrency_key: None,
            id: ids[i],
            tenant: tenant(copy, i),
            handler: "h".into(),
            payload: "{}".into(),
            // Due a second ago (a store clock a little behind the test's
            // still finds it due), or an hour ahead; a tried one gets its
            // run_at from the release.
            run_at: if s.due || s.tried {
                RunAt::At(now.minus(Duration::from_secs(1)))
            } else {
                RunAt::At(now.plus(Duration::from_secs(3600)))
            },
            max_attempts: s.max_attempts,
            idempotency_key: None,
            topic: None,
        })
        .collect();
    store.emit(&events).await.expect("emit");
    let select = |f: &dyn Fn(&Shape) -> bool| -> Vec<EventId> {
        shapes
            .iter()
            .zip(&ids)
            .filter(|(s, _)| s.state.is_some() && f(s))
            .map(|(_, &id)| id)
            .collect()
    };
    // An earlier failed attempt: claimed, then released with its error.
    for due in [true, false] {
        let tried = select(&|s| s.tried && s.due == due);
        let token = claim_all(store, &tried, LEASE).await;
        let wait = if due {
            Duration::ZERO
        } else {
            Duration::from_secs(3600)
        };
        let release = Finish::Release {
            wait,
            error: Some("e".into()),
            give_back: false,
        };
        settle_all(store, &tried, Some(token), release).await;
    }
    claim_all(store, &select(&|s| s.held == Held::Live), LEASE).await;
    claim_all(store, &select(&|s| s.held == Held::Expired), SHORT).await;
    let dead = select(&|s| s.state == Some(EventState::Dead));
    let bury = Finish::Bury { error: "e".into() };
    settle_all(store, &dead, None, bury).await;
    let done = select(&|s| s.state == Some(EventState::Done));
    settle_all(store, &done, None, Finish::Archive).await;
    for (i, s) in shapes.iter().enumerate() {
        for (on, kind) in [(s.pause, RuleKind::Pause), (s.block, RuleKind::Block)] {
            if on {
                let rule = Rule {
                    tenant: tenant(copy, i),
                    handler: "h".into(),
                    kind,
                };
                store.add_rule(&rule).await.expect("add_rule");
            }
        }
    }
    ids
}

fn handlers_for(s: &Shape) -> Vec<String> {
    vec![if s.handler_known { "h" } else { "x" }.to_string()]
}

/// Whether `admit` says Claim for each id, by what the store holds now.
async fn admissions(store: &dyn Store, shapes: &[Shape], ids: &[EventId]) -> Vec<bool> {
    let seen = store.inspect(ids).await.expect("inspect");
    let found: HashMap<EventId, _> = seen.found.iter().map(|i| (i.event.id, i)).collect();
    shapes
        .iter()
        .zip(ids)
        .map(|(s, id)| {
            let loaded = found.get(id);
            let admission = decision::admit(
                decision::Inspection {
                    waiting: None,
                    event: loaded.map(|i| &i.event),
                    rules: loaded.map(|i| i.rules).unwrap_or_default(),
                    handler_known: s.handler_known,
                    now: seen.now,
                },
                &Policy::default(),
                0.5,
            );
            admission.verdict == Verdict::Claim
        })
        .collect()
}

/// Every generated event state (state, `run_at` against now, no, a live or
/// an expired lease, attempts left or not, a pause, a block, both or none,
/// the handler known or not), written through the trait: the claim of one
/// id takes it exactly when `admit` says Claim, and so does the claim of a
/// batch (the stores run other statements for one id and for many).
pub async fn claim_takes_exactly_what_admit_would_claim(store: std::sync::Arc<dyn Store>) {
    let store = store.as_ref();
    let shapes = shapes();
    let singles = write(store, &shapes, "one").await;
    let batched = write(store, &shapes, "many").await;
    tokio::time::sleep(PAST_SHORT).await;
    let mut wrong = Vec::new();
    let mut claims = 0;
    let expected = admissions(store, &shapes, &singles).await;
    for (i, ((s, &id), &expect)) in shapes.iter().zip(&singles).zip(&expected).enumerate() {
        let got = store
            .claim(
                &crate::testkit::leases(&[id], LeaseToken::new()),
                &handlers_for(s),
                &[tenant("one", i)],
                LEASE,
            )
            .await
            .expect("claim");
        claims += usize::from(expect);
        if got.is_empty() == expect {
            wrong.push(format!(
                "one id: claimed {}, admit {expect}: {s:?}",
                !got.is_empty()
            ));
        }
    }
    let expected = admissions(store, &shapes, &batched).await;
    let mut taken = std::collections::HashSet::new();
    for known in [true, false] {
        let (ids, tenants): (Vec<EventId>, Vec<String>) = shapes
            .iter()
            .zip(&batched)
            .enumerate()
            .filter(|(_, (s, _))| s.handler_known == known)
            .map(|(i, (_, &id))| (id, tenant("many", i)))
            .unzip();
        let handlers = vec![if known { "h" } else { "x" }.to_string()];
        let got = store
            .claim(
                &crate::testkit::leases(&ids, LeaseToken::new()),
                &handlers,
                &tenants,
                LEASE,
            )
            .await
            .expect("claim");
        taken.extend(got.into_iter().map(|e| e.id));
    }
    for ((s, id), &expect) in shapes.iter().zip(&batched).zip(&expected) {
        if taken.contains(id) != expect {
            wrong.push(format!("batch: claimed {}, admit {expect}: {s:?}", !expect));
        }
    }
    assert!(
        claims > 0 && claims < shapes.len(),
        "the shapes cover both answers"
    );
    assert!(
        wrong.is_empty(),
        "{} of {} shapes disagree:\n{}",
        wrong.len(),
        2 * shapes.len(),
        wrong.join("\n")
    );
}

/// The LimitCheck row against the claim: of events that are otherwise
/// claimable, the claim takes those whose limit has room and parks the
/// others; `admit`, told what the store says of a parked one, drops it
/// as limited rather than answering a lost claim. One id at a time and
/// in a batch.
pub async fn claim_and_admit_agree_on_a_full_limit(store: std::sync::Arc<dyn Store>) {
    use crate::limit::{Limit, LimitScope};
    let store = store.as_ref();
    let per_tenant = LimitScope::Tenant { tenant: None };
    store
        .set_limit(&Limit::running("h", per_tenant, 1))
        .await
        .expect("set");
    let due = RunAt::At(Millis::now().minus(Duration::from_secs(1)));
    let event = |tenant: &str| NewEvent {
        concurrency_key: None,
        singleton: None,
        id: EventId::new(),
        tenant: tenant.into(),
        handler: "h".into(),
        payload: "{}".into(),
        run_at: due,
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
    };
    let events: Vec<NewEvent> = ["full", "full", "full", "room", "room2"]
        .iter()
        .map(|t| event(t))
        .collect();
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    store.emit(&events).await.expect("emit");
    // Tenant "full" runs one: its limit is full.
    claim_all(store, &ids[..1], LEASE).await;
    let check = |taken: &std::collections::HashSet<EventId>, how: &str| {
        let expect: std::collections::HashSet<EventId> = [ids[3], ids[4]].into();
        assert_eq!(
            *taken, expect,
            "{how}: the claim takes the events with room"
        );
    };
    let mut taken = std::collections::HashSet::new();
    for &id in &ids[1..] {
        let got = store
            .claim(
                &crate::testkit::leases(&[id], LeaseToken::new()),
                &["h".to_string()],
                &[],
                LEASE,
            )
            .await
            .expect("claim");
        taken.extend(got.into_iter().map(|e| e.id));
    }
    check(&taken, "one id at a time");
    let seen = store.inspect(&ids[1..3]).await.expect("inspect");
    for i in &seen.found {
        let admission = decision::admit(
            decision::Inspection {
                event: Some(&i.event),
                rules: i.rules,
                waiting: i.waiting.as_ref(),
                handler_known: true,
                now: seen.now,
            },
            &Policy::default(),
            0.5,
        );
        assert_eq!(
            admission.verdict,
            Verdict::Drop(decision::DropReason::Limited),
            "a parked event is dropped as limited: {:?}",
            i.event
        );
    }
    // The same in one batch, on a fresh copy.
    let again: Vec<NewEvent> = ["full2", "full2", "full2", "room3", "room4"]
        .iter()
        .map(|t| event(t))
        .collect();
    let ids: Vec<EventId> = again.iter().map(|e| e.id).collect();
    store.emit(&again).await.expect("emit");
    claim_all(store, &ids[..1], LEASE).await;
    // A token of its own per event, as a worker gives them: a token names
    // one run, and a limit's slot is the run's.
    let leases: Vec<crate::backend::LeaseRef> = ids[1..]
        .iter()
        .map(|&id| crate::backend::LeaseRef {
            id,
            token: LeaseToken::new(),
        })
        .collect();
    let got = store
        .claim(&leases, &["h".to_string()], &[], LEASE)
        .await
        .expect("claim");
    let taken: std::collections::HashSet<EventId> = got.into_iter().map(|e| e.id).collect();
    let expect: std::collections::HashSet<EventId> = [ids[3], ids[4]].into();
    assert_eq!(
        taken, expect,
        "a batch: the claim takes the events with room"
    );
}
