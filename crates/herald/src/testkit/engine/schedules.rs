//! Engine scenarios for the scheduler: a schedule's occurrences are emitted
//! and run once each, across a change of leader.

use std::sync::Arc;
use std::time::Duration;

use super::{config, Rig, H, SOON, T};
use crate::backend::{EventFilter, Store};
use crate::model::{EventState, Millis};
use crate::schedule::{ScheduleDef, ScheduleSource};
use crate::testkit::eventually;
use crate::worker::WorkerConfig;

/// The run times of the done events of `T`, in order.
async fn occurrences_run(store: &dyn Store) -> Vec<Millis> {
    let events = store
        .list(
            &EventFilter {
                tenant: Some(T.into()),
                ..EventFilter::default()
            },
            10_000,
        )
        .await
        .expect("list");
    let mut runs: Vec<Millis> = events
        .iter()
        .filter(|e| e.state == EventState::Done)
        .map(|e| e.run_at)
        .collect();
    runs.sort();
    runs
}

/// An every-second schedule with two workers: the elected one emits each
/// occurrence, each runs once; the leader shuts down, the other takes over,
/// and the occurrences stay consecutive seconds, none twice, none skipped.
pub async fn a_schedule_fires_every_occurrence_once_across_a_leader_change(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let cfg = |name: &str| WorkerConfig {
        name: name.into(),
        done_retention: Some(Duration::from_secs(3600)),
        schedule_every: Duration::from_millis(100),
        ..config()
    };
    let a = rig.builder().config(cfg("a")).start();
    let b = rig.builder().config(cfg("b")).start();
    let s = ScheduleDef {
        every: Some(Duration::from_secs(1)),
        ..ScheduleDef::new(T, "tick", H, ScheduleSource::Api)
    }
    .build(Millis::now(), 0)
    .expect("valid");
    rig.store.put_schedule(&s).await.expect("put");
    let store = rig.store.clone();
    eventually("three occurrences run", SOON, || {
        let store = store.clone();
        async move { occurrences_run(store.as_ref()).await.len() >= 3 }
    })
    .await;
    let (leader, follower) = if a.stats().scheduled > 0 {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(follower.stats().scheduled, 0, "one leader");
    leader.shutdown(SOON).await;
    let before = occurrences_run(rig.store.as_ref()).await.len();
    eventually("the follower takes over", SOON, || {
        let store = store.clone();
        async move { occurrences_run(store.as_ref()).await.len() >= before + 3 }
    })
    .await;
    assert!(follower.stats().scheduled > 0, "the follower fired");
    rig.store.delete_schedule(T, "tick").await.expect("delete");
    follower.shutdown(SOON).await;
    let runs = occurrences_run(rig.store.as_ref()).await;
    assert_eq!(
        runs[0], s.next_at,
        "the first occurrence is the first cursor"
    );
    for pair in runs.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 1000, "consecutive seconds: {runs:?}");
    }
    assert_eq!(rig.ledger.total(), runs.len(), "each ran once");
}
