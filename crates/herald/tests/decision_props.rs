//! Properties of the decision functions (`herald::decision`) over generated
//! events, rules, policies and run ends, and of their writes carried out on
//! a real store (SQLite):
//!
//! - a completed event is never retried;
//! - a failure never gives an attempt back;
//! - a dead (or done) event is never claimed or run;
//! - every write is fenced by the lease, and a fenced-out write changes nothing;
//! - attempts never exceed `max_attempts`.

use std::sync::Arc;
use std::time::Duration;

use herald::backend::{Finish, LeaseRef, Settle};
use herald::decision::{
    self, Admission, Answer, Claimed, Inspection, Plan, Policy, Reply, RunEnd, Tally, Verdict,
};
use herald::{
    Event, EventId, EventState, Lease, LeaseToken, Millis, NewEvent, Outcome, RetryPolicy,
    RuleMatch, RunSettled, Store,
};
use proptest::prelude::*;

const NOW: Millis = Millis(1_700_000_000_000);

fn ms(range: std::ops::Range<u64>) -> impl Strategy<Value = Duration> {
    range.prop_map(Duration::from_millis)
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        (ms(0..10_000), 1.0..4.0f64, ms(0..100_000), 0.0..=1.0f64),
        proptest::option::of(ms(0..60_000)),
        (ms(0..1_000), ms(0..2_000), ms(0..2_000)),
        any::<bool>(),
    )
        .prop_map(
            |((base, factor, max, jitter), max_queue_delay, (lost, lease_jitter, store), keep)| {
                let mut policy = Policy::default().decided(max_queue_delay, keep);
                policy.retry = RetryPolicy {
                    base,
                    factor,
                    max,
                    jitter,
                };
                policy.lost_claim_delay = lost;
                policy.lease_jitter = lease_jitter;
                policy.store_retry_delay = store;
                policy
            },
        )
}

fn state() -> impl Strategy<Value = EventState> {
    prop_oneof![
        Just(EventState::Pending),
        Just(EventState::Dead),
        Just(EventState::Done)
    ]
}

/// An event as a store might hold it: any state, due or not, attempts
/// spent or not (even past the limit, as an operator's lowered limit
/// leaves it), leased or not, the lease live or lapsed.
fn event() -> impl Strategy<Value = Event> {
    (
        state(),
        -100_000i64..100_000,
        0u32..12,
        1u32..10,
        proptest::option::of(-100_000i64..100_000),
    )
        .prop_map(|(state, due_in, attempt, max_attempts, lease)| Event {
            rate_turn: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: "acme".into(),
            handler: "h".into(),
            payload: "{}".into(),
            state,
            run_at: Millis(NOW.0 + due_in),
            attempt,
            max_attempts,
            lease: lease.map(|expires_in| Lease {
                token: LeaseToken::new(),
                expires_at: Millis(NOW.0 + expires_in),
            }),
            last_error: None,
            idempotency_key: None,
            topic: None,
            created_at: NOW,
            updated_at: NOW,
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Done),
        ("[a-z \n]{0,12}", proptest::option::of(ms(0..100_000)))
            .prop_map(|(error, after)| Outcome::Retry { error, after }),
        ms(0..100_000).prop_map(Outcome::Snooze),
        "[a-z \n]{0,12}".prop_map(Outcome::Fail),
    ]
}

fn run_end() -> impl Strategy<Value = RunEnd> {
    prop_oneof![
        4 => outcome().prop_map(RunEnd::Returned),
        1 => Just(RunEnd::Cancelled),
        1 => Just(RunEnd::LeaseLost),
    ]
}

/// A claimed run: the claim took an attempt, so `1 <= attempt <= max`.
fn claimed() -> impl Strategy<Value = Claimed> {
    (1u32..10)
        .prop_flat_map(|max| (1..=max, Just(max)))
        .prop_map(|(attempt, max_attempts)| Claimed {
            lease: LeaseRef {
                id: EventId::new(),
                token: LeaseToken::new(),
            },
            attempt,
            max_attempts,
        })
}

fn answers(plan: &Plan) -> Vec<Answer> {
    match plan {
        Plan::Answer(a) => vec![*a],
        Plan::Write(w) => vec![w.held, w.refused, w.failed],
    }
}

/// Every nack delay is within the policy's queue limit.
fn delays_capped(plan: &Plan, policy: &Policy) -> Result<(), TestCaseError> {
    for a in answers(plan) {
        if let (Reply::Nack(d), Some(max)) = (a.reply, policy.max_queue_delay()) {
            prop_assert!(d <= max, "nack {d:?} over the queue's {max:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// A dead or done event is never claimed or run: its notification is
    /// dropped and nothing is written. A pending one with no attempts left
    /// is never claimed either.
    #[test]
    fn admit_never_runs_a_finished_or_exhausted_event(
        event in event(),
        blocked in any::<bool>(),
        paused in any::<bool>(),
        handler_known in any::<bool>(),
        policy in policy(),
        jitter in 0.0..1.0f64,
    ) {
        let seen = Inspection {
            waiting: None,
            event: Some(&event),
            rules: RuleMatch { blocked, paused },
            handler_known,
            now: NOW,
        };
        let Admission { verdict, plan } = decision::admit(seen, &policy, jitter);
        delays_capped(&plan, &policy)?;
        if event.state != EventState::Pending {
            prop_assert_eq!(verdict, Verdict::Drop(decision::DropReason::Finished));
            prop_assert_eq!(plan, Plan::Answer(Answer { reply: Reply::Ack, tally: Tally::Dropped }));
            return Ok(());
        }
        if event.attempt >= event.max_attempts {
            prop_assert_ne!(verdict, Verdict::Claim, "claimable with no attempts left");
        }
        match &plan {
            // The only write before a run: a bury, fenced by the lapsed
            // lease (or by "no lease"), of an event with no attempts left.
            Plan::Write(w) => {
                prop_assert_eq!(verdict, Verdict::Bury);
                prop_assert!(event.attempt >= event.max_attempts);
                prop_assert!(event.lease.is_none_or(|l| l.expires_at <= NOW), "a live lease is buried");
                prop_assert_eq!(w.settle.id, event.id);
                prop_assert_eq!(w.settle.token, event.lease.map(|l| l.token));
                let buries = matches!(w.settle.finish, Finish::Bury { .. });
                prop_assert!(buries, "{:?}", w.settle.finish);
                prop_assert_ne!(w.refused.reply, Reply::Ack, "a refused bury is not acked as if it held");
            }
            Plan::Answer(a) => prop_assert_ne!(a.tally, Tally::Buried),
        }
    }

    /// How a run ends decides the write: done is deleted or archived and
    /// acked (never released to run again); a failure releases without
    /// giving the attempt back, or buries when it was the last; only a
    /// snooze or a shutdown gives the attempt back; a lost lease writes
    /// nothing. Every write is fenced by the run's own lease, and a
    /// refused write is left to the lease's new holder.
    #[test]
    fn settle_writes_what_the_run_earned_fenced_by_its_lease(
        run in claimed(),
        end in run_end(),
        policy in policy(),
        jitter in 0.0..1.0f64,
    ) {
        let plan = decision::settle(run, end.clone(), &policy, jitter);
        delays_capped(&plan, &policy)?;
        let w = match plan {
            Plan::Answer(a) => {
                prop_assert_eq!(end, RunEnd::LeaseLost);
                prop_assert_eq!(a, Answer { reply: Reply::Leave, tally: Tally::LeaseLost });
                return Ok(());
            }
            Plan::Write(w) => w,
        };
        prop_assert_ne!(&end, &RunEnd::LeaseLost);
        prop_assert_eq!(w.settle.id, run.lease.id);
        prop_assert_eq!(w.settle.token, Some(run.lease.token));
        prop_assert_eq!(w.refused, Answer { reply: Reply::Leave, tally: Tally::FencedOut });
        prop_assert_eq!(w.failed.tally, Tally::Nothing);
        prop_assert!(matches!(w.failed.reply, Reply::Nack(_)));
        match (&end, &w.settle.finish) {
            (RunEnd::Returned(Outcome::Done), Finish::Delete) => prop_assert!(!policy.keep_done()),
            (RunEnd::Returned(Outcome::Done), Finish::Archive) => prop_assert!(policy.keep_done()),
            (RunEnd::Returned(Outcome::Done), other) => {
                return Err(TestCaseError::fail(format!("a done run wrote {other:?}")))
            }
            (_, Finish::Delete | Finish::Archive) => {
                return Err(TestCaseError::fail(format!("{end:?} finished the event")))
            }
            (RunEnd::Returned(Outcome::Retry { .. } | Outcome::Fail(_)), Finish::Release { give_back, error, .. }) => {
                prop_assert!(!give_back, "a failure gave its attempt back");
                prop_assert!(error.is_some(), "a failure released without its error");
                prop_assert!(run.attempt < run.max_attempts, "released after the last attempt");
            }
            (RunEnd::Returned(Outcome::Snooze(_)) | RunEnd::Cancelled, Finish::Release { give_back, error, .. }) => {
                prop_assert!(give_back);
                prop_assert!(error.is_none());
            }
            (RunEnd::Returned(Outcome::Snooze(_)) | RunEnd::Cancelled, Finish::Bury { .. }) => {
                return Err(TestCaseError::fail("a snooze buried the event".to_string()))
            }
            (_, Finish::Bury { .. }) => {}
            (RunEnd::LeaseLost, _) => unreachable!("checked above"),
        }
        match w.held.tally {
            Tally::Settled(RunSettled::Done) => prop_assert_eq!(w.held.reply, Reply::Ack),
            Tally::Settled(RunSettled::Dead) => prop_assert_eq!(w.held.reply, Reply::Ack),
            Tally::Settled(_) => prop_assert!(matches!(w.held.reply, Reply::Nack(_))),
            other => return Err(TestCaseError::fail(format!("a held settle counted as {other:?}"))),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = herald_sqlite::SqliteStore::open(dir.path().join("h.db")).unwrap();
    (Arc::new(store), dir)
}

async fn emit(store: &dyn Store, max_attempts: u32) -> EventId {
    let id = EventId::new();
    store
        .emit(&[NewEvent {
            singleton: None,
            concurrency_key: None,
            id,
            tenant: "acme".into(),
            handler: "h".into(),
            payload: "{}".into(),
            run_at: herald::RunAt::NOW,
            max_attempts,
            idempotency_key: None,
            topic: None,
        }])
        .await
        .unwrap();
    id
}

async fn claim(store: &dyn Store, id: EventId, token: LeaseToken) -> Vec<Event> {
    store
        .claim(
            &[herald::backend::LeaseRef { id, token }],
            &["h".to_string()],
            &["acme".to_string()],
            Duration::from_secs(60),
        )
        .await
        .unwrap()
}

fn finish() -> impl Strategy<Value = Finish> {
    prop_oneof![
        Just(Finish::Delete),
        Just(Finish::Archive),
        (
            ms(0..10_000),
            proptest::option::of("[a-z]{0,8}"),
            any::<bool>()
        )
            .prop_map(|(wait, error, give_back)| Finish::Release {
                wait,
                error,
                give_back
            }),
        "[a-z]{0,8}".prop_map(|error| Finish::Bury { error }),
    ]
}

/// A write fenced by another token than the lease's (or by "no lease"
/// while one is held) is refused and changes nothing, on a real store.
#[test]
fn a_fenced_out_write_changes_nothing() {
    let rt = runtime();
    let (store, _dir) = open();
    let store = store.as_ref();
    let config = ProptestConfig::with_cases(64);
    proptest!(config, |(finish in finish(), no_token in any::<bool>(), max in 1u32..5)| {
        rt.block_on(async {
            let id = emit(store, max).await;
            let held = LeaseToken::new();
            prop_assert_eq!(claim(store, id, held).await.len(), 1);
            let before = store.get(id).await.unwrap();
            let history = store.history(id).await.unwrap();
            let wrong = Settle {
                id,
                token: if no_token { None } else { Some(LeaseToken::new()) },
                finish,
            };
            prop_assert_eq!(store.settle(&[wrong]).await.unwrap().held, vec![false]);
            prop_assert_eq!(store.get(id).await.unwrap(), before);
            prop_assert_eq!(store.history(id).await.unwrap(), history);
            Ok(())
        })?;
    });
}

/// The only run ends a lifecycle on one store can replay at once: every
/// wait is zero, so the event is due again straight away. A lost lease is
/// left out (the lease would hold the event for its whole length).
fn replayable_end() -> impl Strategy<Value = RunEnd> {
    prop_oneof![
        Just(RunEnd::Returned(Outcome::Done)),
        Just(RunEnd::Returned(Outcome::Retry {
            error: "boom".into(),
            after: Some(Duration::ZERO)
        })),
        Just(RunEnd::Returned(Outcome::Snooze(Duration::ZERO))),
        Just(RunEnd::Returned(Outcome::Fail("bad".into()))),
        Just(RunEnd::Cancelled),
    ]
}

/// One event's whole life on a real store, its runs ending as generated and
/// settled as [`decision::settle`] says: the attempt never passes the
/// limit, only snoozes and shutdowns give one back, and once the event is
/// done or dead no claim takes it again.
#[test]
fn an_events_life_never_passes_its_attempts_nor_runs_after_it_ends() {
    let rt = runtime();
    let (store, _dir) = open();
    let store = store.as_ref();
    let config = ProptestConfig::with_cases(64);
    proptest!(config, |(max in 1u32..5, ends in proptest::collection::vec(replayable_end(), 1..16), keep_done in any::<bool>())| {
        rt.block_on(async {
            let policy = Policy::default().decided(None, keep_done);
            let id = emit(store, max).await;
            let mut failures = 0;
            let mut ended = false;
            for end in ends {
                let token = LeaseToken::new();
                let claimed = claim(store, id, token).await;
                if ended {
                    prop_assert!(claimed.is_empty(), "a finished event was claimed again");
                    continue;
                }
                prop_assert_eq!(claimed.len(), 1, "a pending, due event with attempts left");
                let event = &claimed[0];
                prop_assert!(event.attempt <= event.max_attempts, "attempt {} of {}", event.attempt, event.max_attempts);
                prop_assert_eq!(event.attempt, failures + 1, "only failures spend attempts");
                let run = Claimed {
                    lease: LeaseRef { id, token },
                    attempt: event.attempt,
                    max_attempts: event.max_attempts,
                };
                let Plan::Write(w) = decision::settle(run, end.clone(), &policy, 0.5) else {
                    return Err(TestCaseError::fail("a replayable end wrote nothing"));
                };
                prop_assert_eq!(store.settle(std::slice::from_ref(&w.settle)).await.unwrap().held, vec![true]);
                let after = store.get(id).await.unwrap();
                match w.held.tally {
                    Tally::Settled(RunSettled::Done) => {
                        prop_assert_eq!(after.map(|e| e.state), keep_done.then_some(EventState::Done));
                        ended = true;
                    }
                    Tally::Settled(RunSettled::Dead) => {
                        prop_assert_eq!(after.map(|e| e.state), Some(EventState::Dead));
                        ended = true;
                    }
                    Tally::Settled(RunSettled::Retried) => {
                        failures += 1;
                        let after = after.unwrap();
                        prop_assert_eq!(after.state, EventState::Pending);
                        prop_assert!(after.attempt < after.max_attempts);
                    }
                    Tally::Settled(RunSettled::Snoozed | RunSettled::Cancelled) => {
                        prop_assert_eq!(after.unwrap().attempt, failures, "the attempt was given back");
                    }
                    other => return Err(TestCaseError::fail(format!("held as {other:?}"))),
                }
                prop_assert!(failures < max || ended, "{} failures of {} and still pending", failures, max);
            }
            Ok(())
        })?;
    });
}

/// Found by the properties: the store-failure and lost-claim nacks were
/// not held to the queue's delay limit, as every other nack is.
#[test]
fn a_queue_limit_below_the_fixed_delays_caps_every_nack() {
    let policy = Policy::default().decided(Some(Duration::ZERO), false);
    assert_eq!(
        decision::store_failed(&policy).reply,
        Reply::Nack(Duration::ZERO)
    );
    let run = Claimed {
        lease: LeaseRef {
            id: EventId::new(),
            token: LeaseToken::new(),
        },
        attempt: 1,
        max_attempts: 3,
    };
    let Plan::Write(w) = decision::settle(run, RunEnd::Returned(Outcome::Done), &policy, 0.5)
    else {
        panic!("a done run writes");
    };
    assert_eq!(w.failed.reply, Reply::Nack(Duration::ZERO));
    let mut event = Event {
        rate_turn: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: "acme".into(),
        handler: "h".into(),
        payload: "{}".into(),
        state: EventState::Pending,
        run_at: NOW,
        attempt: 0,
        max_attempts: 3,
        lease: None,
        last_error: None,
        idempotency_key: None,
        topic: None,
        created_at: NOW,
        updated_at: NOW,
    };
    fn seen(event: &Event) -> Inspection<'_> {
        Inspection {
            waiting: None,
            event: Some(event),
            rules: RuleMatch::default(),
            handler_known: true,
            now: NOW,
        }
    }
    let lost = decision::admit(seen(&event), &policy, 0.5);
    assert_eq!(lost.verdict, Verdict::Claim);
    assert_eq!(answers(&lost.plan)[0].reply, Reply::Nack(Duration::ZERO));
    event.attempt = 3;
    let bury = decision::admit(seen(&event), &policy, 0.5);
    for a in answers(&bury.plan) {
        assert_ne!(a.reply, Reply::Nack(policy.lost_claim_delay), "{a:?}");
    }
}
