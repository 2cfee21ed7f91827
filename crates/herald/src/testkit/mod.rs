//! The conformance test kit: scenarios that every store backend must pass.
//! [`engine`] runs them end to end through the real worker runtime and an
//! in-process queue; [`store`] calls the [`Store`] trait alone, with exact
//! results; [`queue`] calls the [`Queue`](crate::Queue) trait alone, for
//! queue backends.
//!
//! A backend proves itself with one line per suite:
//!
//! ```ignore
//! herald::engine_suite!(my_backend_tests::fresh_store);
//! herald::store_suite!(my_backend_tests::fresh_store);
//! herald::queue_suite!(my_backend_tests::fresh_queue);
//! ```
//!
//! where `fresh_store` is an `async fn() -> herald::testkit::TestStore`
//! giving each test its own empty store, and `fresh_queue` an
//! `async fn() -> herald::testkit::queue::TestQueue` its own empty queue.

pub mod engine;
pub mod faults;
pub mod parity;
pub mod queue;
pub mod schema_dump;
pub mod store;

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::Store;
use crate::model::EventId;

/// A fresh store for one test, and whatever must live as long as it
/// (a temporary directory, a schema to drop).
pub struct TestStore {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Dropped when the test ends.
    pub keep: Box<dyn Any + Send + Sync>,
}

/// What a suite's fixture function may return: a store, or `None` when its
/// service is unreachable and the fixture has said so (the test is skipped).
pub trait Fixture {
    /// The store, if there is one.
    fn into_store(self) -> Option<TestStore>;
}

impl Fixture for TestStore {
    fn into_store(self) -> Option<TestStore> {
        Some(self)
    }
}

impl Fixture for Option<TestStore> {
    fn into_store(self) -> Option<TestStore> {
        self
    }
}

/// Whether this is a CI run (`CI=true`), where every service must be there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The running test's name: libtest names each test's thread after it.
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// Says loudly that `test` can't reach `service` at `url`: a skip outside
/// CI, a failure (panic) with `CI=true`. The SKIPPED line goes straight to
/// the process's stderr, which libtest does not capture.
pub fn service_unreachable(service: &str, test: &str, url: &str, error: &dyn std::fmt::Display) {
    if in_ci() {
        panic!(
            "FAILED {test}: {service} unreachable at {url}: {error} \
             (CI=true: the {service} tests must run)"
        );
    }
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "SKIPPED {test}: {service} unreachable at {url}: {error}"
    );
    let _ = err.flush();
}

/// Polls `check` every 10 ms until it holds; panics with `what` after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Records which events ran, how often, and with which attempt number.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<HashMap<EventId, Vec<u32>>>>);

impl Ledger {
    /// Records one run.
    pub fn record(&self, id: EventId, attempt: u32) {
        self.0
            .lock()
            .expect("ledger lock")
            .entry(id)
            .or_default()
            .push(attempt);
    }

    /// How many times `id` ran.
    pub fn runs_of(&self, id: EventId) -> usize {
        self.0
            .lock()
            .expect("ledger lock")
            .get(&id)
            .map_or(0, Vec::len)
    }

    /// The attempt numbers `id` ran with.
    pub fn attempts_of(&self, id: EventId) -> Vec<u32> {
        self.0
            .lock()
            .expect("ledger lock")
            .get(&id)
            .cloned()
            .unwrap_or_default()
    }

    /// Runs in total.
    pub fn total(&self) -> usize {
        self.0
            .lock()
            .expect("ledger lock")
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Distinct events that ran.
    pub fn distinct(&self) -> usize {
        self.0.lock().expect("ledger lock").len()
    }
}

/// Events stored, in any state.
pub async fn stored(store: &dyn Store) -> u64 {
    store
        // Exact however many (tests count to the event), from the index only.
        .counts(&crate::backend::CountsQuery::totals())
        .await
        .expect("counts")
        .iter()
        .map(|c| c.total())
        .sum()
}

/// Generates one `#[tokio::test]` per engine scenario, each on a fresh
/// store from `$make` (an `async fn()` returning a [`Fixture`]: a
/// `TestStore`, or `Option<TestStore>` for a service that may be absent).
///
/// `engine_suite!(fresh_store, queue = fresh_queue)` runs the same
/// scenarios on a queue backend: `fresh_queue` is an `async fn(Duration)
/// -> Option<TestQueue>` giving each rig a fresh queue with that ack wait
/// (`None`, after saying so, when its service is unreachable: the test is
/// skipped).
#[macro_export]
macro_rules! engine_suite {
    ($make:path) => {
        $crate::engine_suite!(@suite $make, (None););
    };
    ($make:path, queue = $queue:path) => {
        $crate::engine_suite!(@suite $make, (Some($queue)););
    };
    (@suite $make:path, $queue:tt;) => {
        $crate::engine_suite!(@tests $make, $queue;
            one_event_succeeds,
            a_limited_key_runs_at_most_its_limit_at_once_across_workers,
            three_in_sequence,
            three_at_once,
            settle_calls_overlap_two_at_most,
            a_settle_call_that_panics_loses_no_event,
            expired_lease_is_claimed_and_run,
            live_lease_is_not_run_and_kept,
            block_then_unblock,
            pause_then_unpause,
            pause_and_block_then_unpause_is_still_held,
            pause_and_block_then_unblock_is_still_held,
            block_and_pause_then_unpause_is_still_held,
            block_and_pause_then_unblock_is_still_held,
            unpause_ten_times_in_a_row_runs_once,
            unpause_ten_times_concurrently_with_several_workers_runs_once,
            shutdown_within_grace_lets_handlers_finish,
            shutdown_past_grace_snoozes_and_the_next_worker_runs_them,
            second_signal_cancels_at_once,
            claimed_ahead_events_keep_their_leases_while_they_wait,
            shutdown_within_grace_runs_the_events_claimed_ahead,
            shutdown_past_grace_releases_the_events_claimed_ahead,
            a_message_of_many_events_answers_each_on_its_own,
            a_message_redelivered_after_its_worker_died_runs_what_is_left,
            lost_lease_cancels_the_handler,
            a_run_stops_before_its_lease_can_lapse_when_renewals_hang,
            late_completion_is_refused_by_the_fence,
            lost_notification_is_run_by_the_reconciler,
            every_stored_event_runs_after_a_restart,
            the_first_sweep_leaves_what_the_queue_holds,
            crash_looping_handler_ends_dead,
            failures_retry_with_backoff_then_succeed,
            snooze_gives_the_attempt_back,
            delayed_event_waits,
            an_event_at_a_time_waits_for_it,
            run_at_and_delay_together_are_refused,
            garbage_on_the_queue_is_dropped,
            unknown_handler_is_stored_and_kept,
            bad_payloads_are_refused_and_nothing_is_stored,
            idempotency_key_runs_once,
            concurrent_single_emits_each_get_their_own_event_and_run_once,
            concurrent_emits_of_one_key_store_one_event,
            a_refused_emit_fails_only_itself_in_a_group,
            the_emits_of_one_write_share_one_message,
            dead_event_can_be_retried,
            a_paused_subscriber_holds_only_its_copy,
            a_topic_of_1000_subscribers_stores_and_runs_every_copy,
            a_schedule_fires_every_occurrence_once_across_a_leader_change,
        );
    };
    (@tests $make:path, $queue:tt; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                // A fixture may return `None`: its service is unreachable and
                // it said so (a skip, outside CI).
                let Some(fixture) = $crate::testkit::Fixture::into_store($make().await) else {
                    return;
                };
                let scenario = $crate::testkit::engine::$name(fixture.store.clone());
                match $crate::engine_queue_maker! $queue {
                    None => scenario.await,
                    Some(maker) => {
                        // One probe: a queue service that is away skips the test.
                        if maker($crate::testkit::queue::ACK_WAIT).await.is_none() {
                            return;
                        }
                        $crate::testkit::engine::with_queues(maker, scenario).await
                    }
                }
                drop(fixture);
            }
        )*
    };
}

/// The engine suite's queue maker from an optional `async fn(Duration)`.
#[doc(hidden)]
#[macro_export]
macro_rules! engine_queue_maker {
    (None) => {
        None::<$crate::testkit::engine::QueueMaker>
    };
    (Some($queue:path)) => {
        Some(::std::sync::Arc::new(|ack_wait: ::std::time::Duration| {
            Box::pin($queue(ack_wait))
                as ::std::pin::Pin<
                    Box<
                        dyn ::std::future::Future<
                                Output = Option<$crate::testkit::queue::TestQueue>,
                            > + Send,
                    >,
                >
        }) as $crate::testkit::engine::QueueMaker)
    };
}

/// Generates one `#[tokio::test]` per store scenario ([`store`]), each on a
/// fresh store from `$make` (an `async fn() -> TestStore`).
#[macro_export]
macro_rules! store_suite {
    ($make:path) => {
        $crate::store_suite!(@tests $make;
            history_records_each_failed_attempt,
            emit_stores_the_event_as_given,
            a_delay_counts_from_the_store_clock,
            emitting_the_same_id_twice_reports_existing,
            idempotency_key_names_one_event_until_purged,
            a_retried_emit_after_its_event_finished_returns_it_within_the_window,
            purge_keys_goes_oldest_first_up_to_the_limit_and_keeps_live_events_keys,
            claim_takes_the_lease_and_increments_attempt,
            each_claimed_event_takes_its_own_token,
            claim_ignores_missing_ids_and_finished_events,
            claim_skips_an_event_that_is_not_due,
            claim_skips_a_paused_event,
            claim_checks_rules_row_by_row_across_handlers,
            claim_holds_a_paused_event_whatever_tenants_it_is_told,
            claim_skips_a_blocked_event,
            claim_skips_a_live_lease,
            claim_takes_an_expired_lease,
            claim_skips_an_event_with_no_attempts_left,
            claim_skips_a_handler_the_worker_does_not_have,
            claim_of_a_batch_returns_only_the_claimable,
            claims_of_one_or_a_few_ids_agree_with_the_batch,
            claim_takes_exactly_what_admit_would_claim,
            claim_and_admit_agree_on_a_full_limit,
            sixteen_concurrent_claims_of_one_event_have_one_winner,
            inspect_loads_events_and_their_rules,
            settle_delete_archive_and_bury,
            release_arithmetic,
            release_and_revive_count_as_notifications,
            a_stale_token_can_neither_settle_nor_renew,
            an_expired_lease_stays_valid_until_another_claim,
            settle_without_a_token_fences_on_no_lease,
            renew_extends_held_leases_only,
            a_limit_per_key_admits_that_many_and_parks_the_rest,
            a_handler_limit_counts_every_tenant_and_a_tenant_limit_each,
            a_lapsed_lease_frees_its_slot_and_a_renewal_keeps_it,
            raising_or_removing_a_limit_wakes_its_waiters,
            limits_are_set_listed_and_synced,
            a_rate_gives_each_start_its_turn,
            a_rate_s_burst_starts_at_once,
            a_singleton_keeps_the_waiting_event,
            a_singleton_replaces_the_waiting_event,
            rules_add_remove_and_list,
            renotify_pages_through_2500_events_without_duplicates_or_gaps,
            sweep_pages_through_due_events_and_skips_held_ones,
            a_sweep_pass_with_no_quiet_returns_each_due_event_once_and_ends,
            events_parked_under_a_rule_that_is_gone_are_swept_again,
            held_events_do_not_starve_the_sweep,
            lead_and_resign_with_two_holders,
            purge_deletes_old_dead_and_done_events_up_to_the_limit,
            purge_leaves_idempotency_keys_alone,
            revive_moves_a_dead_event_back_to_pending,
            delete_refuses_only_a_running_event,
            list_filters_and_pages_by_id,
            counts_by_tenant_handler_and_state,
            counts_tell_waiting_running_delayed_held_dead_and_done_apart,
            counts_beyond_the_cap_are_estimated_and_add_up,
            subscriptions_add_remove_list_and_merge_every_tenant,
            syncing_the_config_replaces_its_subscriptions_and_keeps_the_api_s,
            a_topic_emit_stores_one_event_per_subscriber,
            schedules_put_get_list_pause_and_delete,
            due_schedules_are_unpaused_and_judged_by_the_store_clock,
            two_concurrent_fires_of_one_cursor_have_one_winner,
            a_cursor_far_in_the_past_follows_the_missed_policy,
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                // A fixture may return `None`: its service is unreachable and
                // it said so (a skip, outside CI).
                let Some(fixture) = $crate::testkit::Fixture::into_store($make().await) else {
                    return;
                };
                $crate::testkit::store::$name(fixture.store.clone()).await;
                drop(fixture);
            }
        )*
    };
}

/// Generates one `#[tokio::test]` per queue scenario ([`queue`]), each on a
/// fresh queue from `$make` (an `async fn()` returning a
/// [`queue::QueueFixture`]: a [`queue::TestQueue`] with the ack wait at
/// [`queue::ACK_WAIT`], or `Option<TestQueue>` for a service that may be absent).
#[macro_export]
macro_rules! queue_suite {
    ($make:path) => {
        $crate::queue_suite!(@tests $make;
            delivers_what_is_published,
            delivers_a_notification_of_many_events_whole,
            ack_removes,
            nack_with_delay_waits,
            delayed_publish_waits,
            unacked_comes_back_after_the_deadline,
            extend_holds_past_the_first_deadline,
            duplicate_publishes_are_deduplicated,
            terminated_garbage_is_not_redelivered,
            close_wakes_receivers,
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                // A fixture may return `None`: its service is unreachable and
                // it said so (a skip, outside CI).
                let Some(fixture) = $crate::testkit::queue::QueueFixture::into_queue($make().await) else {
                    return;
                };
                $crate::testkit::queue::$name(fixture).await;
            }
        )*
    };
}

/// The leases of `ids` under one `token`: what a test claims with (a
/// worker gives each event a token of its own).
pub fn leases(
    ids: &[crate::model::EventId],
    token: crate::model::LeaseToken,
) -> Vec<crate::backend::LeaseRef> {
    ids.iter()
        .map(|&id| crate::backend::LeaseRef { id, token })
        .collect()
}
