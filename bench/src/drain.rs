//! No-op drain: emit N events (not timed), then start a worker and time how
//! long it takes to run them all.
//!
//! The embedded default (an SQLite file in a temporary directory):
//!
//! `cargo run --release -p herald-bench --bin drain -- --events 200000`
//!
//! PostgreSQL, in a scratch schema that is dropped first and at the end
//! (`--schema`, default `herald_drain`):
//!
//! `cargo run --release -p herald-bench --bin drain -- --store postgres://postgres@127.0.0.1/test`
//!
//! Harder cases: `--paused N` first stores N events of a paused handler,
//! due earlier than the runnable ones (with the pause rule in place; stored
//! directly, as if their notifications were long gone); `--hold-tx` keeps
//! another connection in an open transaction for the whole drain, so that
//! vacuum can clean nothing. With `--pg-cpu PATH` (the `pg-cpu` tool) the
//! drain's own PostgreSQL CPU time is measured and printed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use herald::{
    Client, Context, EmitOptions, EmitRequest, EventId, MemoryQueue, Millis, NewEvent, Rule,
    RuleKind, RunAt, Store, Worker,
};
use herald_bench::cpu;
use herald_postgres::PgStore;
use herald_sqlite::SqliteStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

#[derive(Parser)]
struct Args {
    /// Events to drain.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Handlers running at once.
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
    /// Notifications claimed per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Bytes of padding in each payload (0: a tiny payload).
    #[arg(long, default_value_t = 0)]
    payload_bytes: usize,
    /// Directory for the SQLite database file (on disk; default: the current directory).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// The store: `sqlite` (a file in a temporary directory under --dir), or
    /// a `postgres://` URL.
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// PostgreSQL: the scratch schema (dropped before and after the run).
    #[arg(long, default_value = "herald_drain")]
    schema: String,
    /// PostgreSQL: keep the schema after the run (for EXPLAIN and statistics).
    #[arg(long)]
    keep: bool,
    /// PostgreSQL: connections in the store's pool.
    #[arg(long, default_value_t = 16)]
    pool: u32,
    /// First store this many events of a paused handler, due earlier than
    /// the runnable ones.
    #[arg(long, default_value_t = 0)]
    paused: usize,
    /// PostgreSQL: hold a transaction open on another connection for the
    /// whole drain, so that vacuum cannot clean.
    #[arg(long)]
    hold_tx: bool,
    /// PostgreSQL: set the events table's fillfactor before emitting.
    #[arg(long)]
    fillfactor: Option<u32>,
    /// PostgreSQL experiment: add an index on the lease expiry (which makes
    /// every claim a non-HOT update).
    #[arg(long)]
    lease_index: bool,
    /// PostgreSQL experiment: keep only this many of the ring's leaves
    /// (migration 5 makes 3; the others are detached and dropped before
    /// emitting), to see what each leaf costs every statement.
    #[arg(long)]
    ring_leaves: Option<u16>,
    /// The `pg-cpu` tool: measure PostgreSQL's CPU time during the drain.
    #[arg(long)]
    pg_cpu: Option<PathBuf>,
    /// PostgreSQL: reset pg_stat_statements before the drain and print, after
    /// it, each statement's calls per event (needs the extension loaded).
    #[arg(long)]
    statements: bool,
}

/// The statements on one schema in pg_stat_statements: `$1` a LIKE pattern
/// of the quoted schema name.
const STATEMENTS_SQL: &str = "SELECT calls, rows, total_exec_time, query \
     FROM pg_stat_statements WHERE query LIKE $1 ORDER BY calls DESC";

const PAUSED_TENANT: &str = "tenant-paused";
const PAUSED_HANDLER: &str = "paused";

struct Pg {
    options: PgConnectOptions,
    schema: String,
    keep: bool,
}

impl Pg {
    fn quoted(&self) -> String {
        format!("\"{}\"", self.schema.replace('"', "\"\""))
    }

    async fn admin(&self) -> PgConnection {
        PgConnection::connect_with(&self.options)
            .await
            .expect("connect to PostgreSQL")
    }

    async fn drop_schema(&self) {
        let mut c = self.admin().await;
        c.execute(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.quoted()).as_str())
            .await
            .expect("drop the scratch schema");
    }

    async fn exec(&self, sql: &str) {
        let mut c = self.admin().await;
        c.execute(sql.replace("{s}", &self.quoted()).as_str())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn reset_statements(&self) {
        let mut c = self.admin().await;
        c.execute("SELECT pg_stat_statements_reset()")
            .await
            .expect("pg_stat_statements_reset (is pg_stat_statements loaded and created?)");
    }

    /// Each statement on the scratch schema since the reset: calls per
    /// event, rows per call, and the server's execution time per event.
    async fn statements(&self, events: usize) -> String {
        let mut c = self.admin().await;
        let rows: Vec<(i64, i64, f64, String)> = sqlx::query_as(STATEMENTS_SQL)
            .bind(format!("%{}%", self.quoted()))
            .fetch_all(&mut c)
            .await
            .expect("read pg_stat_statements");
        let mut out = String::from("calls  calls/event  rows/call  exec_ms/1000ev  statement\n");
        let mut total = 0;
        for (calls, rows, ms, query) in rows {
            total += calls;
            let q: String = query
                .replace(&self.quoted(), "")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            out.push_str(&format!(
                "{calls:>6} {:>11.4} {:>10.1} {:>15.2}  {}\n",
                calls as f64 / events as f64,
                rows as f64 / calls.max(1) as f64,
                ms * 1000.0 / events as f64,
                &q[..q.len().min(110)]
            ));
        }
        out.push_str(&format!(
            "total: {total} statements, {:.4} per event\n",
            total as f64 / events as f64
        ));
        out
    }

    async fn stats(&self) -> String {
        let mut c = self.admin().await;
        let row: (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT sum(n_tup_upd)::int8, sum(n_tup_hot_upd)::int8, sum(n_tup_del)::int8, \
                    sum(n_dead_tup)::int8 \
             FROM pg_stat_user_tables WHERE relid IN \
               (SELECT relid FROM pg_partition_tree(format('%I.events', $1::text)::regclass))",
        )
        .bind(&self.schema)
        .fetch_one(&mut c)
        .await
        .expect("table statistics");
        format!(
            "updates={} hot_updates={} deletes={} dead_tuples={}",
            row.0, row.1, row.2, row.3
        )
    }
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    let mut _dir = None;
    let mut pg = None;
    let store: Arc<dyn Store> =
        if args.store.starts_with("postgres://") || args.store.starts_with("postgresql://") {
            let options: PgConnectOptions = args.store.parse().expect("a PostgreSQL URL");
            let p = Pg {
                options: options.clone(),
                schema: args.schema.clone(),
                keep: args.keep,
            };
            p.drop_schema().await;
            herald_postgres::migrate(&args.store, &args.schema)
                .await
                .expect("migrate the scratch schema");
            if let Some(ff) = args.fillfactor {
                p.exec(&format!("ALTER TABLE {{s}}.events SET (fillfactor = {ff})"))
                    .await;
            }
            if args.lease_index {
                p.exec(
                    "CREATE INDEX events_by_lease ON {s}.events (lease_expires_at, id) \
                 WHERE state = 0 AND lease_expires_at IS NOT NULL",
                )
                .await;
            }
            if let Some(keep) = args.ring_leaves {
                for leaf in (keep + 1)..=3 {
                    p.exec(&format!(
                        "DELETE FROM {{s}}.ring WHERE leaf = {leaf}; \
                         DELETE FROM {{s}}.ring_empty WHERE leaf = {leaf}; \
                         ALTER TABLE {{s}}.events DETACH PARTITION {{s}}.events_{leaf}; \
                         DROP TABLE {{s}}.events_{leaf}"
                    ))
                    .await;
                }
            }
            let store = PgStore::connect_with(
                PgPoolOptions::new().max_connections(args.pool),
                options,
                &args.schema,
            )
            .await
            .expect("connect the store");
            pg = Some(p);
            Arc::new(store)
        } else if args.store == "sqlite" {
            let dir = tempfile::tempdir_in(&args.dir).expect("a temporary directory");
            let store = SqliteStore::open(dir.path().join("drain.db")).expect("open the store");
            _dir = Some(dir);
            Arc::new(store)
        } else {
            panic!("--store must be `sqlite` or a postgres:// URL");
        };
    let queue = Arc::new(MemoryQueue::default());
    let client = Client::new(store.clone(), queue.clone());

    let t = Instant::now();
    if args.paused > 0 {
        store
            .add_rule(&Rule {
                tenant: PAUSED_TENANT.into(),
                handler: PAUSED_HANDLER.into(),
                kind: RuleKind::Pause,
            })
            .await
            .expect("pause");
        // Due an hour ago: in front of every runnable event in any queue
        // ordered by run_at. Stored directly: their notifications are long
        // gone (a paused event's notification is dropped by the worker).
        let run_at = RunAt::At(Millis::now().minus(Duration::from_secs(3600)));
        let mut left = args.paused;
        while left > 0 {
            let n = left.min(5000);
            let batch: Vec<NewEvent> = (0..n)
                .map(|i| NewEvent {
                    id: EventId::new(),
                    tenant: PAUSED_TENANT.into(),
                    handler: PAUSED_HANDLER.into(),
                    payload: format!(r#"{{"i":{i}}}"#),
                    run_at,
                    max_attempts: 10,
                    idempotency_key: None,
                    topic: None,
                })
                .collect();
            store.emit(&batch).await.expect("emit paused");
            left -= n;
        }
    }
    let pad = "x".repeat(args.payload_bytes);
    let requests: Vec<EmitRequest> = (0..args.events)
        .map(|i| EmitRequest {
            tenant: format!("tenant-{}", i % 16),
            handler: "noop".into(),
            payload: if pad.is_empty() {
                format!(r#"{{"i":{i}}}"#)
            } else {
                format!(r#"{{"i":{i},"pad":"{pad}"}}"#)
            },
            options: EmitOptions::default(),
        })
        .collect();
    for chunk in requests.chunks(5000) {
        client.emit_batch(chunk.to_vec()).await.expect("emit");
    }
    let emit_secs = t.elapsed().as_secs_f64();

    let mut held = None;
    if let Some(p) = &pg {
        // Start from a vacuumed, analyzed table: what the drain itself
        // leaves behind is then the drain's cost.
        p.exec("VACUUM (ANALYZE) {s}.events").await;
        if args.hold_tx {
            let mut c = p.admin().await;
            let xid: i64 = {
                c.execute("BEGIN").await.expect("begin");
                sqlx::query_scalar("SELECT txid_current()")
                    .fetch_one(&mut c)
                    .await
                    .expect("txid_current")
            };
            eprintln!("holding transaction {xid} open for the whole drain");
            held = Some(c);
        }
    } else if args.hold_tx {
        panic!("--hold-tx needs a PostgreSQL store");
    }

    if args.statements {
        pg.as_ref()
            .expect("--statements needs a PostgreSQL store")
            .reset_statements()
            .await;
    }
    let ticks_before = cpu::pg_ticks(args.pg_cpu.as_deref());
    let own_before = cpu::process_ticks("self");
    let t = Instant::now();
    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("noop", |_: serde_json::Value, _cx: Context| async {})
        .configure(|c| {
            c.concurrency = args.concurrency;
            c.batch = args.batch;
            // The drain measures the hot path only.
            c.reconcile = false;
        })
        .start();
    loop {
        let s = worker.stats();
        if s.done as usize >= args.events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let drain = t.elapsed().as_secs_f64();
    let ticks_after = cpu::pg_ticks(args.pg_cpu.as_deref());
    let own_after = cpu::process_ticks("self");
    let stats = worker.stats();
    worker.shutdown(Duration::from_secs(5)).await;
    if let Some(mut c) = held.take() {
        c.execute("ROLLBACK").await.expect("rollback");
    }
    let left: u64 = client
        .handler_counts(&herald::CountsQuery::totals())
        .await
        .expect("counts")
        .iter()
        .filter(|c| c.handler == "noop")
        .map(|c| c.total())
        .sum();
    assert_eq!(left, 0, "every event must be deleted after the drain");
    let pg_cpu = match cpu::ms_between(ticks_before, ticks_after) {
        Some(ms) => format!(
            " drain_pg_cpu_ms={ms} pg_cpu_ms_per_1000={:.1}",
            ms as f64 * 1000.0 / args.events as f64
        ),
        None => String::new(),
    };
    let own = match cpu::ms_between(own_before, own_after) {
        Some(ms) => {
            format!(
                " drain_process_cpu_ms={ms} process_cpu_ms_per_1000={:.1}",
                ms as f64 * 1000.0 / args.events as f64
            )
        }
        _ => String::new(),
    };
    println!(
        "drain store={} events={} paused={} hold_tx={} payload_bytes={} emit_s={:.2} emit_per_s={:.0} drain_s={:.3} events_per_s={:.0} claimed={} requeued={}{}{}",
        if pg.is_some() { "postgres" } else { "sqlite" },
        args.events,
        args.paused,
        args.hold_tx,
        args.payload_bytes,
        emit_secs,
        (args.events + args.paused) as f64 / emit_secs,
        drain,
        args.events as f64 / drain,
        stats.claimed,
        stats.requeued,
        pg_cpu,
        own,
    );
    if let Some(p) = &pg {
        println!("postgres events table: {}", p.stats().await);
        if args.statements {
            print!("{}", p.statements(args.events).await);
        }
        if !p.keep {
            p.drop_schema().await;
        }
    }
}
