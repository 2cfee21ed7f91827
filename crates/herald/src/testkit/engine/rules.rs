//! Engine scenarios for pause and block: held while a rule holds, run once when the last is lifted.

use std::sync::Arc;

use super::{Rig, H, QUIET, SOON, T};
use crate::backend::Store;
use crate::testkit::{eventually, stored};
use crate::worker::Worker;

async fn held_then_lifted(store: Arc<dyn Store>, pause: bool) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    if pause {
        assert!(rig.client.pause(T, H).await.unwrap());
    } else {
        assert!(rig.client.block(T, H).await.unwrap());
    }
    let id = rig.emit().await;
    // A rule also holds an event that was emitted before it.
    rig.never_runs_for_a_while(id).await;
    assert!(w.stats().dropped >= 1, "the notification was dropped");
    assert_eq!(rig.stored().await, 1);
    let release = if pause {
        rig.client.unpause(T, H).await.unwrap()
    } else {
        rig.client.unblock(T, H).await.unwrap()
    };
    assert!(release.removed);
    assert_eq!(release.notified, 1);
    rig.runs_once(id).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Block, then unblock: held while blocked, runs once after.
pub async fn block_then_unblock(store: Arc<dyn Store>) {
    held_then_lifted(store, false).await;
}

/// Pause, then unpause: held while paused, runs once after.
pub async fn pause_then_unpause(store: Arc<dyn Store>) {
    held_then_lifted(store, true).await;
}

/// Both rules hold the event; lifting `first_lift` leaves it held by the
/// other; lifting that one too runs it once.
async fn held_by_both(store: Arc<dyn Store>, pause_first: bool, lift_pause_first: bool) {
    let rig = Rig::new(store).await;
    let w = rig.worker();
    if pause_first {
        rig.client.pause(T, H).await.unwrap();
        rig.client.block(T, H).await.unwrap();
    } else {
        rig.client.block(T, H).await.unwrap();
        rig.client.pause(T, H).await.unwrap();
    }
    let id = rig.emit().await;
    rig.never_runs_for_a_while(id).await;
    let first = if lift_pause_first {
        rig.client.unpause(T, H).await.unwrap()
    } else {
        rig.client.unblock(T, H).await.unwrap()
    };
    assert!(first.removed);
    assert_eq!(first.notified, 0, "nothing is notified while still held");
    assert_eq!(first.still_held.blocked, lift_pause_first);
    assert_eq!(first.still_held.paused, !lift_pause_first);
    rig.never_runs_for_a_while(id).await;
    assert_eq!(rig.stored().await, 1);
    let second = if lift_pause_first {
        rig.client.unblock(T, H).await.unwrap()
    } else {
        rig.client.unpause(T, H).await.unwrap()
    };
    assert!(second.removed);
    assert!(!second.still_held.holds());
    assert_eq!(second.notified, 1);
    rig.runs_once(id).await;
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Pause + block, then unpause: still held (by the block).
pub async fn pause_and_block_then_unpause_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, true, true).await;
}

/// Pause + block, then unblock: still held (by the pause).
pub async fn pause_and_block_then_unblock_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, true, false).await;
}

/// Block + pause, then unpause: still held (by the block).
pub async fn block_and_pause_then_unpause_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, false, true).await;
}

/// Block + pause, then unblock: still held (by the pause).
pub async fn block_and_pause_then_unblock_is_still_held(store: Arc<dyn Store>) {
    held_by_both(store, false, false).await;
}

/// Ten unpauses in a row put ten notifications on the queue; the event runs once.
pub async fn unpause_ten_times_in_a_row_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    rig.client.pause(T, H).await.unwrap();
    let id = rig.emit().await;
    let mut notified = 0;
    for _ in 0..10 {
        notified += rig.client.unpause(T, H).await.unwrap().notified;
    }
    assert_eq!(notified, 10, "every unpause re-notifies");
    // Eleven notifications wait (the emit's and ten unpauses'); then a worker starts.
    if let Some(q) = &rig.memory {
        assert_eq!(q.len(), 11);
    }
    let w = rig.worker();
    rig.runs_once(id).await;
    assert_eq!(rig.ledger.total(), 1);
    assert_eq!(rig.stored().await, 0);
    w.shutdown(SOON).await;
}

/// Ten concurrent unpauses, four workers sharing one queue, fifty events:
/// each runs exactly once.
pub async fn unpause_ten_times_concurrently_with_several_workers_runs_once(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let workers: Vec<Worker> = (0..4).map(|_| rig.worker()).collect();
    rig.client.pause(T, H).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..50 {
        ids.push(rig.emit().await);
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(rig.ledger.total(), 0);
    let unpauses: Vec<_> = (0..10)
        .map(|_| {
            let c = rig.client.clone();
            tokio::spawn(async move { c.unpause(T, H).await.unwrap() })
        })
        .collect();
    for u in unpauses {
        u.await.unwrap();
    }
    let ledger = rig.ledger.clone();
    eventually("all fifty run", SOON, || {
        let n = ledger.distinct();
        async move { n == 50 }
    })
    .await;
    let store = rig.store.clone();
    eventually("all fifty are deleted", SOON, || {
        let store = store.clone();
        async move { stored(store.as_ref()).await == 0 }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    for id in ids {
        assert_eq!(rig.ledger.runs_of(id), 1, "event {id} ran more than once");
    }
    assert_eq!(rig.ledger.total(), 50);
    for w in workers {
        w.shutdown(SOON).await;
    }
}
