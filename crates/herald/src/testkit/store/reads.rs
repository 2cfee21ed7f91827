//! Store scenarios for the reads: inspect, list and counts.

use std::sync::Arc;
use std::time::Duration;

use super::{
    block, bury, claim_one, emit_all, emit_one, from_now, get, new_event, pause, settle_one,
    store_now,
};
use crate::backend::{CountsQuery, EventFilter, Finish, HandlerCounts, Store};
use crate::model::{EventId, EventState, NewEvent, RuleMatch};

/// Inspect loads the events that exist (as `get` reads them) with the rules
/// that match each, omits missing ids, and reports the store's clock.
pub async fn inspect_loads_events_and_their_rules(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let plain = emit_one(store, new_event("t", "h")).await;
    let paused = emit_one(store, new_event("p", "h")).await;
    let blocked = emit_one(store, new_event("k", "h")).await;
    let both = emit_one(store, new_event("b", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add_rule");
    store.add_rule(&block("k", "h")).await.expect("add_rule");
    store.add_rule(&pause("b", "h")).await.expect("add_rule");
    store.add_rule(&block("b", "h")).await.expect("add_rule");
    // A rule of another handler of the same tenant matches nothing here.
    store.add_rule(&block("t", "x")).await.expect("add_rule");
    let missing = EventId::new();
    let before = store_now(store).await;
    let got = store
        .inspect(&[plain, missing, paused, blocked, both])
        .await
        .expect("inspect");
    let after = store_now(store).await;
    assert!(got.now >= before && got.now <= after);
    assert_eq!(got.found.len(), 4);
    assert!(got.found.iter().all(|i| i.event.id != missing));
    let found = |id: EventId| {
        got.found
            .iter()
            .find(|i| i.event.id == id)
            .expect("inspected")
    };
    for id in [plain, paused, blocked, both] {
        assert_eq!(found(id).event, get(store, id).await);
    }
    assert_eq!(found(plain).rules, RuleMatch::default());
    assert_eq!(
        found(paused).rules,
        RuleMatch {
            blocked: false,
            paused: true
        }
    );
    assert_eq!(
        found(blocked).rules,
        RuleMatch {
            blocked: true,
            paused: false
        }
    );
    assert_eq!(
        found(both).rules,
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    let none = store.inspect(&[missing]).await.expect("inspect");
    assert!(none.found.is_empty());
}

/// List: id order, filtered by tenant, handler and state (alone or
/// together), paged with the keyset cursor, at most `limit`.
pub async fn list_filters_and_pages_by_id(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut all = Vec::new();
    for (tenant, handler) in [("a", "x"), ("a", "y"), ("b", "x")] {
        for _ in 0..4 {
            all.push((
                emit_one(store, new_event(tenant, handler)).await,
                tenant,
                handler,
            ));
        }
    }
    // Bury two of a/x, archive one of a/y.
    let ax: Vec<EventId> = all
        .iter()
        .filter(|(_, t, h)| *t == "a" && *h == "x")
        .map(|(id, _, _)| *id)
        .collect();
    for id in &ax[1..3] {
        bury(store, *id).await;
    }
    let ay: Vec<EventId> = all
        .iter()
        .filter(|(_, t, h)| *t == "a" && *h == "y")
        .map(|(id, _, _)| *id)
        .collect();
    assert!(settle_one(store, ay[2], None, Finish::Archive).await);
    let list = |filter: EventFilter, limit: usize| async move {
        let events = store.list(&filter, limit).await.expect("list");
        events.into_iter().map(|e| e.id).collect::<Vec<_>>()
    };

    let every = store
        .list(&EventFilter::default(), 100)
        .await
        .expect("list");
    let mut sorted: Vec<EventId> = all.iter().map(|(id, _, _)| *id).collect();
    sorted.sort();
    assert_eq!(every.iter().map(|e| e.id).collect::<Vec<_>>(), sorted);
    for e in &every {
        assert_eq!(e, &get(store, e.id).await);
    }

    // Paging with a cursor.
    let mut paged = Vec::new();
    let mut filter = EventFilter::default();
    loop {
        let page = list(filter.clone(), 5).await;
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 5);
        filter.after = page.last().copied();
        paged.extend(page);
    }
    assert_eq!(paged, sorted);

    // One handler, all states merged in id order, paged.
    let one = EventFilter {
        tenant: Some("a".into()),
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(one.clone(), 100).await, ax);
    assert_eq!(list(one.clone(), 3).await, ax[..3]);
    let rest = EventFilter {
        after: Some(ax[1]),
        ..one.clone()
    };
    assert_eq!(list(rest, 100).await, ax[2..]);
    let dead_only = EventFilter {
        state: Some(EventState::Dead),
        ..one.clone()
    };
    assert_eq!(list(dead_only.clone(), 100).await, ax[1..3]);
    let dead_rest = EventFilter {
        after: Some(ax[1]),
        ..dead_only
    };
    assert_eq!(list(dead_rest, 100).await, ax[2..3]);
    let pending_only = EventFilter {
        state: Some(EventState::Pending),
        ..one.clone()
    };
    assert_eq!(list(pending_only, 100).await, vec![ax[0], ax[3]]);

    // Tenant only, handler only, state only.
    let tenant_b = EventFilter {
        tenant: Some("b".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(tenant_b, 100).await.len(), 4);
    let handler_x = EventFilter {
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(handler_x, 100).await.len(), 8);
    let dead = EventFilter {
        state: Some(EventState::Dead),
        ..EventFilter::default()
    };
    assert_eq!(list(dead.clone(), 100).await, ax[1..3]);
    assert!(list(dead, 0).await.is_empty());
    let done = EventFilter {
        state: Some(EventState::Done),
        tenant: Some("a".into()),
        ..EventFilter::default()
    };
    assert_eq!(list(done, 100).await, vec![ay[2]]);
    let nobody = EventFilter {
        tenant: Some("nobody".into()),
        ..EventFilter::default()
    };
    assert!(list(nobody, 100).await.is_empty());
}

fn counts_row(tenant: &str, handler: &str, six: [u64; 6]) -> HandlerCounts {
    let [waiting, running, delayed, held, dead, done] = six;
    HandlerCounts {
        tenant: tenant.into(),
        handler: handler.into(),
        waiting,
        running,
        delayed,
        held,
        dead,
        done,
        estimated: false,
    }
}

/// Counts per `(tenant, handler)` tell each state apart: waiting (due, no
/// lease, and a lapsed lease), running (a live lease), delayed (`run_at`
/// ahead), held (paused or blocked, whatever their `run_at`), dead and
/// done; ordered by tenant and handler; filtered by tenant and handler;
/// nothing for an empty store.
pub async fn counts_tell_waiting_running_delayed_held_dead_and_done_apart(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store
        .counts(&CountsQuery::all())
        .await
        .expect("counts")
        .is_empty());
    // (a, h): 2 waiting, 1 waiting after its lease lapsed, 2 running,
    // 1 delayed, 1 dead, 1 done.
    let w = emit_all(store, &[new_event("a", "h"), new_event("a", "h")]).await;
    let lapsed = emit_one(store, new_event("a", "h")).await;
    let running = emit_all(store, &[new_event("a", "h"), new_event("a", "h")]).await;
    emit_one(
        store,
        NewEvent {
            run_at: from_now(Duration::from_secs(3600)),
            ..new_event("a", "h")
        },
    )
    .await;
    let d = emit_one(store, new_event("a", "h")).await;
    let k = emit_one(store, new_event("a", "h")).await;
    assert!(claim_one(store, lapsed, Duration::from_millis(1))
        .await
        .is_some());
    for id in &running {
        assert!(claim_one(store, *id, Duration::from_secs(60))
            .await
            .is_some());
    }
    bury(store, d).await;
    assert!(settle_one(store, k, None, Finish::Archive).await);
    // (a, p) paused: a due one and a delayed one are both held.
    emit_one(store, new_event("a", "p")).await;
    emit_one(
        store,
        NewEvent {
            run_at: from_now(Duration::from_secs(3600)),
            ..new_event("a", "p")
        },
    )
    .await;
    store.add_rule(&pause("a", "p")).await.expect("pause");
    // (b, h) blocked with a dead one; (b, x) one waiting.
    let bd = emit_one(store, new_event("b", "h")).await;
    bury(store, bd).await;
    emit_one(store, new_event("b", "h")).await;
    store.add_rule(&block("b", "h")).await.expect("block");
    emit_one(store, new_event("b", "x")).await;
    let _ = w;
    // Let the 1 ms lease lapse by the store's clock.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let all = store.counts(&CountsQuery::all()).await.expect("counts");
    assert_eq!(
        all,
        vec![
            counts_row("a", "h", [3, 2, 1, 0, 1, 1]),
            counts_row("a", "p", [0, 0, 0, 2, 0, 0]),
            counts_row("b", "h", [0, 0, 0, 1, 1, 0]),
            counts_row("b", "x", [1, 0, 0, 0, 0, 0]),
        ]
    );
    assert_eq!(all.iter().map(HandlerCounts::total).sum::<u64>(), 13);
    let b = store
        .counts(&CountsQuery::all().tenant("b"))
        .await
        .expect("counts");
    assert_eq!(b, all[2..].to_vec());
    let h = store
        .counts(&CountsQuery::all().handler("h"))
        .await
        .expect("counts");
    assert_eq!(h, vec![all[0].clone(), all[2].clone()]);
    let one = store
        .counts(&CountsQuery::all().tenant("a").handler("p"))
        .await
        .expect("counts");
    assert_eq!(one, vec![all[1].clone()]);
    assert!(store
        .counts(&CountsQuery::all().tenant("zz"))
        .await
        .expect("counts")
        .is_empty());
}

/// Up to `exact_up_to` events per state, counts are exact; beyond it, the
/// row is `estimated`, its pending total more than was counted, and the
/// split still adds up to it.
pub async fn counts_beyond_the_cap_are_estimated_and_add_up(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let events: Vec<NewEvent> = (0..30).map(|_| new_event("a", "h")).collect();
    let ids = emit_all(store, &events).await;
    for id in &ids[..3] {
        assert!(claim_one(store, *id, Duration::from_secs(60))
            .await
            .is_some());
    }
    bury(store, ids[29]).await;
    let exact = store
        .counts(&CountsQuery::all().exact_up_to(30))
        .await
        .expect("counts");
    assert_eq!(exact, vec![counts_row("a", "h", [26, 3, 0, 0, 1, 0])]);
    let capped = store
        .counts(&CountsQuery::all().exact_up_to(10))
        .await
        .expect("counts");
    assert_eq!(capped.len(), 1);
    let r = &capped[0];
    assert!(r.estimated, "{r:?}");
    assert!(r.pending() > 10, "more pending than the cap: {r:?}");
    assert_eq!(
        r.waiting + r.running + r.delayed,
        r.pending(),
        "the split adds up: {r:?}"
    );
    assert_eq!((r.held, r.dead, r.done), (0, 1, 0), "under the cap, exact");
    // Totals only: exact, not split (every pending event counts as waiting).
    let totals = store.counts(&CountsQuery::totals()).await.expect("counts");
    assert_eq!(
        totals,
        vec![HandlerCounts {
            estimated: true,
            ..counts_row("a", "h", [29, 0, 0, 0, 1, 0])
        }]
    );
}

/// Counts by tenant, handler and state, ordered by tenant, handler and
/// state (pending, dead, done); nothing for an empty store.
pub async fn counts_by_tenant_handler_and_state(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let per_state = |rows: Vec<HandlerCounts>| -> Vec<(String, String, EventState, u64)> {
        let mut out = Vec::new();
        for r in rows {
            for (s, n) in [
                (EventState::Pending, r.pending()),
                (EventState::Dead, r.dead),
                (EventState::Done, r.done),
            ] {
                if n > 0 {
                    out.push((r.tenant.clone(), r.handler.clone(), s, n));
                }
            }
        }
        out
    };
    assert!(store
        .counts(&CountsQuery::all())
        .await
        .expect("counts")
        .is_empty());
    for _ in 0..3 {
        emit_one(store, new_event("a", "x")).await;
    }
    let d = emit_one(store, new_event("a", "x")).await;
    let k = emit_one(store, new_event("a", "x")).await;
    emit_one(store, new_event("b", "y")).await;
    bury(store, d).await;
    assert!(settle_one(store, k, None, Finish::Archive).await);
    let got = per_state(store.counts(&CountsQuery::all()).await.expect("counts"));
    assert_eq!(
        got,
        vec![
            ("a".into(), "x".into(), EventState::Pending, 3),
            ("a".into(), "x".into(), EventState::Dead, 1),
            ("a".into(), "x".into(), EventState::Done, 1),
            ("b".into(), "y".into(), EventState::Pending, 1),
        ]
    );
}
