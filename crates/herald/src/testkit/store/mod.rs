//! Store-level scenarios: the [`Store`] contract, exercised through the
//! trait alone, with exact results. No SQL: a backend proves itself with
//! `herald::store_suite!(fresh_store)`.
//!
//! Times the store writes are bracketed by the store's own clock, read as
//! [`Inspection::now`](crate::backend::Inspection::now) of an empty
//! [`EventStore::inspect`]. Events are made due or old with `NewEvent::run_at` in
//! the past, leases made to lapse by claiming with [`SHORT`] and sleeping
//! [`PAST_SHORT`].
//!
//! Beyond the trait's own docs, the scenarios pin what `docs/semantics.md`
//! and ADR 0005 describe: an expired lease stays its holder's until someone
//! else claims the event; renewals and sweep stamps leave `updated_at`
//! alone; a sweep returns dead workers' events before the others; revive is
//! refused with [`StoreError::Invalid`](crate::backend::StoreError::Invalid)
//! when a live event has the same idempotency key; the payload is kept byte
//! for byte; `rules()` is ordered by tenant, handler and kind name,
//! `counts()` by tenant, handler and state (pending, dead, done).

mod claim;
mod emit;
mod leaders;
mod limits;
mod reads;
mod retention;
mod rules;
mod schedules;
mod settle;
mod singleton;
mod sweep;
mod topics;

// The suite macro names every scenario as `store::<name>`.
pub use claim::*;
pub use emit::*;
pub use leaders::*;
pub use limits::*;
pub use reads::*;
pub use retention::*;
pub use rules::*;
pub use schedules::*;
pub use settle::*;
pub use singleton::*;
pub use sweep::*;
pub use topics::*;
// Its claim parity scenario lives with the other parity checks.
pub use super::parity::{
    claim_and_admit_agree_on_a_full_limit, claim_takes_exactly_what_admit_would_claim,
};

use std::time::Duration;

use crate::backend::{Finish, Scheduled, Settle, Store};
use crate::model::{Emitted, Event, EventId, LeaseToken, Millis, NewEvent, Rule, RuleKind, RunAt};

/// A lease that outlives any scenario.
pub const LEASE: Duration = Duration::from_secs(60);
/// A lease that lapses during a scenario.
pub const SHORT: Duration = Duration::from_millis(50);
/// A sleep after which a [`SHORT`] lease has expired.
pub const PAST_SHORT: Duration = Duration::from_millis(120);
/// A quiet period that nothing notified during a scenario outlives.
const QUIET: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- helpers

/// A due event of `(tenant, handler)`: three attempts, no key. Due a second
/// ago rather than now, so that a store clock a little behind the test's
/// does not make it "not yet due".
fn new_event(tenant: &str, handler: &str) -> NewEvent {
    NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: tenant.into(),
        handler: handler.into(),
        payload: r#"{"n":1}"#.into(),
        run_at: RunAt::At(ago(Duration::from_secs(1))),
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
    }
}

/// An event due (and, by `notified_at = run_at`, last notified) a minute ago.
fn old_event(tenant: &str, handler: &str) -> NewEvent {
    NewEvent {
        run_at: RunAt::At(ago(Duration::from_secs(60))),
        ..new_event(tenant, handler)
    }
}

fn ago(d: Duration) -> Millis {
    Millis::now().minus(d)
}

/// Due `d` after the store's now when it is stored.
fn from_now(d: Duration) -> RunAt {
    RunAt::After(d)
}

fn handlers(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A claim's tenants hint.
fn tenants(names: &[&str]) -> Vec<String> {
    handlers(names)
}

fn pause(tenant: &str, handler: &str) -> Rule {
    Rule {
        tenant: tenant.into(),
        handler: handler.into(),
        kind: RuleKind::Pause,
    }
}

fn block(tenant: &str, handler: &str) -> Rule {
    Rule {
        kind: RuleKind::Block,
        ..pause(tenant, handler)
    }
}

/// The store's clock.
async fn store_now(store: &dyn Store) -> Millis {
    store.inspect(&[]).await.expect("inspect").now
}

async fn emit_one(store: &dyn Store, e: NewEvent) -> EventId {
    let out = store.emit(&[e]).await.expect("emit");
    match out[..] {
        [Emitted::Created(id)] => id,
        ref other => panic!("expected one Created, got {other:?}"),
    }
}

async fn emit_all(store: &dyn Store, events: &[NewEvent]) -> Vec<EventId> {
    let out = store.emit(events).await.expect("emit");
    assert_eq!(out.len(), events.len());
    for (e, o) in events.iter().zip(&out) {
        assert_eq!(*o, Emitted::Created(e.id));
    }
    out.into_iter().map(Emitted::id).collect()
}

/// Lets the store's clock move on by a few ms, so that what was written
/// so far is strictly before its now (a retention or window of zero
/// covers it).
async fn tick() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// Claims one id of handler `h` with a fresh token; the token if it was
/// claimed.
async fn claim_one(store: &dyn Store, id: EventId, lease: Duration) -> Option<LeaseToken> {
    let token = LeaseToken::new();
    let got = store
        .claim(
            &crate::testkit::leases(&[id], token),
            &handlers(&["h"]),
            &tenants(&["t"]),
            lease,
        )
        .await
        .expect("claim");
    match got.len() {
        0 => None,
        1 => {
            assert_eq!(got[0].id, id);
            assert_eq!(got[0].lease.expect("a lease").token, token);
            Some(token)
        }
        n => panic!("claimed {n} events for one id"),
    }
}

async fn settle_one(
    store: &dyn Store,
    id: EventId,
    token: Option<LeaseToken>,
    finish: Finish,
) -> bool {
    let out = store
        .settle(&[Settle { id, token, finish }])
        .await
        .expect("settle");
    assert_eq!(out.held.len(), 1);
    out.held[0]
}

/// Moves an unleased pending event to `dead`.
async fn bury(store: &dyn Store, id: EventId) {
    let error = "e".to_string();
    assert!(settle_one(store, id, None, Finish::Bury { error }).await);
}

async fn get(store: &dyn Store, id: EventId) -> Event {
    store.get(id).await.expect("get").expect("stored")
}

fn ids_of(scheduled: &[Scheduled]) -> Vec<EventId> {
    scheduled.iter().map(|s| s.event_id).collect()
}

/// The ids one page of a new sweep pass returns.
async fn sweep_once(store: &dyn Store, quiet: Duration, limit: usize) -> Vec<EventId> {
    ids_of(&store.sweep(quiet, None, limit).await.expect("sweep").due)
}

/// One whole sweep pass: the sizes of its pages and the ids, in order.
async fn sweep_pass(
    store: &dyn Store,
    quiet: Duration,
    limit: usize,
) -> (Vec<usize>, Vec<EventId>) {
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    let mut pass = None;
    loop {
        let page = store.sweep(quiet, pass, limit).await.expect("sweep");
        if let Some(p) = pass {
            assert_eq!(page.pass, p, "the cursor of a pass does not move");
        }
        pass = Some(page.pass);
        pages.push(page.due.len());
        for s in &page.due {
            assert_eq!(s.delay, Duration::ZERO, "{s:?}");
        }
        seen.extend(ids_of(&page.due));
        if page.complete {
            return (pages, seen);
        }
        assert!(pages.len() < 20, "the pass does not end: {pages:?}");
    }
}

fn release(wait: Duration, error: Option<&str>, give_back: bool) -> Finish {
    Finish::Release {
        wait,
        error: error.map(str::to_string),
        give_back,
    }
}

/// The four ways a run ends.
fn every_finish(error: &str) -> [Finish; 4] {
    [
        Finish::Delete,
        Finish::Archive,
        release(Duration::ZERO, Some(error), true),
        Finish::Bury {
            error: error.into(),
        },
    ]
}
