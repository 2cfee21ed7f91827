//! Store scenarios for the reconciler's sweep: passes, pages, parking and the quiet period.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{
    block, claim_one, emit_all, emit_one, from_now, get, ids_of, new_event, old_event, pause,
    sweep_once, sweep_pass, LEASE, PAST_SHORT, QUIET, SHORT,
};
use crate::backend::Store;
use crate::model::{EventId, NewEvent};

/// Sweeps with a quiet period through 2,500 due events in pages of 1,000,
/// each page a new pass (the next scenario pages with the pass cursor):
/// each event once, dead workers' events first (returned without waiting
/// for the quiet period, even with no attempts left); events held by a
/// rule, running under a live lease, not yet due, or notified recently are
/// not returned. Returned ones count as notified, so the next pass returns
/// nothing; once the pause is lifted, renotify pages through the paused.
pub async fn sweep_pages_through_due_events_and_skips_held_ones(store: Arc<dyn Store>) {
    let store = store.as_ref();
    // 2,500 due events, not notified for a minute.
    let mut due: Vec<EventId> = Vec::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500).map(|_| old_event("t", "h")).collect();
        due.extend(emit_all(store, &batch).await);
    }
    // Held by rules: not returned.
    let mut held: Vec<NewEvent> = (0..5).map(|_| old_event("paused", "h")).collect();
    let paused: Vec<EventId> = held.iter().map(|e| e.id).collect();
    let blocked = old_event("blocked", "h");
    held.push(blocked.clone());
    emit_all(store, &held).await;
    store.add_rule(&pause("paused", "h")).await.expect("add");
    store.add_rule(&block("blocked", "h")).await.expect("add");
    // Running under a live lease: skipped.
    let running = emit_one(store, old_event("t", "h")).await;
    claim_one(store, running, LEASE).await.expect("claimed");
    // Not due.
    let mut later = new_event("t", "h");
    later.run_at = from_now(Duration::from_secs(60));
    let later = emit_one(store, later).await;
    // Recently notified (emitted just now): not yet.
    let fresh = emit_one(store, new_event("t", "h")).await;
    // A dead worker's event: emitted and claimed just now (so notified
    // recently), its lease already expired. Returned at once, no quiet needed.
    let orphan = emit_one(store, new_event("t", "h")).await;
    claim_one(store, orphan, SHORT).await.expect("claimed");
    // Out of attempts but expired: returned too (the worker buries it).
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    claim_one(store, spent, SHORT).await.expect("claimed");
    tokio::time::sleep(PAST_SHORT).await;
    let sample = get(store, due[0]).await;

    // Each call a new pass, as the reconciler's sweeps come one after the
    // other: what a call stamped, the next does not return.
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    loop {
        let page = store.sweep(QUIET, None, 1000).await.expect("sweep");
        if page.due.len() < 1000 {
            assert!(page.complete, "{} due", page.due.len());
        }
        if page.due.is_empty() {
            break;
        }
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.delay, Duration::ZERO, "{s:?}");
        }
        seen.extend(ids_of(&page.due));
        assert!(pages.len() < 10, "the sweep does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 502]);
    // The dead workers' events come first.
    let first_two: HashSet<EventId> = seen[..2].iter().copied().collect();
    assert_eq!(first_two, HashSet::from([orphan, spent]));
    let unique: HashSet<EventId> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    let mut expected: HashSet<EventId> = due.iter().copied().collect();
    expected.insert(orphan);
    expected.insert(spent);
    assert_eq!(unique, expected);
    for skipped in [running, later, fresh, blocked.id].iter().chain(&paused) {
        assert!(!unique.contains(skipped));
    }
    // A stamp is not an update.
    assert_eq!(get(store, due[0]).await, sample);
    // Returned ones were stamped now, so a new pass finds nothing.
    let (pages, seen) = sweep_pass(store, QUIET, 1000).await;
    assert_eq!((pages, seen), (vec![0], vec![]));

    // Unpause re-notifies the paused ones, and counts as a notification.
    assert!(store.remove_rule(&pause("paused", "h")).await.expect("rm"));
    let page = store
        .renotify_page("paused", "h", None, 100)
        .await
        .expect("renotify");
    let mut sorted = paused.clone();
    sorted.sort();
    assert_eq!(ids_of(&page), sorted);
    assert!(sweep_once(store, QUIET, 1000).await.is_empty());
    // With no quiet period, the paused ones are due again; the blocked one
    // still is not.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (_, seen) = sweep_pass(store, Duration::ZERO, 1000).await;
    let seen: HashSet<EventId> = seen.into_iter().collect();
    assert!(paused.iter().all(|id| seen.contains(id)));
    assert!(!seen.contains(&blocked.id));
    assert!(!seen.contains(&running));
    assert!(!seen.contains(&later));
}

/// A pass with no quiet period (the start-up sweep) through 2,500 due
/// events with the explicit cursor returns each exactly once and ends with
/// `complete`. A new pass with a quiet period returns nothing just stamped;
/// a new pass with none returns them all again.
pub async fn a_sweep_pass_with_no_quiet_returns_each_due_event_once_and_ends(
    store: Arc<dyn Store>,
) {
    let store = store.as_ref();
    let mut all = HashSet::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500).map(|_| new_event("t", "h")).collect();
        all.extend(emit_all(store, &batch).await);
    }
    let mut pages = Vec::new();
    let mut seen = HashSet::new();
    let mut pass = None;
    loop {
        // Let the clock move, as publishing a page would.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let page = store
            .sweep(Duration::ZERO, pass, 1000)
            .await
            .expect("sweep");
        if let Some(p) = pass {
            assert_eq!(page.pass, p, "the cursor of a pass does not move");
        }
        pass = Some(page.pass);
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.tenant, "t");
            assert_eq!(s.delay, Duration::ZERO);
            assert!(seen.insert(s.event_id), "returned twice");
        }
        if page.complete {
            break;
        }
        assert!(pages.len() < 10, "the pass does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, all);
    // A new pass with a quiet period: nothing, all were just stamped.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let page = store.sweep(QUIET, None, 1000).await.expect("sweep");
    assert!(page.due.is_empty());
    assert!(page.complete);
    // A new pass with no quiet: all of them again, since all were notified
    // before it began.
    let page = store
        .sweep(Duration::ZERO, None, 1000)
        .await
        .expect("sweep");
    assert_eq!(page.due.len(), 1000);
    assert!(!page.complete);
}

/// A crash between removing a rule and re-notifying its events must not
/// leave them unswept: events held by a rule are not returned; once the
/// rule is removed without renotify_page, a later sweep returns them
/// (once); events still held by another rule are not.
pub async fn events_parked_under_a_rule_that_is_gone_are_swept_again(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let held: Vec<NewEvent> = (0..3).map(|_| old_event("p", "h")).collect();
    emit_all(store, &held).await;
    let still_held = emit_one(store, old_event("b", "h")).await;
    store.add_rule(&pause("p", "h")).await.expect("add");
    store.add_rule(&pause("b", "h")).await.expect("add");
    store.add_rule(&block("b", "h")).await.expect("add");
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    // Unpause "p" and crash before paging; unpause "b", still blocked.
    store.remove_rule(&pause("p", "h")).await.expect("remove");
    store.remove_rule(&pause("b", "h")).await.expect("remove");
    let (_, got) = sweep_pass(store, QUIET, 100).await;
    assert_eq!(got.len(), held.len(), "each once: {got:?}");
    let got: HashSet<EventId> = got.into_iter().collect();
    assert_eq!(got, held.iter().map(|e| e.id).collect());
    assert!(!got.contains(&still_held));
    assert!(sweep_once(store, QUIET, 100).await.is_empty());
    // Unblocked, again without renotify: swept too.
    store.remove_rule(&block("b", "h")).await.expect("remove");
    let (_, got) = sweep_pass(store, QUIET, 100).await;
    assert_eq!(got, vec![still_held]);
}

/// Many held events in front of a few runnable ones, with a small page:
/// one pass still returns every runnable event, each once, and ends.
pub async fn held_events_do_not_starve_the_sweep(store: Arc<dyn Store>) {
    let store = store.as_ref();
    store.add_rule(&pause("p", "h")).await.expect("add");
    let held: Vec<NewEvent> = (0..40).map(|_| old_event("p", "h")).collect();
    emit_all(store, &held).await;
    let runnable: Vec<NewEvent> = (0..3).map(|_| old_event("t", "h")).collect();
    let runnable: HashSet<EventId> = emit_all(store, &runnable).await.into_iter().collect();
    let (pages, seen) = sweep_pass(store, QUIET, 2).await;
    assert!(pages.iter().all(|&n| n <= 2), "{pages:?}");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), runnable);
    let (pages, seen) = sweep_pass(store, QUIET, 2).await;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(pages.len() < 10);
}
