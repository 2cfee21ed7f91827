//! Store scenarios for claim: who gets the lease, and who is skipped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{
    block, bury, claim_one, emit_one, from_now, get, handlers, new_event, pause, settle_one,
    store_now, tenants, LEASE, PAST_SHORT, SHORT,
};
use crate::backend::{Finish, LeaseRef, Store};
use crate::model::{EventId, EventState, LeaseToken};

/// LockClaim, won: the claim writes the token and `now + lease`, increments
/// `attempt`, and returns the event as updated (as `get` then reads it).
pub async fn claim_takes_the_lease_and_increments_attempt(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let token = LeaseToken::new();
    let before = store_now(store).await;
    let got = store
        .claim(
            &crate::testkit::leases(&[id], token),
            &handlers(&["h"]),
            &tenants(&["t"]),
            LEASE,
        )
        .await
        .expect("claim");
    let after = store_now(store).await;
    assert_eq!(got.len(), 1);
    let e = &got[0];
    assert_eq!(e.id, id);
    assert_eq!(e.attempt, 1);
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.payload, r#"{"n":1}"#);
    let lease = e.lease.expect("a lease");
    assert_eq!(lease.token, token);
    assert!(lease.expires_at >= before.plus(LEASE) && lease.expires_at <= after.plus(LEASE));
    assert_eq!(e.updated_at, lease.expires_at.minus(LEASE));
    // As stored.
    assert_eq!(&get(store, id).await, e);
}

/// Each event of a claim takes the token given with it, so a token names
/// one run: in a batch (one statement for many ids) and one by one; each
/// settles with its own token only.
pub async fn each_claimed_event_takes_its_own_token(store: Arc<dyn Store>) {
    let store = store.as_ref();
    for n in [2, 9] {
        let mut leases = Vec::new();
        for _ in 0..n {
            let id = emit_one(store, new_event("t", "h")).await;
            leases.push(LeaseRef {
                id,
                token: LeaseToken::new(),
            });
        }
        let got = store
            .claim(&leases, &handlers(&["h"]), &tenants(&["t"]), LEASE)
            .await
            .expect("claim");
        assert_eq!(got.len(), n);
        for l in &leases {
            let e = got.iter().find(|e| e.id == l.id).expect("claimed");
            assert_eq!(e.lease.map(|x| x.token), Some(l.token), "batch of {n}");
            assert_eq!(get(store, l.id).await.lease.map(|x| x.token), Some(l.token));
        }
        // Another event's token fences this one out.
        let (a, b) = (leases[0], leases[1]);
        assert!(!settle_one(store, a.id, Some(b.token), Finish::Delete).await);
        assert!(settle_one(store, a.id, Some(a.token), Finish::Delete).await);
    }
}

/// EventLoad: a missing id, a dead event and a done event are not claimed.
pub async fn claim_ignores_missing_ids_and_finished_events(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert_eq!(claim_one(store, EventId::new(), LEASE).await, None);
    let done = emit_one(store, new_event("t", "h")).await;
    let token = claim_one(store, done, LEASE).await.expect("claimed");
    assert!(settle_one(store, done, Some(token), Finish::Archive).await);
    let stored = get(store, done).await;
    assert_eq!(claim_one(store, done, Duration::ZERO).await, None);
    assert_eq!(claim_one(store, done, LEASE).await, None);
    assert_eq!(get(store, done).await, stored, "unchanged");
    let dead = emit_one(store, new_event("t", "h")).await;
    bury(store, dead).await;
    let stored = get(store, dead).await;
    assert_eq!(claim_one(store, dead, LEASE).await, None);
    assert_eq!(get(store, dead).await, stored, "unchanged");
}

/// DelayCheck: an event whose `run_at` is in the future is not claimed.
pub async fn claim_skips_an_event_that_is_not_due(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("t", "h");
    e.run_at = from_now(Duration::from_secs(60));
    let id = emit_one(store, e).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 0);
    assert_eq!(e.lease, None);
}

/// PauseCheck (pause): a paused event is not claimed; another tenant's or
/// another handler's pause does not hold it.
pub async fn claim_skips_a_paused_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    assert!(store.add_rule(&pause("t", "h")).await.expect("add_rule"));
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!((e.attempt, e.lease), (0, None));
    assert!(store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert!(store.add_rule(&pause("other", "h")).await.expect("add"));
    assert!(store.add_rule(&pause("t", "other")).await.expect("add"));
    assert!(claim_one(store, id, LEASE).await.is_some());
}

/// PauseCheck in a claim of several handlers: a rule holds only the rows it
/// names, whether or not it names a handler the claim may take (a store may
/// check the rules once per claim when none does, as PostgreSQL's claim does).
pub async fn claim_checks_rules_row_by_row_across_handlers(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let free = emit_one(store, new_event("t", "h")).await;
    let held = emit_one(store, new_event("t", "h2")).await;
    let elsewhere = emit_one(store, new_event("u", "h2")).await;
    assert!(store.add_rule(&pause("t", "h2")).await.expect("add_rule"));
    assert!(store
        .add_rule(&block("t", "not-taken"))
        .await
        .expect("add_rule"));
    let mut ids = [free, held, elsewhere];
    ids.sort();
    let got: HashSet<EventId> = store
        .claim(
            &crate::testkit::leases(&ids, LeaseToken::new()),
            &handlers(&["h", "h2"]),
            &tenants(&["t", "u"]),
            LEASE,
        )
        .await
        .expect("claim")
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(got, HashSet::from([free, elsewhere]));
    assert_eq!(get(store, held).await.lease, None);
    // A claim of handlers no rule names takes its rows.
    let more = emit_one(store, new_event("t", "h")).await;
    assert!(claim_one(store, more, LEASE).await.is_some());
}

/// PauseCheck whatever the tenants hint says: the hint may spare a store
/// the per-event rule check for the tenants it names, never the rule. A
/// paused event is held, and the free one beside it taken, under a hint
/// that names its tenant, names only the other, names neither, is empty,
/// or names both among many (more than a store may take as a hint).
pub async fn claim_holds_a_paused_event_whatever_tenants_it_is_told(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store.add_rule(&pause("p", "h")).await.expect("add_rule"));
    let many: Vec<String> = (0..100).map(|i| format!("other{i}")).collect();
    let mut many: Vec<&str> = many.iter().map(String::as_str).collect();
    many.extend(["p", "t"]);
    for hint in [&["p", "t"][..], &["t"], &["p"], &["nobody"], &[], &many] {
        let held = emit_one(store, new_event("p", "h")).await;
        let free = emit_one(store, new_event("t", "h")).await;
        let mut ids = [held, free];
        ids.sort();
        let got: Vec<EventId> = store
            .claim(
                &crate::testkit::leases(&ids, LeaseToken::new()),
                &handlers(&["h"]),
                &tenants(hint),
                LEASE,
            )
            .await
            .expect("claim")
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got, vec![free], "hint {hint:?}");
        assert_eq!(get(store, held).await.lease, None, "hint {hint:?}");
    }
}

/// PauseCheck (block): a blocked event is not claimed until unblocked.
pub async fn claim_skips_a_blocked_event(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    assert!(store.add_rule(&block("t", "h")).await.expect("add_rule"));
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!((e.attempt, e.lease), (0, None));
    assert!(store.remove_rule(&block("t", "h")).await.expect("remove"));
    assert!(claim_one(store, id, LEASE).await.is_some());
}

/// LockCheck: a live lease is not taken; the holder and attempt stay.
pub async fn claim_skips_a_live_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let first = claim_one(store, id, LEASE).await.expect("claimed");
    let held = get(store, id).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let e = get(store, id).await;
    assert_eq!(e.lease.expect("a lease").token, first);
    assert_eq!(e.attempt, 1);
    assert_eq!(e, held, "unchanged");
}

/// LockCheck: an expired lease (by the store's clock) is claimed again,
/// with a new token and the next attempt.
pub async fn claim_takes_an_expired_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;
    let first = claim_one(store, id, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    let second = claim_one(store, id, LEASE).await.expect("claimed again");
    assert_ne!(first, second);
    let e = get(store, id).await;
    assert_eq!(e.lease.expect("a lease").token, second);
    assert_eq!(e.attempt, 2);
}

/// LockCheck, no attempts left: an expired lease whose attempts are used up
/// is not claimed (the worker buries it), nor is an event with
/// `max_attempts = 0`.
pub async fn claim_skips_an_event_with_no_attempts_left(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut e = new_event("t", "h");
    e.max_attempts = 1;
    let id = emit_one(store, e).await;
    claim_one(store, id, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    // Expired, but attempt 1 of 1 was used: the worker must bury it instead.
    assert_eq!(claim_one(store, id, LEASE).await, None);
    assert_eq!(get(store, id).await.attempt, 1);
    let mut zero = new_event("t", "h");
    zero.max_attempts = 0;
    let zero = emit_one(store, zero).await;
    assert_eq!(claim_one(store, zero, LEASE).await, None);
    assert_eq!(get(store, zero).await.attempt, 0);
}

/// HandlerCheck: only events of a handler in the list are claimed; an
/// empty list claims nothing.
pub async fn claim_skips_a_handler_the_worker_does_not_have(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "other")).await;
    assert_eq!(claim_one(store, id, LEASE).await, None);
    let none = store
        .claim(
            &crate::testkit::leases(&[id], LeaseToken::new()),
            &[],
            &tenants(&["t"]),
            LEASE,
        )
        .await
        .expect("claim");
    assert!(none.is_empty());
    assert_eq!(get(store, id).await.attempt, 0);
    let got = store
        .claim(
            &crate::testkit::leases(&[id], LeaseToken::new()),
            &handlers(&["h", "other"]),
            &tenants(&["t"]),
            LEASE,
        )
        .await
        .expect("claim");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
}

/// Every claim condition at once: the ids to claim (with a missing one and
/// a duplicate) and the ones that may be claimed.
async fn claim_scenario(store: &dyn Store) -> (Vec<EventId>, HashSet<EventId>) {
    let ok1 = emit_one(store, new_event("t", "h")).await;
    let ok2 = emit_one(store, new_event("t", "h")).await;
    let mut late = new_event("t", "h");
    late.run_at = from_now(Duration::from_secs(60));
    let late = emit_one(store, late).await;
    let paused = emit_one(store, new_event("p", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add_rule");
    let blocked = emit_one(store, new_event("b", "h")).await;
    store.add_rule(&block("b", "h")).await.expect("add_rule");
    let foreign = emit_one(store, new_event("t", "x")).await;
    let live = emit_one(store, new_event("t", "h")).await;
    claim_one(store, live, LEASE).await.expect("claimed");
    let expired = emit_one(store, new_event("t", "h")).await;
    claim_one(store, expired, SHORT).await.expect("claimed");
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    claim_one(store, spent, SHORT).await.expect("claimed");
    let dead = emit_one(store, new_event("t", "h")).await;
    bury(store, dead).await;
    let done = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    tokio::time::sleep(PAST_SHORT).await;
    let ids = vec![
        ok1,
        late,
        EventId::new(),
        paused,
        blocked,
        foreign,
        live,
        expired,
        spent,
        dead,
        done,
        ok2,
        ok1,
    ];
    (ids, HashSet::from([ok1, ok2, expired]))
}

/// A batch claim returns exactly the claimable events, each once (though
/// one is asked twice), under the batch's token, with their attempts.
pub async fn claim_of_a_batch_returns_only_the_claimable(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let (ids, claimable) = claim_scenario(store).await;
    let token = LeaseToken::new();
    let got = store
        .claim(
            &crate::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &tenants(&["b", "p", "t"]),
            LEASE,
        )
        .await
        .expect("claim");
    let got_ids: HashSet<EventId> = got.iter().map(|e| e.id).collect();
    assert_eq!(
        got.len(),
        claimable.len(),
        "each once, though ok1 is asked twice"
    );
    assert_eq!(got_ids, claimable);
    for e in &got {
        assert_eq!(e.lease.expect("a lease").token, token);
        assert_eq!(&get(store, e.id).await, e);
    }
    let mut attempts: Vec<u32> = got.iter().map(|e| e.attempt).collect();
    attempts.sort_unstable();
    assert_eq!(attempts, vec![1, 1, 2], "the expired one's second attempt");
}

/// Claims of one id at a time, then of two, agree with the batch.
pub async fn claims_of_one_or_a_few_ids_agree_with_the_batch(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let (ids, claimable) = claim_scenario(store).await;
    let (singles, pairs) = ids.split_at(ids.len() / 2);
    let mut got = Vec::new();
    for chunk in singles.chunks(1).chain(pairs.chunks(2)) {
        let claimed = store
            .claim(
                &crate::testkit::leases(chunk, LeaseToken::new()),
                &handlers(&["h"]),
                &tenants(&["t"]),
                LEASE,
            )
            .await
            .expect("claim");
        got.extend(claimed.into_iter().map(|e| e.id));
    }
    assert_eq!(got.len(), claimable.len(), "{got:?}");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), claimable);
}

/// LockClaim, lost: 16 tasks claim one event at once, five rounds; exactly
/// one wins each round, and the stored lease is the winner's.
pub async fn sixteen_concurrent_claims_of_one_event_have_one_winner(store: Arc<dyn Store>) {
    for round in 0..5 {
        let id = emit_one(store.as_ref(), new_event("t", "h")).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let store = store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let token = LeaseToken::new();
                    let got = store
                        .claim(
                            &crate::testkit::leases(&[id], token),
                            &handlers(&["h"]),
                            &tenants(&["t"]),
                            LEASE,
                        )
                        .await
                        .expect("claim");
                    (got.len(), token)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (n, token) = t.await.expect("task");
            assert!(n <= 1);
            if n == 1 {
                winners.push(token);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        let e = get(store.as_ref(), id).await;
        assert_eq!(e.attempt, 1, "round {round}");
        assert_eq!(e.lease.expect("a lease").token, winners[0]);
    }
}
