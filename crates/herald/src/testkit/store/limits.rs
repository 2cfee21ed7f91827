//! Concurrency limits: the claim takes a slot with the lease or parks the
//! event; settles and lapsed leases give slots back and wake waiters; the
//! limits themselves.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::{LeaseRef, Store};
use crate::limit::{Limit, LimitKind, LimitScope, LimitSource, Rate, TenantKey};

fn limit(handler: &str, scope: LimitScope, running: u32) -> Limit {
    Limit::running(handler, scope, running)
}

fn per_key() -> LimitScope {
    LimitScope::Key { key: None }
}

fn keyed(tenant: &str, key: &str) -> NewEvent {
    NewEvent {
        concurrency_key: Some(key.into()),
        ..new_event(tenant, "h")
    }
}

/// Claims `ids` of handler `h`, each with its own token: the leases taken.
async fn claim_ids(store: &dyn Store, ids: &[EventId], lease: Duration) -> Vec<LeaseRef> {
    let leases: Vec<LeaseRef> = ids
        .iter()
        .map(|&id| LeaseRef {
            id,
            token: LeaseToken::new(),
        })
        .collect();
    store
        .claim(&leases, &handlers(&["h"]), &tenants(&["t"]), lease)
        .await
        .expect("claim")
        .into_iter()
        .map(|e| LeaseRef {
            id: e.id,
            token: e.lease.expect("a claimed event has a lease").token,
        })
        .collect()
}

fn ids(leases: &[LeaseRef]) -> HashSet<EventId> {
    leases.iter().map(|l| l.id).collect()
}

async fn finish(store: &dyn Store, run: LeaseRef) -> Vec<EventId> {
    let settled = store
        .settle(&[Settle {
            id: run.id,
            token: Some(run.token),
            finish: Finish::Delete,
        }])
        .await
        .expect("settle");
    assert_eq!(settled.held, vec![true]);
    ids_of(&settled.woken)
}

/// A limit of 2 per key: a claim of five events of one key and two of
/// another takes two of each and the keyless one; the other three are
/// parked, each told as waiting for its key's full scope; a claim of them
/// again takes none. Ending a run wakes the oldest waiter of its key, and
/// only that one; the woken one is claimable.
pub async fn a_limit_per_key_admits_that_many_and_parks_the_rest(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store
        .set_limit(&limit("h", per_key(), 2))
        .await
        .expect("set"));
    let mut events: Vec<NewEvent> = (0..5).map(|_| keyed("t", "k1")).collect();
    events.extend((0..2).map(|_| keyed("t", "k2")));
    events.push(new_event("t", "h"));
    let all = emit_all(store, &events).await;
    let runs = claim_ids(store, &all, LEASE).await;
    let expect: HashSet<EventId> = [all[0], all[1], all[5], all[6], all[7]].into();
    assert_eq!(
        ids(&runs),
        expect,
        "the two oldest of each key and the keyless one"
    );
    let seen = store.inspect(&all[2..5]).await.expect("inspect");
    assert_eq!(seen.found.len(), 3);
    for i in &seen.found {
        let wait = i
            .waiting
            .as_ref()
            .expect("a parked event says what holds it");
        assert_eq!(
            wait.scope,
            LimitScope::Key {
                key: Some(TenantKey {
                    tenant: "t".into(),
                    key: "k1".into()
                })
            }
        );
        assert_eq!((wait.running, wait.limit), (2, 2), "{wait}");
        assert_eq!(i.event.attempt, 0, "a refused claim gives its attempt back");
        assert_eq!(i.event.lease, None, "and its lease");
    }
    let running = store.inspect(&all[..1]).await.expect("inspect");
    assert_eq!(
        running.found[0].waiting, None,
        "a running event waits for nothing"
    );
    assert!(
        claim_ids(store, &all[2..5], LEASE).await.is_empty(),
        "still full"
    );
    let k1_run = runs
        .iter()
        .find(|l| l.id == all[0])
        .copied()
        .expect("k1's run");
    assert_eq!(
        finish(store, k1_run).await,
        vec![all[2]],
        "the oldest k1 waiter"
    );
    let woke = claim_ids(store, &all[2..5], LEASE).await;
    assert_eq!(
        ids(&woke),
        HashSet::from([all[2]]),
        "the woken one runs; the others still wait"
    );
}

/// A handler's limit counts every tenant's runs together; a tenant's limit
/// each tenant's, a tenant's own row before the default.
pub async fn a_handler_limit_counts_every_tenant_and_a_tenant_limit_each(store: Arc<dyn Store>) {
    let store = store.as_ref();
    store
        .set_limit(&limit("h", LimitScope::Handler, 3))
        .await
        .expect("set");
    store
        .set_limit(&limit("h", LimitScope::Tenant { tenant: None }, 1))
        .await
        .expect("set");
    store
        .set_limit(&limit(
            "h",
            LimitScope::Tenant {
                tenant: Some("big".into()),
            },
            2,
        ))
        .await
        .expect("set");
    let events = [
        new_event("a", "h"),
        new_event("a", "h"),
        new_event("big", "h"),
        new_event("big", "h"),
        new_event("big", "h"),
        new_event("c", "h"),
    ];
    let all = emit_all(store, &events).await;
    let runs = claim_ids(store, &all, LEASE).await;
    // a: 1 (its tenant's default); big: 2 (its own row); handler: 3 in all.
    assert_eq!(ids(&runs), HashSet::from([all[0], all[2], all[3]]));
    let seen = store.inspect(&[all[5]]).await.expect("inspect");
    let wait = seen.found[0].waiting.as_ref().expect("c waits");
    assert_eq!(
        wait.scope,
        LimitScope::Handler,
        "c's tenant has room; the handler has none"
    );
    assert_eq!((wait.running, wait.limit), (3, 3));
}

/// A run whose worker dies holds its slot until its lease lapses; then
/// the reconciler's `lapse_slots` frees it and wakes a waiter, which runs.
/// A renewal keeps a slot as long as the lease.
pub async fn a_lapsed_lease_frees_its_slot_and_a_renewal_keeps_it(store: Arc<dyn Store>) {
    let store = store.as_ref();
    store
        .set_limit(&limit("h", per_key(), 1))
        .await
        .expect("set");
    let all = emit_all(store, &[keyed("t", "k"), keyed("t", "k"), keyed("t", "k")]).await;
    let first = claim_ids(store, &all[..1], SHORT).await;
    assert_eq!(first.len(), 1);
    assert!(claim_ids(store, &all[1..], LEASE).await.is_empty());
    let renewed = store.renew(&first, LEASE).await.expect("renew");
    assert_eq!(renewed, vec![true]);
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        store.lapse_slots(100).await.expect("lapse").is_empty(),
        "a renewed run's slot outlives its first lease"
    );
    let settled = store
        .settle(&[Settle {
            id: first[0].id,
            token: Some(first[0].token),
            finish: release(Duration::ZERO, None, true),
        }])
        .await
        .expect("release");
    assert_eq!(
        ids_of(&settled.woken),
        vec![all[1]],
        "a released run's slot wakes the oldest"
    );
    let second = claim_ids(store, &all[1..2], SHORT).await;
    assert_eq!(second.len(), 1);
    // Its worker dies: its lease, and the slot with it, lapse.
    tokio::time::sleep(PAST_SHORT).await;
    let woken = store.lapse_slots(100).await.expect("lapse");
    assert_eq!(
        ids_of(&woken),
        vec![all[2]],
        "the lapsed slot woke the last waiter"
    );
    assert_eq!(claim_ids(store, &all[2..], LEASE).await.len(), 1);
}

/// Raising a limit, or removing it, wakes as many waiters as the new room:
/// the caller pages `wake_limit` through the scopes with waiters.
pub async fn raising_or_removing_a_limit_wakes_its_waiters(store: Arc<dyn Store>) {
    let store = store.as_ref();
    store
        .set_limit(&limit("h", per_key(), 1))
        .await
        .expect("set");
    let mut events: Vec<NewEvent> = (0..4).map(|_| keyed("t", "k1")).collect();
    events.extend((0..3).map(|_| keyed("t", "k2")));
    let all = emit_all(store, &events).await;
    assert_eq!(claim_ids(store, &all, LEASE).await.len(), 2);
    assert!(store
        .set_limit(&limit("h", per_key(), 2))
        .await
        .expect("raise"));
    let mut woken = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .wake_limit("h", LimitKind::Key, after, 1)
            .await
            .expect("wake");
        woken.extend(ids_of(&page.woken));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        woken,
        vec![all[1], all[5]],
        "one more of each key, the oldest"
    );
    assert!(store.remove_limit("h", &per_key()).await.expect("remove"));
    let page = store
        .wake_limit("h", LimitKind::Key, None, 10)
        .await
        .expect("wake");
    let rest: HashSet<EventId> = ids_of(&page.woken).into_iter().collect();
    assert_eq!(
        rest,
        HashSet::from([all[2], all[3], all[6]]),
        "no limit: every waiter"
    );
    assert_eq!(page.next, None);
    assert_eq!(
        claim_ids(store, &all, LEASE).await.len(),
        5,
        "everything not running runs"
    );
}

/// Limits are set, listed in order, replaced and removed; the config's
/// are synced as a whole, leaving the API's alone, and the sync reports
/// the limits it raised or removed.
pub async fn limits_are_set_listed_and_synced(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let api = limit("a", LimitScope::Handler, 5);
    assert!(store.set_limit(&api).await.expect("set"));
    assert!(!store.set_limit(&api).await.expect("again"), "already so");
    assert!(store
        .set_limit(&limit("a", LimitScope::Handler, 6))
        .await
        .expect("replace"));
    let err = store
        .set_limit(&limit("a", LimitScope::Handler, 0))
        .await
        .expect_err("a limit of 0");
    assert!(
        matches!(err, crate::backend::StoreError::Invalid(_)),
        "{err}"
    );
    let key = LimitScope::Key {
        key: Some(TenantKey {
            tenant: "t".into(),
            key: "acme".into(),
        }),
    };
    let both = Limit {
        rate: Some(Rate {
            starts: 10,
            period: Duration::from_secs(1),
            burst: 3,
        }),
        ..limit("b", key.clone(), 4)
    };
    let declared = vec![limit("b", per_key(), 1), both.clone()];
    assert_eq!(store.sync_limits(&declared).await.expect("sync"), vec![]);
    let listed = store.limits(None).await.expect("list");
    let shown: Vec<(Limit, LimitSource)> =
        listed.into_iter().map(|l| (l.limit, l.source)).collect();
    assert_eq!(
        shown,
        vec![
            (limit("a", LimitScope::Handler, 6), LimitSource::Api),
            (limit("b", per_key(), 1), LimitSource::Config),
            (both, LimitSource::Config),
        ]
    );
    let loosened = store
        .sync_limits(&[limit("b", per_key(), 3)])
        .await
        .expect("sync again");
    assert_eq!(loosened, vec![("b".to_string(), LimitKind::Key)]);
    assert_eq!(store.limits(Some("b")).await.expect("list").len(), 1);
    assert!(store
        .remove_limit("a", &LimitScope::Handler)
        .await
        .expect("remove"));
    assert!(!store
        .remove_limit("a", &LimitScope::Handler)
        .await
        .expect("again"));
}

/// A rate of 2 starts a second (one every 500 ms), no burst: of four
/// events claimed at once one starts; each other is given its own turn,
/// 500 ms after the one before, its `run_at` moved there and the turn
/// booked (`rate_turn`), its claim undone. Before its turn it cannot be
/// claimed; at its turn its claim starts it without a second charge (the
/// next one is still on time), and the turn is cleared.
pub async fn a_rate_gives_each_start_its_turn(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let rate = Rate {
        starts: 2,
        period: Duration::from_secs(1),
        burst: 1,
    };
    assert!(store
        .set_limit(&Limit::rate("h", LimitScope::Handler, rate))
        .await
        .expect("set"));
    let all = emit_all(
        store,
        &(0..4).map(|_| new_event("t", "h")).collect::<Vec<_>>(),
    )
    .await;
    let before = store_now(store).await;
    let runs = claim_ids(store, &all, LEASE).await;
    assert_eq!(runs.len(), 1, "one start now");
    let seen = store.inspect(&all).await.expect("inspect");
    let mut turns: Vec<(Millis, EventId)> = seen
        .found
        .iter()
        .filter(|i| i.event.id != runs[0].id)
        .map(|i| {
            assert_eq!(
                i.event.rate_turn,
                Some(i.event.run_at),
                "the turn is booked"
            );
            assert_eq!(
                (i.event.attempt, i.event.lease),
                (0, None),
                "its claim undone"
            );
            (i.event.run_at, i.event.id)
        })
        .collect();
    turns.sort();
    assert_eq!(turns.len(), 3);
    assert!(
        turns[0].0 .0 >= before.0 + 499,
        "{turns:?} after {before:?}"
    );
    for pair in turns.windows(2) {
        let gap = pair[1].0 .0 - pair[0].0 .0;
        assert!((499..=501).contains(&gap), "turns 500 ms apart: {turns:?}");
    }
    let waiting: Vec<EventId> = turns.iter().map(|t| t.1).collect();
    assert!(
        claim_ids(store, &waiting, LEASE).await.is_empty(),
        "not before its turn"
    );
    for (turn, id) in turns {
        while store_now(store).await < turn {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let got = claim_ids(store, &[id], LEASE).await;
        assert_eq!(got.len(), 1, "at its turn it starts");
        assert_eq!(get(store, id).await.rate_turn, None, "its turn is spent");
    }
}

/// A burst lets that many start at once after a quiet spell; the next
/// waits one interval.
pub async fn a_rate_s_burst_starts_at_once(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let rate = Rate {
        starts: 1,
        period: Duration::from_secs(60),
        burst: 3,
    };
    let per_tenant = LimitScope::Tenant { tenant: None };
    store
        .set_limit(&Limit::rate("h", per_tenant, rate))
        .await
        .expect("set");
    let mut events: Vec<NewEvent> = (0..5).map(|_| new_event("a", "h")).collect();
    events.push(new_event("b", "h"));
    let all = emit_all(store, &events).await;
    let runs = claim_ids(store, &all, LEASE).await;
    let started = ids(&runs);
    assert_eq!(
        started,
        HashSet::from([all[0], all[1], all[2], all[5]]),
        "a's burst of 3, and b's own"
    );
    let now = store_now(store).await;
    let later = store.inspect(&all[3..5]).await.expect("inspect");
    for i in &later.found {
        assert!(
            i.event.run_at.0 >= now.0 + 59_000,
            "a minute on: {:?}",
            i.event
        );
    }
}
