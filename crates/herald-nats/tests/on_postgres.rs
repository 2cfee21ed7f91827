//! herald on PostgreSQL and NATS JetStream together, through the real
//! worker runtime: a pause holding 100,000 events, delays and retries longer
//! than the lease (the consumer's AckWait), and a NATS restart under a
//! running worker.
//!
//! Each test has a fresh PostgreSQL schema, and a fresh stream on the
//! shared NATS server or a nats-server of its own. When a service is
//! unreachable the test is skipped, or with `CI=true` it fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer;
use herald::backend::{EventStore, Operator};
use herald::testkit::{stored, Ledger};
use herald::{
    Client, Context, EmitOptions, EmitRequest, EventId, HandlerError, Worker, WorkerConfig,
};
use herald_nats::testing::{fresh_stream, test_name, unreachable, OwnServer};
use herald_nats::{NatsConfig, NatsQueue};
use herald_postgres::testing::{connect_options, fresh_schema};
use herald_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;

const T: &str = "acme";
const H: &str = "record";

/// How often the reconciler sweeps in these tests.
const SWEEP_EVERY: Duration = Duration::from_millis(200);

fn config(lease: Duration) -> WorkerConfig {
    WorkerConfig {
        concurrency: 64,
        lease,
        sweep_every: SWEEP_EVERY,
        sweep_quiet: Duration::from_secs(1),
        ..WorkerConfig::default()
    }
}

/// A store on `store`'s schema with a connection pool of its own, as
/// another process would have.
async fn another_store(store: &PgStore) -> Arc<PgStore> {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(connect_options())
        .await
        .expect("connect to PostgreSQL");
    Arc::new(
        PgStore::from_pool(pool, store.schema())
            .await
            .expect("the test schema"),
    )
}

/// A queue on `queue`'s stream and consumer with a connection of its own,
/// as another process would have.
async fn another_queue(queue: &NatsQueue) -> Arc<NatsQueue> {
    Arc::new(
        NatsQueue::connect(queue.config().clone())
            .await
            .expect("connect to NATS"),
    )
}

/// A worker whose `record` handler notes each run in `ledger` and succeeds.
fn recording_worker(
    store: Arc<PgStore>,
    queue: Arc<NatsQueue>,
    config: WorkerConfig,
    ledger: &Ledger,
) -> Worker {
    let ledger = ledger.clone();
    Worker::builder(store, queue)
        .config(config)
        .handler(H, move |_: serde_json::Value, cx: Context| {
            ledger.record(cx.event_id, cx.attempt);
            async {}
        })
        .start()
}

fn requests(n: usize, handler: &str, payload: &str) -> Vec<EmitRequest> {
    (0..n)
        .map(|_| EmitRequest {
            tenant: T.into(),
            handler: handler.into(),
            payload: payload.into(),
            options: EmitOptions::default(),
        })
        .collect()
}

/// What the stream and its consumer have seen: any notification published
/// or delivered moves one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Traffic {
    messages: u64,
    last_sequence: u64,
    delivered_stream: u64,
    delivered_consumer: u64,
    ack_floor_stream: u64,
    num_pending: u64,
    num_ack_pending: usize,
}

async fn traffic(queue: &NatsQueue) -> Traffic {
    let config = queue.config();
    let mut stream = queue
        .jetstream()
        .get_stream(&config.stream)
        .await
        .expect("the stream");
    let state = stream.info().await.expect("stream info").state.clone();
    let mut consumer: consumer::Consumer<consumer::pull::Config> = stream
        .get_consumer(&config.consumer)
        .await
        .expect("the consumer");
    let info = consumer.info().await.expect("consumer info");
    Traffic {
        messages: state.messages,
        last_sequence: state.last_sequence,
        delivered_stream: info.delivered.stream_sequence,
        delivered_consumer: info.delivered.consumer_sequence,
        ack_floor_stream: info.ack_floor.stream_sequence,
        num_pending: info.num_pending,
        num_ack_pending: info.num_ack_pending,
    }
}

/// Events as the sweep left them, read straight from the table: `parked`
/// are those the sweep set aside under a rule (`notified_at` at the parked
/// mark, see docs/adr/0005), `untouched` those never claimed (pending,
/// attempt 0, no lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    total: i64,
    parked: i64,
    untouched: i64,
}

async fn held(store: &PgStore) -> Held {
    let (total, parked, untouched): (i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*), \
                count(*) FILTER (WHERE notified_at = 9223372036854775807), \
                count(*) FILTER (WHERE state = 0 AND attempt = 0 AND lease_expires_at IS NULL) \
         FROM \"{}\".events",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .expect("count events");
    Held {
        total,
        parked,
        untouched,
    }
}

/// The reconciler's leader row: its expiry moves forward at every pass.
async fn reconciler_lease(store: &PgStore) -> Option<i64> {
    sqlx::query_scalar(&format!(
        "SELECT expires_at FROM \"{}\".leaders WHERE role = 'reconciler'",
        store.schema()
    ))
    .fetch_optional(store.pool())
    .await
    .expect("read the leader row")
}

/// Polls `progress` every 100 ms until it says done; after `within`, panics
/// with `what` and the last progress report.
async fn wait_for<F, Fut>(what: &str, within: Duration, mut progress: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (bool, String)>,
{
    let start = Instant::now();
    loop {
        let (done, report) = progress().await;
        if done {
            return;
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}: {report}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const EVENTS: usize = 100_000;

/// 100,000 events of a paused handler, two workers (each with its own
/// PostgreSQL pool and NATS connection, as two processes would have), and a
/// reconciler that sweeps every 200 ms with a quiet period of 1 s.
///
/// Emitting publishes notifications even though the handler is paused (up
/// to 64 events each, the default `MessageLimits`): the emit
/// does not look at rules. That traffic is expected: each notification is
/// delivered once, a worker drops its events at PauseCheck (ack), and the
/// sweep later parks the events. Once that has settled, a paused
/// handler causes no notification traffic at all: over ten reconciler
/// passes no message is published and none is delivered, and no event is
/// claimed.
///
/// Unpause then re-notifies the events, and each runs exactly once. The
/// unpause is not alone in re-notifying them: as soon as the rule is gone,
/// the reconciler un-parks the events of the handler (its cover for a crash
/// in the middle of an unpause) and notifies them too, and workers run and
/// delete them while the unpause pages. So `Release::notified` counts the
/// events the unpause reached before they ran, which can be fewer than
/// 100,000 (41,000 to 49,000 when its publishes were slow); every
/// notification published after the unpause began is the unpause's or the
/// reconciler's, and together they cover every event. (With a quiet period
/// of 1 s, the reconciler also re-notifies each event that still waits in
/// the stream 1 s after its last notification: the workers drop those
/// duplicates.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_handler_with_100k_events_causes_no_notification_traffic_then_unpause_runs_all() {
    let test = test_name();
    let lease = Duration::from_secs(10);
    let Some((store, _schema)) = fresh_schema(&test).await else {
        return;
    };
    let Some((queue, _stream)) = fresh_stream(&test, lease).await else {
        return;
    };
    let (store, queue) = (Arc::new(store), Arc::new(queue));
    let client = Client::new(store.clone(), queue.clone());
    let ledger = Ledger::default();
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(recording_worker(
            another_store(&store).await,
            another_queue(&queue).await,
            // Claims of up to a whole batch (512): with 64 the backlog drains
            // so slowly that the 1 s quiet period re-notifies it again and
            // again (380,000 duplicates and 210 s under load).
            WorkerConfig {
                concurrency: 512,
                ..config(lease)
            },
            &ledger,
        ));
    }
    let reconciled = |workers: &[Worker]| workers.iter().map(|w| w.stats().reconciled).sum::<u64>();
    let started = Instant::now();
    assert!(client.pause(T, H).await.unwrap());

    // Emit in batches of 1,000, four emitters at once.
    let emitters: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..EVENTS / 4 / 1000 {
                    client
                        .emit_batch(requests(1000, H, "{}"))
                        .await
                        .expect("emit");
                }
            })
        })
        .collect();
    for e in emitters {
        e.await.unwrap();
    }
    let emitted_in = started.elapsed();
    eprintln!("emitted {EVENTS} in {emitted_in:?}");

    // Every emit notification delivered and acked, and every event parked.
    wait_for("every event to be parked", Duration::from_secs(300), || {
        let (queue, store) = (queue.clone(), store.clone());
        async move {
            let t = traffic(&queue).await;
            let h = held(&store).await;
            let done = t.num_pending == 0 && t.num_ack_pending == 0 && h.parked == EVENTS as i64;
            (done, format!("{t:?}, {h:?}"))
        }
    })
    .await;
    let parked_in = started.elapsed() - emitted_in;
    eprintln!("all parked {parked_in:?} later");
    let before = traffic(&queue).await;
    // The emits' notifications and nothing else: the sweep published none.
    // Each batch of 1,000 makes at most 16 messages of up to 64 events, fewer
    // when the linger groups batches emitted at the same moment.
    let ids = herald::MessageLimits::default().ids;
    let (least, most) = (
        EVENTS.div_ceil(ids) as u64,
        (EVENTS / 1000 * 1000usize.div_ceil(ids)) as u64,
    );
    let messages = before.last_sequence;
    assert!(
        (least..=most).contains(&messages),
        "{messages} messages for {EVENTS} events: {before:?}"
    );
    assert_eq!(
        before,
        Traffic {
            messages: 0,
            last_sequence: messages,
            delivered_stream: messages,
            delivered_consumer: before.delivered_consumer,
            ack_floor_stream: messages,
            num_pending: 0,
            num_ack_pending: 0,
        }
    );
    let lease_before = reconciler_lease(&store).await.expect("a reconciler leads");

    // Ten reconciler passes, at least.
    tokio::time::sleep(SWEEP_EVERY * 10).await;

    let after = traffic(&queue).await;
    assert_eq!(
        after, before,
        "notifications were published or delivered while the handler was paused"
    );
    let lease_after = reconciler_lease(&store).await.expect("a reconciler leads");
    assert!(
        lease_after >= lease_before + (SWEEP_EVERY * 5).as_millis() as i64,
        "the reconciler did not run during the paused window ({lease_before} -> {lease_after})"
    );
    assert_eq!(
        held(&store).await,
        Held {
            total: EVENTS as i64,
            parked: EVENTS as i64,
            untouched: EVENTS as i64,
        },
        "a paused event was claimed or unparked"
    );
    assert_eq!(ledger.total(), 0, "a paused handler ran");
    for w in &workers {
        let s = w.stats();
        assert_eq!((s.claimed, s.reconciled), (0, 0), "{s:?}");
    }
    let dropped: u64 = workers.iter().map(|w| w.stats().dropped).sum();
    assert!(
        dropped >= EVENTS as u64,
        "only {dropped} notifications dropped"
    );

    let unpaused = Instant::now();
    let release = client.unpause(T, H).await.unwrap();
    let renotified_in = unpaused.elapsed();
    assert!(release.removed);
    assert!(release.notified <= EVENTS as u64, "{release:?}");
    eprintln!(
        "unpause re-notified {} in {renotified_in:?}; the reconciler {} so far",
        release.notified,
        reconciled(&workers)
    );
    wait_for("every event to run", Duration::from_secs(300), || {
        let ledger = ledger.clone();
        async move {
            let (total, distinct) = (ledger.total(), ledger.distinct());
            (
                total >= EVENTS,
                format!("{total} runs of {distinct} distinct events, of {EVENTS}"),
            )
        }
    })
    .await;
    let ran_in = unpaused.elapsed();
    eprintln!("all ran {ran_in:?} after the unpause began");
    // Deletes land just after the last run starts.
    wait_for("every event to be deleted", Duration::from_secs(60), || {
        let store = store.clone();
        async move {
            let n = stored(store.as_ref()).await;
            (n == 0, format!("{n} events still stored"))
        }
    })
    .await;
    // The notifications left (duplicates of events that ran) are dropped.
    wait_for("the stream to drain", Duration::from_secs(120), || {
        let queue = queue.clone();
        async move {
            let t = traffic(&queue).await;
            (
                t.messages == 0 && t.num_ack_pending == 0 && t.num_pending == 0,
                format!("{t:?}"),
            )
        }
    })
    .await;
    // Several passes and redelivery chances for anything that would run twice.
    tokio::time::sleep(SWEEP_EVERY * 10).await;
    assert_eq!(ledger.total(), EVENTS, "runs");
    assert_eq!(ledger.distinct(), EVENTS, "distinct events that ran");
    assert_eq!(stored(store.as_ref()).await, 0);
    let done: u64 = workers.iter().map(|w| w.stats().done).sum();
    assert_eq!(done, EVENTS as u64);
    // The notifications since the unpause began are the unpause's and the
    // reconciler's (and the workers' requeues of events they found under a
    // live lease), grouped up to 64 events each: between them they reached
    // every event, in far fewer messages than events.
    let end = traffic(&queue).await;
    let published = end.last_sequence - before.last_sequence;
    let notified = release.notified + reconciled(&workers);
    let ids = herald::MessageLimits::default().ids as u64;
    assert!(
        published * ids >= notified && notified >= EVENTS as u64,
        "{published} messages cannot carry {notified} notified events: {end:?}"
    );
    assert!(
        published * 10 < notified,
        "{published} messages for {notified} notified events: not grouped"
    );
    for w in workers {
        w.shutdown(Duration::from_secs(10)).await;
    }
    eprintln!(
        "{published} messages after the unpause, for {notified} notified events ({} by the \
         unpause, the rest by the reconciler); total {:?}",
        release.notified,
        started.elapsed()
    );
}

/// The runs of one event: its attempt number and start, in order.
type RunsOf = Vec<(u32, Instant)>;

/// When each run of each event started.
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<HashMap<EventId, RunsOf>>>);

impl Starts {
    fn record(&self, cx: &Context) -> usize {
        let mut runs = self.0.lock().unwrap();
        let of = runs.entry(cx.event_id).or_default();
        of.push((cx.attempt, Instant::now()));
        of.len()
    }

    fn of(&self, id: EventId) -> RunsOf {
        self.0.lock().unwrap().get(&id).cloned().unwrap_or_default()
    }

    fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

/// An event delayed by 4 s on a consumer whose AckWait (the lease) is 1 s:
/// it does not run before its delay, it runs once, and nothing else fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_longer_than_the_ack_wait_runs_once_after_its_delay() {
    let test = test_name();
    let lease = Duration::from_secs(1);
    let delay = Duration::from_secs(4);
    let Some((store, _schema)) = fresh_schema(&test).await else {
        return;
    };
    let Some((queue, _stream)) = fresh_stream(&test, lease).await else {
        return;
    };
    let (store, queue) = (Arc::new(store), Arc::new(queue));
    let starts = Starts::default();
    let worker = Worker::builder(store.clone(), queue.clone())
        .config(config(lease))
        .handler(H, {
            let starts = starts.clone();
            move |_: serde_json::Value, cx: Context| {
                starts.record(&cx);
                async {}
            }
        })
        .start();
    let client = Client::new(store.clone(), queue.clone());
    let emitted = Instant::now();
    let id = client
        .emit_json(T, H, "{}", EmitOptions::default().delay(delay))
        .await
        .unwrap()
        .id();
    wait_for("the delayed event to run", delay * 4, || {
        let starts = starts.clone();
        async move { (!starts.of(id).is_empty(), "it has not run".to_string()) }
    })
    .await;
    let ran = starts.of(id);
    let waited = ran[0].1 - emitted;
    // run_at is emit time + delay in whole ms, so up to 1 ms earlier.
    assert!(
        waited >= delay - Duration::from_millis(2),
        "it ran {waited:?} after the emit, before its delay of {delay:?}"
    );
    // Three AckWaits: time for any redelivery or re-notify to run it again.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(starts.total(), 1, "runs: {:?}", starts.of(id));
    assert_eq!(stored(store.as_ref()).await, 0);
    let s = worker.stats();
    assert_eq!((s.claimed, s.done), (1, 1), "{s:?}");
    let t = traffic(&queue).await;
    assert_eq!((t.messages, t.num_ack_pending), (0, 0), "{t:?}");
    worker.shutdown(Duration::from_secs(5)).await;
}

/// With a lease (AckWait) of 1 s, a handler that asks to be retried after
/// 3 s and one that snoozes for 3 s: each runs again once, no earlier than
/// asked, and then no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_or_snooze_longer_than_the_ack_wait_runs_again_once_after_it() {
    let test = test_name();
    let lease = Duration::from_secs(1);
    let wait = Duration::from_secs(3);
    let Some((store, _schema)) = fresh_schema(&test).await else {
        return;
    };
    let Some((queue, _stream)) = fresh_stream(&test, lease).await else {
        return;
    };
    let (store, queue) = (Arc::new(store), Arc::new(queue));
    let starts = Starts::default();
    let worker = Worker::builder(store.clone(), queue.clone())
        .config(config(lease))
        .handler("retry_later", {
            let starts = starts.clone();
            move |_: serde_json::Value, cx: Context| {
                let first = starts.record(&cx) == 1;
                async move {
                    if first {
                        return Err(HandlerError::retry_after("not yet", wait));
                    }
                    Ok(())
                }
            }
        })
        .handler("snooze", {
            let starts = starts.clone();
            move |_: serde_json::Value, cx: Context| {
                let first = starts.record(&cx) == 1;
                async move {
                    if first {
                        return Err(HandlerError::snooze(wait));
                    }
                    Ok(())
                }
            }
        })
        .start();
    let client = Client::new(store.clone(), queue.clone());
    let retried = client
        .emit_json(T, "retry_later", "{}", EmitOptions::default())
        .await
        .unwrap()
        .id();
    let snoozed = client
        .emit_json(T, "snooze", "{}", EmitOptions::default())
        .await
        .unwrap()
        .id();
    wait_for("both to run twice", wait * 4, || {
        let starts = starts.clone();
        async move {
            let (r, s) = (starts.of(retried).len(), starts.of(snoozed).len());
            (
                r >= 2 && s >= 2,
                format!("retry_later ran {r} times, snooze {s} times"),
            )
        }
    })
    .await;
    wait_for("both to be deleted", Duration::from_secs(10), || {
        let store = store.clone();
        async move {
            let n = stored(store.as_ref()).await;
            (n == 0, format!("{n} events still stored"))
        }
    })
    .await;
    tokio::time::sleep(lease * 3).await;
    for (id, attempts) in [(retried, [1, 2]), (snoozed, [1, 1])] {
        let runs = starts.of(id);
        assert_eq!(
            runs.iter().map(|r| r.0).collect::<Vec<_>>(),
            attempts,
            "attempts of {id}"
        );
        let gap = runs[1].1 - runs[0].1;
        assert!(gap >= wait, "{id} ran again after {gap:?}, before {wait:?}");
    }
    let s = worker.stats();
    assert_eq!(
        (s.claimed, s.done, s.retried, s.snoozed),
        (4, 2, 1, 1),
        "{s:?}"
    );
    worker.shutdown(Duration::from_secs(5)).await;
}

/// A worker on PostgreSQL and a nats-server of the test's own, which is
/// killed and restarted: events emitted before, during and after the
/// outage each run to completion, exactly once. One handler runs through
/// the whole outage (its lease must be kept: PostgreSQL stays up).
///
/// An emit during the outage stores its events, fails to publish their
/// notifications (each publish waits for its ack, and retries), and
/// returns. Those events run once NATS is back: the reconciler re-notifies
/// them, unless the publishes async-nats kept queued while disconnected
/// reach the restarted server first. Events stored during the outage by an
/// application that never notifies them (it died between its commit and
/// its notify) have only the reconciler: they run too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_runs_once_across_a_nats_restart() {
    let test = test_name();
    let lease = Duration::from_secs(2);
    let Some((store, _schema)) = fresh_schema(&test).await else {
        return;
    };
    let store = Arc::new(store);
    let mut server = match OwnServer::start().await {
        Ok(s) => s,
        Err(e) => {
            unreachable(&test, "a nats-server of its own", &e);
            return;
        }
    };
    let nats = NatsConfig::new(server.url(), "herald", lease);
    // The application and the worker, each with a connection of its own.
    let client_queue = Arc::new(NatsQueue::connect(nats.clone()).await.unwrap());
    let worker_queue = Arc::new(NatsQueue::connect(nats).await.unwrap());
    let client = Client::new(store.clone(), client_queue);
    let (started, finished) = (Ledger::default(), Ledger::default());
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let worker = Worker::builder(another_store(&store).await, worker_queue)
        .config(config(lease))
        .handler(H, {
            let (started, finished) = (started.clone(), finished.clone());
            move |p: serde_json::Value, cx: Context| {
                started.record(cx.event_id, cx.attempt);
                let hold = p["hold"].as_bool().unwrap_or(false);
                let (finished, mut gate) = (finished.clone(), gate_rx.clone());
                async move {
                    if hold {
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    finished.record(cx.event_id, cx.attempt);
                }
            }
        })
        .start();
    let mut ids = Vec::new();
    let emit = |batch: Vec<EmitRequest>| {
        let client = client.clone();
        async move {
            client
                .emit_batch(batch)
                .await
                .expect("emit")
                .iter()
                .map(|e| e.id())
                .collect::<Vec<_>>()
        }
    };

    // Before: some run; one is held running; some are delayed past the
    // restart; some are emitted just before the kill.
    ids.extend(emit(requests(20, H, "{}")).await);
    let all_finished = |n: usize| {
        let finished = finished.clone();
        move || {
            let finished = finished.clone();
            async move {
                let d = finished.distinct();
                (d >= n, format!("{d} of {n} events finished"))
            }
        }
    };
    wait_for(
        "the first events",
        Duration::from_secs(30),
        all_finished(20),
    )
    .await;
    let held = emit(requests(1, H, r#"{"hold": true}"#)).await;
    ids.extend(&held);
    wait_for("the held event to start", Duration::from_secs(30), || {
        let started = started.clone();
        let id = held[0];
        async move { (started.runs_of(id) == 1, "not started".to_string()) }
    })
    .await;
    let delayed: Vec<EmitRequest> = requests(10, H, "{}")
        .into_iter()
        .map(|mut r| {
            r.options = EmitOptions::default().delay(Duration::from_secs(3));
            r
        })
        .collect();
    ids.extend(emit(delayed).await);
    ids.extend(emit(requests(10, H, "{}")).await);

    // During: NATS is down.
    server.stop();
    let down = Instant::now();
    let during = tokio::time::timeout(Duration::from_secs(60), emit(requests(20, H, "{}")))
        .await
        .expect("an emit while NATS is down returns (its publish fails)");
    let emit_took = down.elapsed();
    for id in &during {
        assert!(
            store.get(*id).await.unwrap().is_some() || finished.runs_of(*id) > 0,
            "an event emitted while NATS was down was not stored"
        );
    }
    ids.extend(during);
    let never_notified = client.prepare(requests(5, H, "{}")).unwrap();
    store.emit(&never_notified).await.unwrap();
    ids.extend(never_notified.iter().map(|e| e.id));
    server.restart().await.expect("restart nats-server");
    let outage = down.elapsed();

    // After: let a lost lease show (a second start) before the held run ends.
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    gate.send_replace(true);
    ids.extend(emit(requests(20, H, "{}")).await);

    let n = ids.len();
    wait_for(
        "every event to finish",
        Duration::from_secs(120),
        all_finished(n),
    )
    .await;
    wait_for("every event to be deleted", Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            let left = stored(store.as_ref()).await;
            (left == 0, format!("{left} events still stored"))
        }
    })
    .await;
    // Redeliveries and re-notifies that would run something twice.
    tokio::time::sleep(lease * 2).await;
    for id in &ids {
        assert_eq!(
            started.runs_of(*id),
            1,
            "event {id} started {:?}",
            started.attempts_of(*id)
        );
        assert_eq!(finished.runs_of(*id), 1, "event {id} finished twice");
    }
    assert_eq!((started.total(), finished.total()), (n, n));
    let s = worker.stats();
    assert_eq!(
        (s.claimed, s.done, s.lease_lost),
        (n as u64, n as u64, 0),
        "{s:?}"
    );
    assert!(
        s.reconciled >= never_notified.len() as u64,
        "the events stored without a notification were not notified by the reconciler: {s:?}"
    );
    worker.shutdown(Duration::from_secs(10)).await;
    eprintln!(
        "{n} events; NATS down for {outage:?}; the emit while it was down took {emit_took:?}"
    );
}

/// What an emit may take while NATS is down: the client's notify wait
/// (250 ms by default) and the store's write, with room for a loaded
/// machine; a publish retried against the absent broker takes seconds.
const PROMPT: Duration = Duration::from_secs(1);

/// Emits while the nats-server is down store their events and answer
/// within [`PROMPT`] (the client waits for the publish at most its notify
/// wait; the publish goes on, or fails, in the background); once the
/// server is back, every one of those events runs, exactly once (the
/// reconciler notifies those whose publish failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_while_nats_is_down_answer_promptly_and_their_events_run_after() {
    let test = test_name();
    let lease = Duration::from_secs(2);
    let Some((store, _schema)) = fresh_schema(&test).await else {
        return;
    };
    let store = Arc::new(store);
    let mut server = match OwnServer::start().await {
        Ok(s) => s,
        Err(e) => {
            unreachable(&test, "a nats-server of its own", &e);
            return;
        }
    };
    let nats = NatsConfig::new(server.url(), "herald", lease);
    let client_queue = Arc::new(NatsQueue::connect(nats.clone()).await.unwrap());
    let worker_queue = Arc::new(NatsQueue::connect(nats).await.unwrap());
    let client = Client::new(store.clone(), client_queue);
    let ledger = Ledger::default();
    let worker = recording_worker(
        another_store(&store).await,
        worker_queue,
        config(lease),
        &ledger,
    );
    let mut ids = Vec::new();
    for e in client.emit_batch(requests(5, H, "{}")).await.unwrap() {
        ids.push(e.id());
    }

    server.stop();
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        let t = Instant::now();
        let batch = requests(if i % 2 == 0 { 1 } else { 3 }, H, "{}");
        let emitted = client
            .emit_batch(batch)
            .await
            .expect("an emit while NATS is down stores its events");
        let took = t.elapsed();
        slowest = slowest.max(took);
        assert!(
            took <= PROMPT,
            "emit {i} while NATS was down took {took:?}, over {PROMPT:?}"
        );
        ids.extend(emitted.iter().map(|e| e.id()));
    }
    server.restart().await.expect("restart nats-server");

    let n = ids.len();
    wait_for("every event to run", Duration::from_secs(60), || {
        let ledger = ledger.clone();
        async move {
            let d = ledger.distinct();
            (d >= n, format!("{d} of {n} events ran"))
        }
    })
    .await;
    wait_for("every event to be deleted", Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            let left = stored(store.as_ref()).await;
            (left == 0, format!("{left} events still stored"))
        }
    })
    .await;
    for id in &ids {
        assert_eq!(ledger.runs_of(*id), 1, "event {id} ran more than once");
    }
    worker.shutdown(Duration::from_secs(10)).await;
    eprintln!("{n} events; the slowest emit while NATS was down took {slowest:?}");
}
