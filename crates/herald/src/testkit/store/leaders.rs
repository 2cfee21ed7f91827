//! Store scenarios for leader election: lead, renew, resign and take over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{LEASE, SHORT};
use crate::backend::{Leadership, Store};

/// Leader election: one holder per role at a time; the holder renews (and a
/// holder of the same name takes its own row at once, as a restarted
/// process does); roles are independent; resigning only gives up one's own
/// lease; another holder takes over only after the lease expired (or was
/// resigned), and a follower's answer says how long until it does.
pub async fn lead_and_resign_with_two_holders(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let role = "reconciler";
    let lead = |holder: &'static str, lease: Duration| async move {
        store.lead(role, holder, lease).await.expect("lead")
    };
    let a = lead("a", LEASE).await;
    assert_eq!(
        a,
        Leadership {
            leading: true,
            left: LEASE
        }
    );
    let b = lead("b", LEASE).await;
    assert!(!b.leading);
    assert!(
        b.left > Duration::ZERO && b.left <= LEASE,
        "a follower is told the holder's lease left: {b:?}"
    );
    assert!(lead("a", LEASE).await.leading, "renewal");
    // Another role is independent.
    assert!(
        store
            .lead("purger", "b", LEASE)
            .await
            .expect("lead")
            .leading
    );
    // Resigning someone else's lease does nothing.
    store.resign(role, "b").await.expect("resign");
    assert!(!lead("b", LEASE).await.leading);
    store.resign(role, "a").await.expect("resign");
    let start = Instant::now();
    assert!(lead("b", SHORT).await.leading, "free after the resignation");
    // a asks again when told the lease lapses: then it leads, and not before.
    let mut asked = 0;
    loop {
        let l = lead("a", LEASE).await;
        if l.leading {
            break;
        }
        asked += 1;
        assert!(l.left <= SHORT, "more left than b asked for: {l:?}");
        assert!(start.elapsed() < Duration::from_secs(5), "no takeover");
        // The store's clock counts whole milliseconds.
        tokio::time::sleep(l.left + Duration::from_millis(2)).await;
    }
    assert!(asked >= 1, "a took b's live lease at once");
    assert!(
        asked <= 3,
        "a's waits by `left` took {asked} asks to reach the lapse"
    );
    // Less 2 ms: the store's clock counts whole milliseconds.
    let waited = start.elapsed() + Duration::from_millis(2);
    assert!(waited >= SHORT, "a took over a live lease after {waited:?}");
    assert!(!lead("b", LEASE).await.leading);
    // The other role was not touched.
    assert!(
        !store
            .lead("purger", "a", LEASE)
            .await
            .expect("lead")
            .leading
    );
    store.resign(role, "a").await.expect("resign");
    store
        .resign(role, "a")
        .await
        .expect("resigning twice is fine");
}
