//! The plans of the PostgreSQL store's statements on a million stored
//! events: `EXPLAIN (ANALYZE, BUFFERS)` of each hot statement (claim,
//! inspect, settle delete/release/bury, renew) and each sweep and re-notify
//! statement, as the store sends them (`PgStore::statements`), with generic
//! plans (what a prepared statement settles on after its first executions).
//! A statement that calls one of herald's functions (the hot ones,
//! `crates/herald-postgres/sql/`) is shown by the plan of the function's statement, under the
//! function's own planner settings, which is what runs. `--reltuples N`
//! first sets the table's and its indexes' `reltuples` to N (deliberately
//! wrong statistics; needs superuser).
//!
//! `bench/pg-explain.sh [URL]` runs it. Each statement runs inside a
//! transaction that is rolled back, so each sees the same data set:
//!
//! | events | what |
//! |---|---|
//! | 700,000 | pending, due, `noop` of 16 tenants, last notified 2 to 10 minutes ago |
//! | 150,000 | pending, due, of a paused handler, parked by the sweep |
//! | 50,000 | pending, due, of the paused handler, not parked yet |
//! | 50,000 | pending, due in an hour |
//! | 40,000 | dead |
//! | 5,000 | running under a live lease |
//! | 5,000 | whose worker died: lease expired, notified 10 s ago |

use std::collections::HashMap;

use clap::Parser;
use herald_postgres::PgStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, Row};

#[derive(Parser)]
struct Args {
    /// The database.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    store: String,
    /// The scratch schema (dropped first; kept afterwards with --keep).
    #[arg(long, default_value = "herald_explain")]
    schema: String,
    /// Keep the schema afterwards.
    #[arg(long)]
    keep: bool,
    /// Set `reltuples` of events and its indexes to this before planning
    /// (wrong statistics: 1, 1e9).
    #[arg(long)]
    reltuples: Option<f64>,
    /// Events in the batches (claim, inspect, settle, renew).
    #[arg(long, default_value_t = 512)]
    batch: usize,
}

/// The data set: one INSERT … SELECT per group. `{s}` is the schema,
/// `{now}` the load's clock in ms. Ids are UUIDv7-like (time first), in
/// emit order, as the client makes them.
const LOAD: &[&str] = &[
    // Due and waiting, last notified minutes ago (the sweep's quiet source).
    "INSERT INTO {s}.events (id, tenant, handler, payload, run_at, notified_at, max_attempts, created_at, updated_at)
     SELECT {id}, 'tenant-' || (i % 16), 'noop', '{\"i\":' || i || '}',
            {now} - 600000 + i * 480000 / 700000, {now} - 600000 + i * 480000 / 700000, 10, {now} - 600000, {now} - 600000
     FROM generate_series(1::bigint, 700000) AS g(i)",
    // A paused handler: parked by earlier sweeps, and not yet parked.
    "INSERT INTO {s}.events (id, tenant, handler, payload, run_at, notified_at, max_attempts, created_at, updated_at)
     SELECT {id}, 'tenant-paused', 'paused', '{\"i\":' || i || '}',
            {now} - 3600000, CASE WHEN i <= 1150000 THEN 9223372036854775807 ELSE {now} - 3600000 END,
            10, {now} - 3600000, {now} - 3600000
     FROM generate_series(1000001::bigint, 1200000) AS g(i)",
    "INSERT INTO {s}.rules (tenant, handler, kind, created_at) VALUES ('tenant-paused', 'paused', 'pause', {now})",
    "INSERT INTO {s}.parked (tenant, handler) VALUES ('tenant-paused', 'paused')",
    // Delayed an hour.
    "INSERT INTO {s}.events (id, tenant, handler, payload, run_at, notified_at, max_attempts, created_at, updated_at)
     SELECT {id}, 'tenant-' || (i % 16), 'noop', '{}', {now} + 3600000, {now} + 3600000, 10, {now}, {now}
     FROM generate_series(2000001::bigint, 2050000) AS g(i)",
    // Dead.
    "INSERT INTO {s}.events (id, tenant, handler, payload, state, run_at, notified_at, attempt, max_attempts, last_error, created_at, updated_at, finished_at)
     SELECT {id}, 'tenant-' || (i % 16), 'noop', '{}', 1, {now} - 86400000, {now} - 86400000, 10, 10, 'boom',
            {now} - 86400000, {now} - 86400000, {now} - 86400000 + i % 1000
     FROM generate_series(3000001::bigint, 3040000) AS g(i)",
    // Running, and running on a dead worker (lease expired a second ago).
    "INSERT INTO {s}.events (id, tenant, handler, payload, run_at, notified_at, attempt, max_attempts, lease_token, lease_expires_at, created_at, updated_at)
     SELECT {id}, 'tenant-' || (i % 16), 'noop', '{}', {now} - 10000, {now} - 10000, 1, 10, gen_random_uuid(),
            CASE WHEN i % 2 = 0 THEN {now} + 30000 ELSE {now} - 1000 END, {now} - 10000, {now} - 10000
     FROM generate_series(4000001::bigint, 4010000) AS g(i)",
];

/// A UUIDv7-like id from `i`: the time part grows with `i`.
const ID: &str = "(lpad(to_hex(1700000000000 + i), 12, '0') || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid";

async fn ids(conn: &mut PgConnection, sql: &str) -> Vec<uuid::Uuid> {
    sqlx::query_scalar(sql)
        .fetch_all(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn uuid_array(ids: &[uuid::Uuid]) -> String {
    let inner: Vec<String> = ids.iter().map(|u| u.to_string()).collect();
    format!("'{{{}}}'::uuid[]", inner.join(","))
}

fn repeat_array(value: &str, n: usize, ty: &str) -> String {
    format!("'{{{}}}'::{ty}[]", vec![value; n].join(","))
}

fn ords(n: usize) -> String {
    let v: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("'{{{}}}'::int4[]", v.join(","))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let options: PgConnectOptions = args.store.parse().expect("a PostgreSQL URL");
    let quoted = format!("\"{}\"", args.schema.replace('"', "\"\""));
    let mut admin = PgConnection::connect_with(&options).await.expect("connect");
    admin
        .execute(format!("DROP SCHEMA IF EXISTS {quoted} CASCADE").as_str())
        .await
        .expect("drop the scratch schema");
    herald_postgres::migrate(&args.store, &args.schema)
        .await
        .expect("migrate");
    let now: i64 = sqlx::query_scalar("SELECT floor(date_part('epoch', now()) * 1000)::bigint")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    eprintln!("loading 1,000,000 events into {quoted} ...");
    for sql in LOAD {
        let sql = sql
            .replace("{s}", &quoted)
            .replace("{id}", ID)
            .replace("{now}", &now.to_string());
        admin.execute(sql.as_str()).await.expect("load");
    }
    admin
        .execute(format!("VACUUM (ANALYZE) {quoted}.events").as_str())
        .await
        .expect("vacuum");
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {quoted}.events"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let size: String = sqlx::query_scalar(&format!(
        "SELECT pg_size_pretty(pg_table_size('{quoted}.events')) || ' heap, ' || \
         pg_size_pretty(pg_indexes_size('{quoted}.events')) || ' indexes'"
    ))
    .fetch_one(&mut admin)
    .await
    .unwrap();

    // The store's own statements.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .expect("connect the store");
    let store = PgStore::from_pool(pool, &args.schema)
        .await
        .expect("the schema");
    let statements: HashMap<&str, String> = store.statements().into_iter().collect();
    store.pool().close().await;
    let mut conn = PgConnection::connect_with(&options).await.expect("connect");
    if let Some(n) = args.reltuples {
        sqlx::query(
            "UPDATE pg_class SET reltuples = $2 WHERE oid IN \
               (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                WHERE n.nspname = $1 AND c.relname LIKE 'events%')",
        )
        .bind(&args.schema)
        .bind(n as f32)
        .execute(&mut conn)
        .await
        .expect("set reltuples (superuser)");
    }
    conn.execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();

    // Parameters from the data set.
    let due: Vec<uuid::Uuid> = ids(
        &mut conn,
        &format!(
            "SELECT id FROM {quoted}.events WHERE handler = 'noop' AND state = 0 \
             AND lease_token IS NULL AND run_at < {now} ORDER BY id OFFSET 350000 LIMIT {}",
            args.batch
        ),
    )
    .await;
    let running: Vec<(uuid::Uuid, uuid::Uuid)> = sqlx::query(&format!(
        "SELECT id, lease_token FROM {quoted}.events WHERE lease_expires_at > {now} \
         ORDER BY id LIMIT {}",
        args.batch
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let run_ids: Vec<uuid::Uuid> = running.iter().map(|r| r.0).collect();
    let run_tokens: Vec<uuid::Uuid> = running.iter().map(|r| r.1).collect();
    let n = running.len();
    let token = "'6b1c3f0e-0000-4000-8000-000000000001'::uuid";
    let page_after: uuid::Uuid = ids(
        &mut conn,
        &format!(
            "SELECT id FROM {quoted}.events WHERE tenant = 'tenant-paused' \
             AND handler = 'paused' AND state = 0 ORDER BY id OFFSET 100000 LIMIT 1"
        ),
    )
    .await[0];
    let stamp: Vec<uuid::Uuid> = due.iter().copied().take(1000).collect();

    let settle = |extra: &str| {
        format!(
            "{}, {}, {}{extra}",
            uuid_array(&run_ids),
            uuid_array(&run_tokens),
            ords(n)
        )
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "claim",
            format!("{token}, 30000, {}, '{{noop}}'::text[]", uuid_array(&due)),
        ),
        ("inspect", uuid_array(&due)),
        ("settle_delete", settle("")),
        (
            "settle_release",
            settle(&format!(
                ", {}, {}, {}",
                repeat_array("1000", n, "int8"),
                repeat_array("0", n, "int4"),
                repeat_array("\"attempt failed\"", n, "text")
            )),
        ),
        (
            "settle_bury",
            settle(&format!(", {}", repeat_array("\"boom\"", n, "text"))),
        ),
        (
            "renew",
            format!(
                "30000, {}, {}, {}",
                uuid_array(&run_ids),
                uuid_array(&run_tokens),
                ords(n)
            ),
        ),
        (
            "sweep_expired",
            format!(
                "{now}, {}, {}, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid, 1000",
                now - 60_000,
                now - 60_001
            ),
        ),
        (
            "sweep_quiet",
            format!(
                "{now}, {}, -9223372036854775808, '00000000-0000-0000-0000-000000000000'::uuid, 1000",
                now - 60_000
            ),
        ),
        ("sweep_stamp", format!("{now}, {}", uuid_array(&stamp))),
        ("sweep_park", uuid_array(&stamp)),
        ("sweep_orphans", String::new()),
        // As if the pause had been lifted without re-notifying (a crash).
        ("sweep_unpark", "'tenant-paused', 'paused', 16000".into()),
        ("renotify", "'tenant-paused', 'paused', 1000".into()),
        (
            "renotify_after",
            format!("'tenant-paused', 'paused', 1000, '{page_after}'::uuid"),
        ),
    ];

    println!(
        "# {total} events in {quoted}.events ({size}); batch {}; \
         plan_cache_mode = force_generic_plan; {}\n",
        args.batch,
        match args.reltuples {
            Some(n) => format!("reltuples of events and its indexes set to {n}"),
            None => "statistics from ANALYZE".to_string(),
        }
    );
    for (name, params) in cases {
        let sql = &statements[name];
        let routine = herald_postgres::testing::routines(&mut conn, &args.schema, &quoted, sql)
            .await
            .into_iter()
            .next();
        conn.execute("BEGIN").await.unwrap();
        let prepare = match &routine {
            Some(r) => {
                for setting in &r.settings {
                    let (k, v) = setting.split_once('=').expect("name=value");
                    sqlx::query("SELECT set_config($1, $2, true)")
                        .bind(k)
                        .bind(v)
                        .execute(&mut conn)
                        .await
                        .unwrap();
                }
                format!(
                    "PREPARE herald_{name}({}) AS {}",
                    r.types.join(", "),
                    r.body
                )
            }
            None => format!("PREPARE herald_{name} AS {sql}"),
        };
        conn.execute(prepare.as_str())
            .await
            .unwrap_or_else(|e| panic!("prepare {name}: {e}"));
        let exec = if params.is_empty() {
            format!("EXECUTE herald_{name}")
        } else {
            format!("EXECUTE herald_{name}({params})")
        };
        let plan: Vec<String> =
            sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {exec}"))
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("explain {name}: {e}"));
        conn.execute("ROLLBACK").await.unwrap();
        conn.execute(format!("DEALLOCATE herald_{name}").as_str())
            .await
            .unwrap();
        println!("## {name}\n");
        println!("```sql\n{}\n```\n", sql.replace(&quoted, "herald"));
        if let Some(r) = &routine {
            println!(
                "`{}` runs, with {}:\n\n```sql\n{}\n```\n",
                r.name,
                r.settings.join(", "),
                r.body
                    .replace(&quoted, "herald")
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        println!("```\n{}\n```\n", plan.join("\n"));
    }
    if !args.keep {
        admin
            .execute(format!("DROP SCHEMA {quoted} CASCADE").as_str())
            .await
            .expect("drop the scratch schema");
    }
}
