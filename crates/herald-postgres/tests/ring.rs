//! The ring of leaves (`sql/ring.sql`): turns lose nothing and store nothing
//! twice, whatever races them, and a retired leaf's storage is gone even
//! while another transaction holds a snapshot open.

use herald::backend::{EventStore, Operator, Reconciliation, Rules};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald::backend::{Finish, LeaseRef, Settle};
use herald::{Emitted, EventId, EventState, LeaseToken, Millis, NewEvent};
use herald_postgres::testing::{self, TestSchema};
use herald_postgres::PgStore;
use sqlx::{Connection, Executor, PgConnection};

fn event(handler: &str, run_in: Duration) -> NewEvent {
    NewEvent {
        singleton: None,
        // Every column survives a move to events_cold.
        concurrency_key: Some("k".into()),
        id: EventId::new(),
        tenant: "t".into(),
        handler: handler.into(),
        payload: r#"{"n":1}"#.into(),
        run_at: herald::RunAt::At(Millis(Millis::now().0 + run_in.as_millis() as i64 - 1_000)),
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
    }
}

fn handlers(h: &[&str]) -> Vec<String> {
    h.iter().map(|s| s.to_string()).collect()
}

/// Rows per leaf (0 is events_cold).
async fn per_leaf(store: &PgStore) -> HashMap<i16, i64> {
    sqlx::query_as::<_, (i16, i64)>(&format!(
        "SELECT leaf, count(*) FROM \"{}\".events GROUP BY leaf",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .expect("rows per leaf")
    .into_iter()
    .collect()
}

/// The filling leaf.
async fn filling(store: &PgStore) -> i16 {
    sqlx::query_scalar(&format!(
        "SELECT leaf FROM \"{}\".ring WHERE phase = 'filling'",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .expect("the filling leaf")
}

/// Heap pages of the ring's leaves together.
async fn ring_bytes(store: &PgStore) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT sum(pg_relation_size(format('%I.%I', '{0}', 'events_' || l)::regclass))::int8 \
         FROM generate_series(1, 3) AS l",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .expect("the leaves' sizes")
}

async fn rig() -> Option<(PgStore, TestSchema)> {
    testing::fresh_schema(&testing::test_name()).await
}

/// Turns until every ring leaf has been retired at least once (the test
/// store turns and retires on every call).
async fn turn_around(store: &PgStore) {
    for _ in 0..4 {
        store.upkeep().await.expect("upkeep");
    }
}

/// `n` turns of the ring, `pause` apart, then `stop` set: the turns'
/// errors, when the task ends.
fn turns(
    store: &Arc<PgStore>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    n: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<Vec<String>> {
    let (store, stop) = (store.clone(), stop.clone());
    tokio::spawn(async move {
        let mut failed = Vec::new();
        for _ in 0..n {
            if let Err(e) = store.upkeep().await {
                failed.push(e.to_string());
            }
            tokio::time::sleep(pause).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        failed
    })
}

#[tokio::test]
async fn events_of_every_kind_outlive_their_leaf_unchanged() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    // Due (to be claimed and held), delayed, to be buried, to be released
    // with an error, to be done and kept: all in the filling leaf.
    let running = event("h", Duration::ZERO);
    let delayed = event("h", Duration::from_secs(3600));
    let buried = event("h", Duration::ZERO);
    let released = event("h", Duration::ZERO);
    // One of a topic: ring_retire copies its topic too.
    let kept = NewEvent {
        topic: Some("user.signup".into()),
        ..event("h", Duration::ZERO)
    };
    let all = [&running, &delayed, &buried, &released, &kept];
    let out = store
        .emit(&all.iter().map(|e| (*e).clone()).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(out.iter().all(|e| matches!(e, Emitted::Created(_))));
    let first = filling(&store).await;
    let leaves = per_leaf(&store).await;
    assert_eq!(leaves.get(&first), Some(&4), "{leaves:?}");
    assert_eq!(
        leaves.get(&0),
        Some(&1),
        "the delayed one went straight to events_cold"
    );

    let token = LeaseToken::new();
    let ids = [running.id, buried.id, released.id, kept.id];
    let claimed = store
        .claim(
            &herald::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &["t".into()],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    let settle = |id, finish| Settle {
        id,
        token: Some(token),
        finish,
    };
    let held = store
        .settle(&[
            settle(
                buried.id,
                Finish::Bury {
                    error: "boom".into(),
                },
            ),
            settle(
                released.id,
                Finish::Release {
                    wait: Duration::from_secs(3600),
                    error: Some("later".into()),
                    give_back: false,
                },
            ),
            settle(kept.id, Finish::Archive),
        ])
        .await
        .unwrap();
    assert_eq!(held.held, vec![true; 3]);
    let before: Vec<_> = stored_now(&store, &all).await;

    turn_around(&store).await;
    assert_ne!(filling(&store).await, first, "the ring turned");
    let leaves = per_leaf(&store).await;
    assert_eq!(
        leaves.get(&0),
        Some(&5),
        "all five moved to events_cold: {leaves:?}"
    );
    assert_eq!(
        ring_bytes(&store).await,
        0,
        "the ring's leaves are truncated"
    );
    let after: Vec<_> = stored_now(&store, &all).await;
    assert_eq!(before, after, "moved unchanged");
    assert_eq!(
        after[4].as_ref().and_then(|e| e.topic.as_deref()),
        Some("user.signup")
    );
    assert_eq!(store.history(released.id).await.unwrap().len(), 1);

    // The lease still fences, from its new leaf.
    let wrong = LeaseRef {
        id: running.id,
        token: LeaseToken::new(),
    };
    assert_eq!(
        store
            .renew(
                &[
                    LeaseRef {
                        id: running.id,
                        token
                    },
                    wrong
                ],
                Duration::from_secs(60)
            )
            .await
            .unwrap(),
        vec![true, false]
    );
    assert_eq!(
        store
            .settle(&[settle(running.id, Finish::Delete)])
            .await
            .unwrap()
            .held,
        vec![true]
    );
    assert!(store.get(running.id).await.unwrap().is_none());
    assert_eq!(
        store.get(buried.id).await.unwrap().map(|e| e.state),
        Some(EventState::Dead)
    );
}

async fn stored_now(store: &PgStore, events: &[&NewEvent]) -> Vec<Option<herald::Event>> {
    let mut out = Vec::new();
    for e in events {
        out.push(store.get(e.id).await.unwrap());
    }
    out
}

#[tokio::test]
async fn an_id_or_a_live_key_is_stored_once_across_leaves() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let first = event("h", Duration::ZERO);
    let keyed = NewEvent {
        idempotency_key: Some("k".into()),
        topic: None,
        ..event("h", Duration::ZERO)
    };
    store.emit(&[first.clone(), keyed.clone()]).await.unwrap();
    store.upkeep().await.unwrap();
    // Now in the draining leaf; then in events_cold.
    for round in 0..2 {
        let again = NewEvent {
            id: EventId::new(),
            ..keyed.clone()
        };
        let out = store.emit(&[first.clone(), again]).await.unwrap();
        assert_eq!(
            out,
            vec![Emitted::Existing(first.id), Emitted::Existing(keyed.id)],
            "round {round}"
        );
        store.upkeep().await.unwrap();
        store.upkeep().await.unwrap();
    }
    assert_eq!(per_leaf(&store).await.values().sum::<i64>(), 2);
}

/// Many emitters send the same client-made ids (and keys) again and again
/// while the ring turns as fast as it can: every id is stored exactly once,
/// every key held by exactly one live event, and nothing is lost.
#[tokio::test]
async fn racing_emits_and_turns_store_each_event_once() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let store = Arc::new(store);
    let events: Arc<Vec<NewEvent>> = Arc::new(
        (0..400)
            .map(|i| NewEvent {
                idempotency_key: (i % 2 == 0).then(|| format!("key-{i}")),
                topic: None,
                ..event("h", Duration::ZERO)
            })
            .collect(),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // 40 turns, each retiring the leaf the one before filled.
    let turner = turns(&store, &stop, 40, Duration::from_millis(5));
    let mut emitters = Vec::new();
    for e in 0..6 {
        let (store, events, stop) = (store.clone(), events.clone(), stop.clone());
        emitters.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut created = Vec::new();
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Overlapping slices, each emitter in its own order.
                let start = (e * 37 + round * 53) % events.len();
                let batch: Vec<usize> = (0..40).map(|k| (start + k * 7) % events.len()).collect();
                let batch_events: Vec<NewEvent> =
                    batch.iter().map(|&i| events[i].clone()).collect();
                let out = store.emit(&batch_events).await.expect("emit");
                for (sent, got) in batch_events.iter().zip(out) {
                    assert_eq!(
                        got.id(),
                        sent.id,
                        "every event is its own, stored or existing"
                    );
                    if let Emitted::Created(id) = got {
                        created.push(id);
                    }
                }
                sent.extend(batch);
                round += 1;
            }
            (sent, created, round)
        }));
    }
    let mut sent = std::collections::HashSet::new();
    let mut created: HashMap<EventId, usize> = HashMap::new();
    let mut rounds = 0;
    for e in emitters {
        let (s, c, r) = e.await.expect("emitter");
        sent.extend(s);
        for id in c {
            *created.entry(id).or_default() += 1;
        }
        rounds += r;
    }
    let failed = turner.await.expect("turner");
    assert!(failed.is_empty(), "turns failed: {failed:?}");
    assert!(rounds > 40, "{rounds} emits raced the turns");
    let copies: Vec<(uuid::Uuid, i64)> = sqlx::query_as(&format!(
        "SELECT id, count(*) FROM \"{}\".events GROUP BY id HAVING count(*) > 1",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(copies.is_empty(), "stored twice: {copies:?}");
    let keys: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT idempotency_key, count(*) FROM \"{}\".events \
         WHERE idempotency_key IS NOT NULL AND state = 0 GROUP BY 1 HAVING count(*) > 1",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(keys.is_empty(), "a key held twice: {keys:?}");
    // Each stored once: answered Created to exactly one emit (a copy in a
    // second leaf would have been Created twice, whatever a later retire
    // then made of it).
    let twice: Vec<_> = created.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "created twice: {twice:?}");
    assert_eq!(
        created.len(),
        sent.len(),
        "every event sent was created once"
    );
    // Every event sent at least once is stored.
    let stored: i64 = per_leaf(&store).await.values().sum();
    assert_eq!(stored as usize, sent.len());
}

/// A transaction that holds a snapshot open (here: REPEATABLE READ on
/// another table, as a long report would) keeps vacuum from removing any
/// dead row, but not the ring from freeing its leaves.
#[tokio::test]
async fn a_held_snapshot_does_not_keep_retired_leaves() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let mut held = PgConnection::connect_with(&testing::connect_options())
        .await
        .unwrap();
    held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    held.execute("SELECT count(*) FROM pg_class").await.unwrap();

    let batch: Vec<NewEvent> = (0..2_000).map(|_| event("h", Duration::ZERO)).collect();
    store.emit(&batch).await.unwrap();
    let ids: Vec<EventId> = batch.iter().map(|e| e.id).collect();
    let token = LeaseToken::new();
    let claimed = store
        .claim(
            &herald::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &["t".into()],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), ids.len());
    let done: Vec<Settle> = ids
        .iter()
        .map(|&id| Settle {
            id,
            token: Some(token),
            finish: Finish::Delete,
        })
        .collect();
    assert_eq!(
        store.settle(&done).await.unwrap().held,
        vec![true; ids.len()]
    );
    assert!(ring_bytes(&store).await > 0, "the dead rows take room");
    turn_around(&store).await;
    assert_eq!(ring_bytes(&store).await, 0, "freed under the held snapshot");
    assert_eq!(per_leaf(&store).await.values().sum::<i64>(), 0);
    held.execute("COMMIT").await.unwrap();
}

/// An application transaction that emitted and has not committed holds the
/// ring: turns wait (their lock_timeout runs out, upkeep still succeeds),
/// and once it commits its event is stored once and the ring turns again.
#[tokio::test]
async fn an_open_transactional_emit_delays_the_turn_and_loses_nothing() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let first = filling(&store).await;
    let open = event("h", Duration::ZERO);
    let mut tx = store.pool().begin().await.unwrap();
    let out = store
        .emit_in(&mut tx, std::slice::from_ref(&open))
        .await
        .unwrap();
    assert_eq!(out, vec![Emitted::Created(open.id)]);
    for _ in 0..3 {
        store
            .upkeep()
            .await
            .expect("upkeep succeeds while the ring is held");
    }
    assert_eq!(filling(&store).await, first, "the ring waited");
    tx.commit().await.unwrap();
    turn_around(&store).await;
    assert_ne!(filling(&store).await, first, "and turned after the commit");
    assert_eq!(per_leaf(&store).await.get(&0), Some(&1));
    assert!(store.get(open.id).await.unwrap().is_some());
}

/// Events that will not run soon skip the ring: those of a paused handler
/// and those due in more than 10 s go straight to events_cold, so that
/// they never keep a leaf from draining.
#[tokio::test]
async fn events_that_will_not_run_soon_go_straight_to_the_cold_leaf() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let rule = herald::Rule {
        tenant: "t".into(),
        handler: "paused".into(),
        kind: herald::RuleKind::Pause,
    };
    assert!(store.add_rule(&rule).await.unwrap());
    let batch = vec![
        event("paused", Duration::ZERO),
        event("h", Duration::from_secs(30)),
        event("h", Duration::from_secs(5)),
        event("h", Duration::ZERO),
    ];
    store.emit(&batch).await.unwrap();
    let leaves = per_leaf(&store).await;
    assert_eq!(leaves.get(&0), Some(&2), "{leaves:?}");
    assert_eq!(leaves.get(&filling(&store).await), Some(&2), "{leaves:?}");
}

/// The claim and the settles skip the ring leaves marked empty.
/// Events emitted while the ring turns under them, claimed and settled as
/// they arrive, are each claimed once and settled, and none is left in a
/// leaf the statements skipped (with a stale mark, the events of a leaf
/// made filling would never be claimed).
#[tokio::test]
async fn claims_and_settles_racing_turns_find_every_event() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let store = Arc::new(store);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let turner = turns(&store, &stop, 60, Duration::from_millis(3));
    let (sent, mut arrived) = tokio::sync::mpsc::unbounded_channel::<Vec<EventId>>();
    let emitter = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<NewEvent> = (0..20).map(|_| event("h", Duration::ZERO)).collect();
                store.emit(&batch).await.expect("emit");
                n += batch.len();
                let _ = sent.send(batch.iter().map(|e| e.id).collect());
            }
            n
        })
    };
    let mut claimed: HashMap<EventId, usize> = HashMap::new();
    let mut pending: Vec<EventId> = Vec::new();
    let mut open = true;
    // After the emits end, a few more tries for what is left.
    let mut last_tries = 5;
    while open || (!pending.is_empty() && last_tries > 0) {
        match tokio::time::timeout(Duration::from_millis(5), arrived.recv()).await {
            Ok(Some(ids)) => pending.extend(ids),
            Ok(None) => open = false,
            Err(_) => {}
        }
        if !open {
            last_tries -= 1;
        }
        if pending.is_empty() {
            continue;
        }
        pending.sort();
        let token = LeaseToken::new();
        let got = store
            .claim(
                &herald::testkit::leases(&pending, token),
                &handlers(&["h"]),
                &["t".into()],
                Duration::from_secs(60),
            )
            .await
            .expect("claim");
        let settles: Vec<Settle> = got
            .iter()
            .map(|e| Settle {
                id: e.id,
                token: Some(token),
                finish: Finish::Delete,
            })
            .collect();
        let held = store.settle(&settles).await.expect("settle");
        assert!(
            held.held.iter().all(|h| *h),
            "a settle missed its event: {held:?}"
        );
        for e in &got {
            *claimed.entry(e.id).or_default() += 1;
        }
        pending.retain(|id| !claimed.contains_key(id));
    }
    let emitted = emitter.await.expect("emitter");
    let failed = turner.await.expect("turner");
    assert!(failed.is_empty(), "turns failed: {failed:?}");
    assert!(emitted >= 100, "{emitted} events raced the turns");
    assert!(pending.is_empty(), "{} events never claimed", pending.len());
    assert_eq!(claimed.len(), emitted, "every event claimed");
    assert!(claimed.values().all(|&n| n == 1), "an event claimed twice");
    let left: i64 = per_leaf(&store).await.values().sum();
    assert_eq!(left, 0, "every event settled");
}

/// Each ring leaf's storage file and heap size, by leaf.
async fn leaf_files(store: &PgStore) -> HashMap<i16, (i64, i64)> {
    sqlx::query_as::<_, (i16, i64, i64)>(&format!(
        "SELECT l::int2, pg_relation_filenode(c)::int8, pg_relation_size(c)::int8 \
         FROM (SELECT l, format('%I.%I', '{0}', 'events_' || l)::regclass AS c \
               FROM generate_series(1, 3) AS l) AS x",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .expect("the leaves' files")
    .into_iter()
    .map(|(l, file, bytes)| (l, (file, bytes)))
    .collect()
}

/// Claims event `id` of handler "h" for a minute under `token`: how many
/// events the claim took.
async fn claim_one(store: &PgStore, id: EventId, token: LeaseToken) -> usize {
    store
        .claim(
            &herald::testkit::leases(&[id], token),
            &handlers(&["h"]),
            &["t".into()],
            Duration::from_secs(60),
        )
        .await
        .expect("claim")
        .len()
}

/// A retire TRUNCATEs a leaf that held rows (here one event,
/// run and deleted: no live row, a dead one), and leaves a leaf nothing was
/// stored in alone, only marking it empty; the ring goes on turning and
/// storing events.
#[tokio::test]
async fn a_retire_truncates_only_a_leaf_that_held_rows() {
    let Some((store, _schema)) = rig().await else {
        return;
    };
    let used = filling(&store).await;
    let e = event("h", Duration::ZERO);
    store.emit(std::slice::from_ref(&e)).await.expect("emit");
    let token = LeaseToken::new();
    assert_eq!(claim_one(&store, e.id, token).await, 1, "the event claimed");
    let held = store
        .settle(&[Settle {
            id: e.id,
            token: Some(token),
            finish: Finish::Delete,
        }])
        .await
        .expect("settle");
    assert_eq!(held.held, vec![true]);
    let before = leaf_files(&store).await;
    assert!(before[&used].1 > 0, "the used leaf has a page: {before:?}");
    turn_around(&store).await;
    let after = leaf_files(&store).await;
    for leaf in 1..=3 {
        let ((file0, _), (file1, bytes1)) = (before[&leaf], after[&leaf]);
        assert_eq!(bytes1, 0, "leaf {leaf} left with a page: {after:?}");
        if leaf == used {
            assert_ne!(file0, file1, "leaf {leaf} held a row and was not TRUNCATEd");
        } else {
            assert_eq!(file0, file1, "leaf {leaf} held nothing and was TRUNCATEd");
        }
    }
    // The copy of the phases agrees with the ring, and the ring still stores.
    let disagree: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{0}\".ring AS r JOIN \"{0}\".ring_empty AS l USING (leaf) \
         WHERE (r.phase = 'empty') <> l.empty",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .expect("ring_empty against ring");
    assert_eq!(disagree, 0, "ring_empty disagrees with ring");
    let next = event("h", Duration::ZERO);
    store
        .emit(std::slice::from_ref(&next))
        .await
        .expect("emit after the turns");
    assert_eq!(
        claim_one(&store, next.id, LeaseToken::new()).await,
        1,
        "an event stored after the turns is claimed"
    );
}
