//! Store scenarios for pause and block rules, and the renotify that lifting one pages through.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{
    block, bury, emit_all, emit_one, from_now, old_event, pause, settle_one, sweep_once, QUIET,
};
use crate::backend::{Finish, Store};
use crate::model::{EventId, NewEvent, RuleMatch};

/// Rules are added and removed once each, matched per `(tenant, handler)`,
/// and listed by tenant, handler and kind name.
pub async fn rules_add_remove_and_list(store: Arc<dyn Store>) {
    let store = store.as_ref();
    assert!(store.rules().await.expect("rules").is_empty());
    assert!(store.add_rule(&pause("t", "h")).await.expect("add"));
    assert!(!store.add_rule(&pause("t", "h")).await.expect("add"));
    assert!(store.add_rule(&block("t", "h")).await.expect("add"));
    assert!(store.add_rule(&block("a", "z")).await.expect("add"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    assert_eq!(
        store.rules_for("t", "other").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(
        store.rules_for("other", "h").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(
        store.rules().await.expect("rules"),
        vec![block("a", "z"), block("t", "h"), pause("t", "h")]
    );
    assert!(store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert!(!store.remove_rule(&pause("t", "h")).await.expect("remove"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch {
            blocked: true,
            paused: false
        }
    );
    assert!(store.remove_rule(&block("t", "h")).await.expect("remove"));
    assert_eq!(
        store.rules_for("t", "h").await.expect("rules_for"),
        RuleMatch::default()
    );
    assert_eq!(store.rules().await.expect("rules"), vec![block("a", "z")]);
}

// ---------------------------------------------------------------- renotify

/// renotify_page pages through 2,500 pending events of one handler in pages
/// of 1,000: each once, in id order, no gaps; with the delay until `run_at`;
/// other handlers, tenants and finished events are not included. The pages
/// count as notifications: a sweep then returns only the others.
pub async fn renotify_pages_through_2500_events_without_duplicates_or_gaps(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let mut expected = Vec::new();
    let mut late = None;
    for chunk in 0..5 {
        let batch: Vec<NewEvent> = (0..500)
            .map(|i| {
                let mut e = old_event("t", "h");
                if chunk == 4 && i == 499 {
                    e.run_at = from_now(Duration::from_secs(120));
                    late = Some(e.id);
                }
                e
            })
            .collect();
        expected.extend(emit_all(store, &batch).await);
    }
    let late = late.expect("a delayed event");
    // Not part of the page set: other handler, other tenant, finished.
    let other_handler = emit_one(store, old_event("t", "other")).await;
    let other_tenant = emit_one(store, old_event("u", "h")).await;
    let dead = emit_one(store, old_event("t", "h")).await;
    bury(store, dead).await;
    let done = emit_one(store, old_event("t", "h")).await;
    assert!(settle_one(store, done, None, Finish::Archive).await);
    expected.sort();

    assert!(store
        .renotify_page("t", "h", None, 0)
        .await
        .expect("renotify")
        .is_empty());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = Vec::new();
    loop {
        let page = store
            .renotify_page("t", "h", after, 1000)
            .await
            .expect("renotify");
        if page.is_empty() {
            break;
        }
        pages.push(page.len());
        after = Some(page.last().expect("a page").event_id);
        for s in page {
            assert_eq!(s.tenant, "t");
            if s.event_id == late {
                assert!(
                    s.delay > Duration::from_secs(100) && s.delay <= Duration::from_secs(120),
                    "{s:?}"
                );
            } else {
                assert_eq!(s.delay, Duration::ZERO, "{s:?}");
            }
            seen.push(s.event_id);
        }
        assert!(pages.len() < 10, "the paging does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, expected, "every pending event once, in id order");
    // Stamped as notified: only the two others are swept.
    let got: HashSet<EventId> = sweep_once(store, QUIET, 5000).await.into_iter().collect();
    assert_eq!(got, HashSet::from([other_handler, other_tenant]));
}
