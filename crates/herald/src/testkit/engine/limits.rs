//! Engine scenarios for concurrency limits: two workers, one store, one
//! queue; a key's runs never exceed its limit, every event runs once, and
//! waiting costs no notification traffic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Rig, SOON, T};
use crate::backend::Store;
use crate::client::{EmitOptions, EmitRequest};
use crate::handler::Context;
use crate::limit::{Limit, LimitScope};
use crate::model::EventId;
use crate::testkit::eventually;

/// Runs of each key going on now, and the most seen at once.
#[derive(Default)]
struct Overlap {
    now: HashMap<String, usize>,
    most: HashMap<String, usize>,
}

/// A per-key limit of 2 on a handler whose runs take 40 ms; 24 events of
/// key `a`, 24 of key `b`, 4 without a key, all emitted before two workers
/// of 16 slots each start: no key ever runs more than 2 at once (the
/// handlers' own count, across both workers), each key reaches 2, every
/// event runs exactly once and the store ends empty. The waiting events
/// are parked and woken by the settles, not put back on the queue: the
/// notifications received stay within one per event plus one per wake,
/// and requeues within the races of a wake (at most two per event).
pub async fn a_limited_key_runs_at_most_its_limit_at_once_across_workers(store: Arc<dyn Store>) {
    let rig = Rig::new(store).await;
    let limit = Limit::running("keyed", LimitScope::Key { key: None }, 2);
    assert!(rig.client.set_limit(&limit).await.expect("set the limit"));
    let request = |key: Option<&str>| EmitRequest {
        tenant: T.into(),
        handler: "keyed".into(),
        payload: "{}".into(),
        options: EmitOptions {
            concurrency_key: key.map(str::to_string),
            ..EmitOptions::default()
        },
    };
    let mut requests = Vec::new();
    for _ in 0..24 {
        requests.push(request(Some("a")));
        requests.push(request(Some("b")));
    }
    requests.extend((0..4).map(|_| request(None)));
    let keys: Vec<String> = requests
        .iter()
        .map(|r| r.options.concurrency_key.clone().unwrap_or_default())
        .collect();
    let ids: Vec<EventId> = rig
        .client
        .emit_batch(requests)
        .await
        .expect("emit")
        .into_iter()
        .map(|e| e.id())
        .collect();
    let key_of: Arc<HashMap<EventId, String>> = Arc::new(ids.iter().copied().zip(keys).collect());
    let overlap = Arc::new(Mutex::new(Overlap::default()));
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = || {
        let (key_of, overlap, runs) = (key_of.clone(), overlap.clone(), runs.clone());
        rig.builder()
            .handler("keyed", move |_: serde_json::Value, cx: Context| {
                let (key_of, overlap, runs) = (key_of.clone(), overlap.clone(), runs.clone());
                async move {
                    let key = key_of.get(&cx.event_id).cloned().unwrap_or_default();
                    {
                        let mut o = overlap.lock().expect("overlap");
                        let n = {
                            let n = o.now.entry(key.clone()).or_default();
                            *n += 1;
                            *n
                        };
                        let most = o.most.entry(key.clone()).or_default();
                        *most = (*most).max(n);
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    *overlap
                        .lock()
                        .expect("overlap")
                        .now
                        .get_mut(&key)
                        .expect("counted") -= 1;
                    runs.fetch_add(1, Ordering::SeqCst);
                }
            })
            .start()
    };
    let (w1, w2) = (worker(), worker());
    let total = ids.len();
    eventually("every event runs", SOON * 3, || {
        let n = runs.load(Ordering::SeqCst);
        async move { n >= total }
    })
    .await;
    for id in &ids {
        rig.until_gone(*id).await;
    }
    tokio::time::sleep(super::QUIET).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        ids.len(),
        "each event ran once"
    );
    let most = overlap.lock().expect("overlap").most.clone();
    assert_eq!(
        most.get("a"),
        Some(&2),
        "key a ran 2 at once at most, and reached 2: {most:?}"
    );
    assert_eq!(most.get("b"), Some(&2), "key b likewise: {most:?}");
    // No waiting event bounces: it is parked, and woken once per slot. A
    // requeue comes only from a race (a wake between a claim and its
    // inspect answers as a lost claim, 50 ms later; a duplicate of a
    // running event's notification waits for its lease): under load, up
    // to about one per event. A waiting event that bounced until a slot
    // freed would be requeued every 50 ms: tens of times per event here.
    let (s1, s2) = (w1.stats(), w2.stats());
    let requeued = (s1.requeued + s2.requeued) as usize;
    let received = (s1.received + s2.received) as usize;
    assert!(
        requeued <= 2 * ids.len() && received <= 2 * ids.len() + 8,
        "{received} notifications received, {requeued} requeued, for {} events",
        ids.len()
    );
    w1.shutdown(SOON).await;
    w2.shutdown(SOON).await;
}
