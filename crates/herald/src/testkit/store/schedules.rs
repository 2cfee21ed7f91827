//! Store scenarios for schedules: definitions, due ones, and the
//! compare-and-set that makes each occurrence emitted once.

use std::sync::Arc;
use std::time::Duration;

use super::store_now;
use crate::backend::{EventFilter, Store};
use crate::model::{EventState, Millis, RunAt};
use crate::schedule::{
    fire, Missed, Schedule, ScheduleDef, ScheduleFiring, ScheduleSource, DEFAULT_GRACE,
};

/// An every-10-s schedule of `(tenant, name)` with its cursor at `next_at`.
fn every_10s(tenant: &str, name: &str, next_at: Millis) -> Schedule {
    let mut s = ScheduleDef {
        every: Some(Duration::from_secs(10)),
        payload: Some(r#"{"report":"daily"}"#.into()),
        max_attempts: Some(3),
        ..ScheduleDef::new(tenant, name, "report", ScheduleSource::Api)
    }
    .build(Millis(0), 0)
    .expect("a valid schedule");
    s.next_at = next_at;
    s
}

/// The firing the leader would make of `s` at `now`.
fn firing_of(s: &Schedule, now: Millis) -> ScheduleFiring {
    let f = fire(s, now, DEFAULT_GRACE);
    ScheduleFiring {
        tenant: s.tenant.clone(),
        name: s.name.clone(),
        expected_next_at: s.next_at,
        next_at: f.next_at,
        events: f
            .occurrences
            .iter()
            .map(|&t| s.occurrence_event(t))
            .collect(),
    }
}

/// Schedules are stored, read back as given, listed by tenant and name,
/// replaced (a same-cadence replacement keeps the cursor, another cadence
/// takes the new one; both keep `paused`), paused, resumed and deleted.
pub async fn schedules_put_get_list_pause_and_delete(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let a = every_10s("acme", "b-report", Millis(1_000_000));
    assert!(store.put_schedule(&a).await.expect("put"), "created");
    let got = store.schedule("acme", "b-report").await.expect("get");
    assert_eq!(got.as_ref(), Some(&a));
    let mut zulu = every_10s("zulu", "a", Millis(5_000));
    zulu.cadence = crate::schedule::Cadence::Cron(
        crate::schedule::CronExpr::parse("0 30 2 * * *").expect("cron"),
    );
    zulu.timezone = "America/New_York".parse().expect("zone");
    zulu.missed = Missed::Each { cap: 5 };
    zulu.source = ScheduleSource::Config;
    store.put_schedule(&zulu).await.expect("put");
    store
        .put_schedule(&every_10s("acme", "a-report", Millis(7)))
        .await
        .expect("put");
    let names = |v: Vec<Schedule>| -> Vec<(String, String)> {
        v.into_iter().map(|s| (s.tenant, s.name)).collect()
    };
    assert_eq!(
        names(store.schedules(None).await.expect("list")),
        [("acme", "a-report"), ("acme", "b-report"), ("zulu", "a")]
            .map(|(t, n)| (t.to_string(), n.to_string()))
    );
    assert_eq!(
        store.schedules(Some("zulu")).await.expect("list"),
        vec![zulu.clone()]
    );
    // Replace with a new payload and cursor, same cadence: the cursor stays.
    assert!(store
        .pause_schedule("acme", "b-report", true)
        .await
        .expect("pause"));
    let mut changed = every_10s("acme", "b-report", Millis(9_999_999));
    changed.payload = "[1,2]".into();
    assert!(
        !store.put_schedule(&changed).await.expect("put"),
        "replaced"
    );
    let got = store
        .schedule("acme", "b-report")
        .await
        .expect("get")
        .expect("there");
    assert_eq!(got.payload, "[1,2]");
    assert_eq!(
        got.next_at,
        Millis(1_000_000),
        "same cadence keeps the cursor"
    );
    assert!(got.paused, "a replacement keeps paused");
    // Another cadence: the new cursor.
    changed.cadence = crate::schedule::Cadence::Every(Duration::from_secs(20));
    store.put_schedule(&changed).await.expect("put");
    let got = store
        .schedule("acme", "b-report")
        .await
        .expect("get")
        .expect("there");
    assert_eq!(got.next_at, Millis(9_999_999));
    assert!(store
        .pause_schedule("acme", "b-report", false)
        .await
        .expect("resume"));
    assert!(
        !store
            .schedule("acme", "b-report")
            .await
            .expect("get")
            .expect("there")
            .paused
    );
    assert!(!store
        .pause_schedule("acme", "nope", true)
        .await
        .expect("pause"));
    assert!(store
        .delete_schedule("acme", "b-report")
        .await
        .expect("delete"));
    assert!(!store
        .delete_schedule("acme", "b-report")
        .await
        .expect("delete"));
    assert_eq!(store.schedule("acme", "b-report").await.expect("get"), None);
}

/// Due schedules are the unpaused ones whose cursor is at or before the
/// store's clock, earliest first, up to the limit; the answer carries that
/// clock.
pub async fn due_schedules_are_unpaused_and_judged_by_the_store_clock(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let now = store_now(store).await;
    let empty = store.due_schedules(10).await.expect("due");
    assert!(empty.schedules.is_empty());
    assert!(empty.now >= now, "the store's clock");
    for (name, at) in [
        ("late", now.minus(Duration::from_secs(30))),
        ("later", now.minus(Duration::from_secs(20))),
        ("latest", now.minus(Duration::from_secs(10))),
        ("paused", now.minus(Duration::from_secs(40))),
        ("future", now.plus(Duration::from_secs(3600))),
    ] {
        store
            .put_schedule(&every_10s("acme", name, at))
            .await
            .expect("put");
    }
    store
        .pause_schedule("acme", "paused", true)
        .await
        .expect("pause");
    let due = store.due_schedules(10).await.expect("due");
    let names: Vec<&str> = due.schedules.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["late", "later", "latest"]);
    let two = store.due_schedules(2).await.expect("due");
    assert_eq!(two.schedules.len(), 2);
}

/// Two leaders fire the same schedule from the same cursor at once: one
/// compare-and-set wins and its events are stored, the other writes
/// nothing; firing again from the old cursor writes nothing either. The
/// winner's last occurrence and event are recorded.
pub async fn two_concurrent_fires_of_one_cursor_have_one_winner(store: Arc<dyn Store>) {
    let now = store_now(store.as_ref()).await;
    let cursor = Millis((now.0 / 10_000 - 3) * 10_000);
    let s = every_10s("acme", "race", cursor);
    store.put_schedule(&s).await.expect("put");
    // Each leader makes its own events (their own ids), as two would.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, f) = (store.clone(), firing_of(&s, now));
        tasks.push(tokio::spawn(async move {
            (store.fire_schedule(&f).await.expect("fire"), f)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (out, f) = t.await.expect("task");
        if let Some(emitted) = out {
            winners.push((emitted, f));
        }
    }
    assert_eq!(winners.len(), 1, "one compare-and-set wins");
    let (emitted, f) = winners.pop().expect("a winner");
    assert_eq!(emitted.len(), f.events.len());
    assert!(f.events.len() >= 3, "{} occurrences", f.events.len());
    let stored = store
        .list(
            &EventFilter {
                tenant: Some("acme".into()),
                ..EventFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(stored.len(), f.events.len(), "only the winner's events");
    let mut runs: Vec<Millis> = stored.iter().map(|e| e.run_at).collect();
    runs.sort();
    let want: Vec<Millis> = f
        .events
        .iter()
        .map(|e| match e.run_at {
            RunAt::At(at) => at,
            RunAt::After(d) => panic!("an occurrence due {d:?} after now"),
        })
        .collect();
    assert_eq!(runs, want, "one event per occurrence, due at it");
    for e in &stored {
        assert_eq!(e.state, EventState::Pending);
        assert_eq!(e.payload, r#"{"report":"daily"}"#);
        assert_eq!(e.max_attempts, 3);
        assert_eq!(
            e.idempotency_key.as_deref(),
            Some(crate::schedule::occurrence_key("race", e.run_at).as_str())
        );
    }
    let after = store
        .schedule("acme", "race")
        .await
        .expect("get")
        .expect("there");
    assert_eq!(after.next_at, f.next_at);
    let last = after.last.expect("the last occurrence");
    assert_eq!(last.occurrence, *want.last().expect("one"));
    assert_eq!(last.event_id, emitted.last().expect("one").id());
    // A late leader with the old cursor: nothing.
    assert_eq!(
        store
            .fire_schedule(&firing_of(&s, now))
            .await
            .expect("fire"),
        None
    );
    // A schedule deleted meanwhile: nothing.
    store.delete_schedule("acme", "race").await.expect("delete");
    assert_eq!(
        store
            .fire_schedule(&firing_of(&after, now))
            .await
            .expect("fire"),
        None
    );
}

/// A cursor far in the past (herald was down): the missed policy decides
/// what is stored; `once` stores the latest missed occurrence and the
/// on-time ones, `skip` only the on-time ones.
pub async fn a_cursor_far_in_the_past_follows_the_missed_policy(store: Arc<dyn Store>) {
    let now = store_now(store.as_ref()).await;
    let day_ago = Millis((now.0 - 86_400_000) / 10_000 * 10_000);
    for (name, missed) in [("once", Missed::Once), ("skip", Missed::Skip)] {
        let mut s = every_10s(name, name, day_ago);
        s.missed = missed;
        store.put_schedule(&s).await.expect("put");
        let f = firing_of(&s, now);
        store.fire_schedule(&f).await.expect("fire").expect("won");
        let events = store
            .list(
                &EventFilter {
                    tenant: Some(name.into()),
                    ..EventFilter::default()
                },
                1000,
            )
            .await
            .expect("list");
        let cutoff = now.minus(DEFAULT_GRACE);
        let late = events.iter().filter(|e| e.run_at < cutoff).count();
        let on_time = events.iter().filter(|e| e.run_at >= cutoff).count();
        assert_eq!(late, usize::from(missed == Missed::Once), "{name}");
        assert!((6..=7).contains(&on_time), "{name}: {on_time} on time");
        let after = store
            .schedule(name, name)
            .await
            .expect("get")
            .expect("there");
        assert!(after.next_at > now && after.next_at <= now.plus(Duration::from_secs(10)));
    }
}
