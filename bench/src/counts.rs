//! What the dashboard's and `herald stats`' counts cost on a big store:
//! `Store::counts` (exact totals per state from the index, the pending
//! split read up to `exact_up_to` events per handler, then estimated)
//! against the same call made exact, and against the whole-table
//! `GROUP BY` that `counts` was before.
//!
//! `cargo run --release -p herald-bench --bin counts -- --events 1000000`
//! (SQLite in a temporary directory), or with
//! `--store postgres://postgres@127.0.0.1/test` (a scratch schema,
//! dropped before and after), or `bench/counts.sh` for both.
//!
//! The events: `--tenants` × `--handlers` pairs; per pair, 70% due now,
//! 30% delayed by an hour; every fifth handler paused for the first
//! tenant. Each query runs `--repeat` times after one warm-up run; the
//! median is printed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use herald::{CountsQuery, EventId, Millis, NewEvent, Rule, RuleKind, RunAt, Store};
use herald_postgres::PgStore;
use herald_sqlite::SqliteStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

#[derive(Parser)]
struct Args {
    /// Events stored before counting.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Tenants.
    #[arg(long, default_value_t = 5)]
    tenants: usize,
    /// Handlers per tenant.
    #[arg(long, default_value_t = 10)]
    handlers: usize,
    /// Runs of each query (after one warm-up).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// `sqlite` (a file in a temporary directory under --dir) or a
    /// `postgres://` URL.
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// Directory for the SQLite file.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// PostgreSQL: the scratch schema (dropped before and after).
    #[arg(long, default_value = "herald_counts")]
    schema: String,
}

/// The whole-table count `Store::counts` was before: one GROUP BY.
const OLD_GROUP_BY: &str =
    "SELECT tenant, handler, state, count(*) FROM {s}events GROUP BY tenant, handler, state";

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

async fn time<F, Fut>(repeat: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await;
    let mut ms = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let start = Instant::now();
        f().await;
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    median(ms)
}

async fn fill(store: &dyn Store, args: &Args) {
    let now = Millis::now();
    let pairs: Vec<(String, String)> = (0..args.tenants)
        .flat_map(|t| {
            (0..args.handlers).map(move |h| (format!("tenant{t}"), format!("handler{h}")))
        })
        .collect();
    let start = Instant::now();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..args.events {
        let (tenant, handler) = &pairs[i % pairs.len()];
        batch.push(NewEvent {
            singleton: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: tenant.clone(),
            handler: handler.clone(),
            payload: "{}".into(),
            run_at: RunAt::At(if i % 10 < 7 {
                now
            } else {
                now.plus(Duration::from_secs(3600))
            }),
            max_attempts: 10,
            idempotency_key: None,
            topic: None,
        });
        if batch.len() == batch.capacity() || i + 1 == args.events {
            store.emit(&batch).await.expect("emit");
            batch.clear();
        }
    }
    for h in (0..args.handlers).step_by(5) {
        store
            .add_rule(&Rule {
                tenant: "tenant0".into(),
                handler: format!("handler{h}"),
                kind: RuleKind::Pause,
            })
            .await
            .expect("pause");
    }
    println!(
        "stored {} events over {} handlers in {:.1}s",
        args.events,
        pairs.len(),
        start.elapsed().as_secs_f64()
    );
}

async fn report(store: &dyn Store, args: &Args, old: impl AsyncFnMut()) {
    let capped = time(args.repeat, || async {
        store.counts(&CountsQuery::all()).await.expect("counts");
    })
    .await;
    let rows = store.counts(&CountsQuery::all()).await.expect("counts");
    let estimated = rows.iter().filter(|r| r.estimated).count();
    let exact = time(args.repeat, || async {
        store
            .counts(
                &CountsQuery::all()
                    .exact_up_to(u64::MAX)
                    .split_up_to(u64::MAX),
            )
            .await
            .expect("counts");
    })
    .await;
    let tenant = time(args.repeat, || async {
        store
            .counts(&CountsQuery::all().tenant("tenant1"))
            .await
            .expect("counts");
    })
    .await;
    let mut old = old;
    let group_by = {
        old().await;
        let mut ms = Vec::new();
        for _ in 0..args.repeat {
            let start = Instant::now();
            old().await;
            ms.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        median(ms)
    };
    println!(
        "counts store={} events={} pairs={} counts_ms={capped:.1} (exact_up_to {}, {estimated} of {} rows estimated) \
         one_tenant_ms={tenant:.1} exact_ms={exact:.1} old_group_by_ms={group_by:.1}",
        if args.store == "sqlite" { "sqlite" } else { "postgres" },
        args.events,
        args.tenants * args.handlers,
        CountsQuery::DEFAULT_EXACT_UP_TO,
        rows.len(),
    );
}

#[tokio::main]
async fn main() {
    herald_bench::init_logs();
    let args = Args::parse();
    if args.store == "sqlite" {
        let dir = tempfile::tempdir_in(&args.dir).expect("a temporary directory");
        let path = dir.path().join("counts.db");
        let store = Arc::new(SqliteStore::open(&path).expect("open SQLite"));
        fill(store.as_ref(), &args).await;
        let old = async || {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                let conn = rusqlite::Connection::open(&path).expect("open SQLite");
                let mut st = conn
                    .prepare(&OLD_GROUP_BY.replace("{s}", ""))
                    .expect("prepare");
                let n = st.query_map([], |_| Ok(())).expect("query").count();
                assert!(n > 0);
            })
            .await
            .expect("the query thread");
        };
        report(store.as_ref(), &args, old).await;
    } else {
        let options: PgConnectOptions = args.store.parse().expect("a postgres:// URL");
        let schema = format!("\"{}\"", args.schema.replace('"', "\"\""));
        let drop = || async {
            let mut c = PgConnection::connect_with(&options).await.expect("connect");
            c.execute(format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str())
                .await
                .expect("drop the scratch schema");
        };
        drop().await;
        herald_postgres::migrate(&args.store, &args.schema)
            .await
            .expect("migrate");
        let store = PgStore::connect_with(
            PgPoolOptions::new().max_connections(4),
            options.clone(),
            &args.schema,
        )
        .await
        .expect("connect the store");
        fill(&store, &args).await;
        let mut c = PgConnection::connect_with(&options).await.expect("connect");
        c.execute(format!("VACUUM ANALYZE {schema}.events").as_str())
            .await
            .expect("vacuum analyze");
        let sql = OLD_GROUP_BY.replace("{s}", &format!("{schema}."));
        let c = tokio::sync::Mutex::new(c);
        let old = async || {
            let mut c = c.lock().await;
            let rows = c.fetch_all(sql.as_str()).await.expect("group by");
            assert!(!rows.is_empty());
        };
        report(&store, &args, old).await;
        store.pool().close().await;
        drop().await;
    }
}
