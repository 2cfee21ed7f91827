//! Store scenarios for settle and renew: how a run ends, and the lease fence on both.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{
    bury, claim_one, emit_all, emit_one, every_finish, get, handlers, new_event, old_event,
    release, settle_one, store_now, sweep_once, tenants, LEASE, PAST_SHORT, QUIET, SHORT,
};
use crate::backend::{Finish, LeaseRef, Settle, Store};
use crate::model::{EventId, EventState, LeaseToken};

/// Settle reports per item, in order: Delete removes the event, Archive
/// keeps it `done`, Bury moves it to `dead` with the error; an unknown id
/// reports false; a finished event has no run to end.
pub async fn settle_delete_archive_and_bury(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let ids = emit_all(
        store,
        &[
            new_event("t", "h"),
            new_event("t", "h"),
            new_event("t", "h"),
        ],
    )
    .await;
    let token = LeaseToken::new();
    let claimed = store
        .claim(
            &crate::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &tenants(&["t"]),
            LEASE,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let before = store_now(store).await;
    let out = store
        .settle(&[
            Settle {
                id: ids[0],
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[1],
                token: Some(token),
                finish: Finish::Archive,
            },
            Settle {
                id: EventId::new(),
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[2],
                token: Some(token),
                finish: Finish::Bury {
                    error: "failed for good".into(),
                },
            },
        ])
        .await
        .expect("settle");
    let after = store_now(store).await;
    assert_eq!(out.held, vec![true, true, false, true]);
    assert_eq!(store.get(ids[0]).await.expect("get"), None);
    let done = get(store, ids[1]).await;
    assert_eq!(done.state, EventState::Done);
    assert_eq!(done.lease, None);
    assert_eq!(done.attempt, 1);
    assert_eq!(done.last_error, None);
    assert!(done.updated_at >= before && done.updated_at <= after);
    let dead = get(store, ids[2]).await;
    assert_eq!(dead.state, EventState::Dead);
    assert_eq!(dead.lease, None);
    assert_eq!(dead.last_error.as_deref(), Some("failed for good"));
    assert_eq!(dead.attempt, 1);
    assert!(dead.updated_at >= before && dead.updated_at <= after);
    // A finished event has no run to end, even fenced on "no lease", nor
    // with the token that ended it.
    for id in [ids[1], ids[2]] {
        for token in [None, Some(token)] {
            for finish in every_finish("again") {
                assert!(
                    !settle_one(store, id, token, finish.clone()).await,
                    "{finish:?}"
                );
            }
        }
    }
    assert_eq!(get(store, ids[1]).await, done);
    assert_eq!(get(store, ids[2]).await, dead);
}

/// Release: a failure keeps the attempt, records the error and waits; a
/// release without an error keeps the last one; give_back returns the
/// Each failed attempt is recorded in the error history, oldest first, by
/// the statement that settles it; a snooze records nothing; the history
/// survives a revive and is empty for an unknown id.
pub async fn history_records_each_failed_attempt(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.history(EventId::new()).await.expect("history"), vec![]);
    let id = emit_one(s, new_event("t", "h")).await;
    assert_eq!(s.history(id).await.expect("history"), vec![]);
    let before = store_now(s).await;
    let token = claim_one(s, id, LEASE).await.expect("attempt 1");
    assert!(
        settle_one(
            s,
            id,
            Some(token),
            release(Duration::ZERO, Some("boom"), false)
        )
        .await
    );
    let token = claim_one(s, id, LEASE).await.expect("attempt 2");
    // A snooze gives the attempt back and records nothing.
    assert!(settle_one(s, id, Some(token), release(Duration::ZERO, None, true)).await);
    let token = claim_one(s, id, LEASE).await.expect("attempt 2 again");
    let bury = Finish::Bury {
        error: "gave up".into(),
    };
    assert!(settle_one(s, id, Some(token), bury).await);
    let after = store_now(s).await;
    let history = s.history(id).await.expect("history");
    let seen: Vec<(u32, &str)> = history
        .iter()
        .map(|h| (h.attempt, h.error.as_str()))
        .collect();
    assert_eq!(seen, vec![(1, "boom"), (2, "gave up")]);
    for h in &history {
        assert!(
            before <= h.at && h.at <= after,
            "{h:?} outside [{before:?}, {after:?}]"
        );
    }
    assert!(s.revive(id).await.expect("revive").is_some());
    assert_eq!(
        s.history(id).await.expect("history").len(),
        2,
        "kept across a revive"
    );
}

/// attempt, never below 0.
pub async fn release_arithmetic(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let id = emit_one(store, new_event("t", "h")).await;

    // A failure: attempt kept, error recorded, run_at = now + wait.
    let t1 = claim_one(store, id, LEASE).await.expect("claimed");
    let wait = Duration::from_secs(30);
    let before = store_now(store).await;
    let fail = release(wait, Some("attempt 1/3 failed: boom"), false);
    assert!(settle_one(store, id, Some(t1), fail).await);
    let after = store_now(store).await;
    let e = get(store, id).await;
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.attempt, 1);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at >= before.plus(wait) && e.run_at <= after.plus(wait));
    assert_eq!(e.updated_at, e.run_at.minus(wait));
    // Not due now.
    assert_eq!(claim_one(store, id, LEASE).await, None);

    // Fenced on "no lease": the event is not leased now. No error given,
    // none given back: the attempt and the last error stay.
    assert!(settle_one(store, id, None, release(Duration::ZERO, None, false)).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 1);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at <= store_now(store).await);

    // A snooze: the attempt is given back; the last error is kept.
    let t2 = claim_one(store, id, LEASE).await.expect("claimed");
    assert_eq!(get(store, id).await.attempt, 2);
    assert!(settle_one(store, id, Some(t2), release(Duration::ZERO, None, true)).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 1);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at <= store_now(store).await);

    // A later failure replaces the error.
    let t3 = claim_one(store, id, LEASE).await.expect("claimed");
    let fail = release(Duration::ZERO, Some("attempt 2/3 failed: bang"), false);
    assert!(settle_one(store, id, Some(t3), fail).await);
    let e = get(store, id).await;
    assert_eq!(e.attempt, 2);
    assert_eq!(e.last_error.as_deref(), Some("attempt 2/3 failed: bang"));

    // Giving back never goes below zero.
    let fresh = emit_one(store, new_event("t", "h")).await;
    assert!(settle_one(store, fresh, None, release(Duration::ZERO, None, true)).await);
    assert_eq!(get(store, fresh).await.attempt, 0);
}

/// Release and revive count as notifications (`notified_at` becomes the new
/// `run_at`): a sweep with a quiet period does not return them at once,
/// while an old event that was never released is returned.
pub async fn release_and_revive_count_as_notifications(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let released = emit_one(store, old_event("t", "h")).await;
    let revived = emit_one(store, old_event("t", "h")).await;
    let untouched = emit_one(store, old_event("t", "h")).await;
    let token = claim_one(store, released, LEASE).await.expect("claimed");
    let snooze = release(Duration::ZERO, None, true);
    assert!(settle_one(store, released, Some(token), snooze).await);
    bury(store, revived).await;
    assert!(store.revive(revived).await.expect("revive").is_some());
    assert_eq!(sweep_once(store, QUIET, 100).await, vec![untouched]);
    // With no quiet period, all three (notified before the pass began).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let got: HashSet<EventId> = sweep_once(store, Duration::ZERO, 100)
        .await
        .into_iter()
        .collect();
    assert_eq!(got, HashSet::from([released, revived, untouched]));
    // Released into the future: not due, not swept, even with no quiet.
    let token = claim_one(store, released, LEASE).await.expect("claimed");
    let later = release(Duration::from_secs(60), Some("boom"), false);
    assert!(settle_one(store, released, Some(token), later).await);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let got: HashSet<EventId> = sweep_once(store, Duration::ZERO, 100)
        .await
        .into_iter()
        .collect();
    assert_eq!(got, HashSet::from([revived, untouched]));
}

/// Fencing: once a lease expired and another token claimed the event, the
/// stale token can neither settle it (any of the four finishes) nor renew
/// it, nor can a settle fenced on "no lease"; the event is unchanged. The
/// new token can renew and settle.
pub async fn a_stale_token_can_neither_settle_nor_renew(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let finishes = every_finish("late");
    let mut runs = Vec::new();
    for _ in &finishes {
        let id = emit_one(store, new_event("t", "h")).await;
        let stale = claim_one(store, id, SHORT).await.expect("claimed");
        runs.push((id, stale));
    }
    tokio::time::sleep(PAST_SHORT).await;
    for ((id, stale), finish) in runs.into_iter().zip(finishes) {
        let fresh = claim_one(store, id, LEASE).await.expect("claimed again");
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: stale }], LEASE)
                .await
                .expect("renew"),
            vec![false],
            "{finish:?}"
        );
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: fresh }], LEASE)
                .await
                .expect("renew"),
            vec![true],
            "{finish:?}"
        );
        let held = get(store, id).await;
        assert_eq!(held.lease.expect("a lease").token, fresh);
        assert_eq!(held.attempt, 2);
        assert!(
            !settle_one(store, id, Some(stale), finish.clone()).await,
            "{finish:?}"
        );
        assert!(
            !settle_one(store, id, None, finish.clone()).await,
            "{finish:?}"
        );
        assert_eq!(
            store
                .renew(&[LeaseRef { id, token: stale }], LEASE)
                .await
                .expect("renew"),
            vec![false],
            "{finish:?}"
        );
        assert_eq!(get(store, id).await, held, "{finish:?}");

        // The holder still can.
        assert!(settle_one(store, id, Some(fresh), finish.clone()).await);
        let after = store.get(id).await.expect("get");
        match finish {
            Finish::Delete => assert_eq!(after, None),
            Finish::Archive => assert_eq!(after.expect("kept").state, EventState::Done),
            Finish::Release { .. } => {
                let e = after.expect("kept");
                assert_eq!(
                    (e.state, e.lease, e.attempt),
                    (EventState::Pending, None, 1)
                );
                assert_eq!(e.last_error.as_deref(), Some("late"));
            }
            Finish::Bury { .. } => {
                let e = after.expect("kept");
                assert_eq!(e.state, EventState::Dead);
                assert_eq!(e.last_error.as_deref(), Some("late"));
            }
        }
    }
}

/// An expired lease stays its holder's until another worker claims the
/// event: the holder can still renew it or settle it (the worker buries an
/// exhausted event fenced by the expired token), while a settle fenced on
/// "no lease" is refused.
pub async fn an_expired_lease_stays_valid_until_another_claim(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    let renewed = emit_one(store, new_event("t", "h")).await;
    let t_spent = claim_one(store, spent, SHORT).await.expect("claimed");
    let t_renewed = claim_one(store, renewed, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;

    for finish in every_finish("no lease") {
        assert!(
            !settle_one(store, spent, None, finish.clone()).await,
            "{finish:?}"
        );
    }
    let error = "attempt 1/1 did not finish".to_string();
    assert!(settle_one(store, spent, Some(t_spent), Finish::Bury { error }).await);
    let e = get(store, spent).await;
    assert_eq!(e.state, EventState::Dead);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/1 did not finish"));

    let before = store_now(store).await;
    let lease = LeaseRef {
        id: renewed,
        token: t_renewed,
    };
    assert_eq!(
        store.renew(&[lease], LEASE).await.expect("renew"),
        vec![true]
    );
    let e = get(store, renewed).await;
    assert!(e.lease.expect("a lease").expires_at >= before.plus(LEASE));
    // Live again: nobody else claims it.
    assert_eq!(claim_one(store, renewed, LEASE).await, None);
    assert!(settle_one(store, renewed, Some(t_renewed), Finish::Delete).await);
}

/// Settle with `token: None` fences on "no lease": it ends an unleased
/// pending event (each finish) and refuses a leased one, unchanged.
pub async fn settle_without_a_token_fences_on_no_lease(store: Arc<dyn Store>) {
    let store = store.as_ref();
    for finish in every_finish("operator") {
        let idle = emit_one(store, new_event("t", "h")).await;
        let running = emit_one(store, new_event("t", "h")).await;
        let token = claim_one(store, running, LEASE).await.expect("claimed");
        let held = get(store, running).await;
        assert!(
            !settle_one(store, running, None, finish.clone()).await,
            "{finish:?}"
        );
        assert_eq!(get(store, running).await, held, "{finish:?}");
        assert!(
            settle_one(store, idle, None, finish.clone()).await,
            "{finish:?}"
        );
        let after = store.get(idle).await.expect("get");
        let state = after.map(|e| e.state);
        let expected = match finish {
            Finish::Delete => None,
            Finish::Archive => Some(EventState::Done),
            Finish::Release { .. } => Some(EventState::Pending),
            Finish::Bury { .. } => Some(EventState::Dead),
        };
        assert_eq!(state, expected, "{finish:?}");
        assert!(settle_one(store, running, Some(token), finish.clone()).await);
    }
}

// ---------------------------------------------------------------- renew

/// Renew extends, per item, only the leases still held by that token, to
/// `now + lease`; it leaves `updated_at` alone; a settled event's lease is
/// gone.
pub async fn renew_extends_held_leases_only(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let a = emit_one(store, new_event("t", "h")).await;
    let b = emit_one(store, new_event("t", "h")).await;
    let ta = claim_one(store, a, Duration::from_secs(1))
        .await
        .expect("claimed");
    let tb = claim_one(store, b, Duration::from_secs(1))
        .await
        .expect("claimed");
    let updated = [
        get(store, a).await.updated_at,
        get(store, b).await.updated_at,
    ];
    let before = store_now(store).await;
    let out = store
        .renew(
            &[
                LeaseRef { id: a, token: ta },
                LeaseRef { id: b, token: ta },
                LeaseRef {
                    id: EventId::new(),
                    token: ta,
                },
                LeaseRef { id: b, token: tb },
            ],
            LEASE,
        )
        .await
        .expect("renew");
    let after = store_now(store).await;
    assert_eq!(out, vec![true, false, false, true]);
    for (id, updated_at) in [a, b].into_iter().zip(updated) {
        let e = get(store, id).await;
        let lease = e.lease.expect("a lease");
        assert!(lease.expires_at >= before.plus(LEASE) && lease.expires_at <= after.plus(LEASE));
        assert_eq!(e.updated_at, updated_at, "a renewal is not an update");
        assert_eq!(e.attempt, 1);
    }
    // A settled event's lease is gone.
    assert!(settle_one(store, a, Some(ta), Finish::Archive).await);
    assert_eq!(
        store
            .renew(&[LeaseRef { id: a, token: ta }], LEASE)
            .await
            .expect("renew"),
        vec![false]
    );
    assert!(store.renew(&[], LEASE).await.expect("renew").is_empty());
}
