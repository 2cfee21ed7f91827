//! The hot statements' plans cannot become scans of `events`, whatever the
//! statistics say (issue 11): `EXPLAIN (FORMAT JSON)` of each hot statement
//! as the store sends it, and of the body of every herald function it calls
//! (under that function's own settings), under fresh, stale and
//! deliberately wrong statistics, with generic and custom plans. Every node
//! that reads `events` must be an index scan of a unique index with an index
//! condition on its key, not on the leaf too (one row per id of the batch,
//! in id order), or a bitmap scan of `events_pkey` by the batch's ids.
//!
//! `PLANS=print cargo test -p herald-postgres --test plans -- --nocapture`
//! prints every plan's shape.

use herald_postgres::testing;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};

/// The statements of the hot path (`PgStore::statements` names).
const HOT: &[&str] = &[
    "claim",
    "inspect",
    "settle_delete",
    "settle_archive",
    "settle_release",
    "settle_bury",
    "renew",
    "emit",
    "existing_keys",
];

/// Events loaded for the plans: enough pages that a scan is never the
/// cheap way to find a batch.
const ROWS: i64 = 50_000;
/// The batch the statements are explained with (custom plans see it).
const BATCH: i64 = 512;

/// Inserts `n` due, pending events straight into the schema, spread over
/// every leaf (events_cold and the ring's three).
async fn load(conn: &mut PgConnection, q: &str, n: i64) {
    load_into(conn, q, n, "i % 4").await;
}

/// Inserts `n` due, pending events straight into the schema, the i-th into
/// the leaf `leaf` (SQL of `i`), and marks the ring leaves that now hold
/// events not empty: the hot statements skip the leaves marked empty,
/// which only a retire's TRUNCATE makes so.
async fn load_into(conn: &mut PgConnection, q: &str, n: i64, leaf: &str) {
    conn.execute(
        format!(
            "INSERT INTO {q}.events (id, run_at, notified_at, created_at, updated_at, \
               max_attempts, tenant, handler, payload, idempotency_key, leaf) \
             SELECT gen_random_uuid(), 0, 0, 0, 0, 5, 't' || (i % 4), 'h' || (i % 8), \
                    '{{\"i\":' || i || '}}', CASE WHEN i % 10 = 0 THEN gen_random_uuid()::text END, \
                    {leaf} \
             FROM generate_series(1, {n}) AS i"
        )
        .as_str(),
    )
    .await
    .expect("load events");
    conn.execute(
        format!(
            "UPDATE {q}.ring SET phase = 'draining' WHERE phase = 'empty' \
             AND leaf IN (SELECT DISTINCT leaf FROM {q}.events)"
        )
        .as_str(),
    )
    .await
    .expect("mark the loaded leaves");
}

/// An argument of `ty` for EXPLAIN EXECUTE (a literal: EXECUTE takes no
/// subqueries): arrays of the batch's length, `ids` of stored events.
fn argument(ty: &str, ids: &str) -> String {
    let arr = |elem: &dyn Fn(i64) -> String, ty: &str| {
        let items: Vec<String> = (0..BATCH).map(elem).collect();
        format!("'{{{}}}'::{ty}", items.join(","))
    };
    match ty {
        "uuid[]" => format!("'{ids}'::uuid[]"),
        "uuid" => "gen_random_uuid()".into(),
        "bigint" => "30000".into(),
        "integer" => BATCH.to_string(),
        "text" => "'t0'".into(),
        "integer[]" => arr(&|i| i.to_string(), "int4[]"),
        "bigint[]" => arr(&|_| "0".into(), "int8[]"),
        "text[]" => arr(&|i| format!("h{}", i % 8), "text[]"),
        other => panic!("no argument for parameter type {other}"),
    }
}

/// EXPLAIN (FORMAT JSON) of `sql` prepared with `types` (inferred when
/// `None`): the plan's top node.
async fn explain(conn: &mut PgConnection, q: &str, sql: &str, types: Option<&[String]>) -> Value {
    let prepare = match types {
        Some(t) if !t.is_empty() => format!("PREPARE hot({}) AS {sql}", t.join(", ")),
        _ => format!("PREPARE hot AS {sql}"),
    };
    conn.execute(prepare.as_str())
        .await
        .unwrap_or_else(|e| panic!("{prepare}: {e}"));
    let types: Vec<String> = sqlx::query_scalar(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'hot'",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("parameter types");
    let ids: String = sqlx::query_scalar(&format!(
        "SELECT array_agg(id ORDER BY id)::text FROM \
           (SELECT id FROM {q}.events ORDER BY id LIMIT {BATCH}) AS b"
    ))
    .fetch_one(&mut *conn)
    .await
    .expect("a batch of ids");
    let args: Vec<String> = types.iter().map(|t| argument(t, &ids)).collect();
    let execute = if args.is_empty() {
        "EXPLAIN (FORMAT JSON) EXECUTE hot".to_string()
    } else {
        format!("EXPLAIN (FORMAT JSON) EXECUTE hot({})", args.join(", "))
    };
    // Through a function of the session's: EXPLAIN's result is `json`,
    // which sqlx would decode only with its `json` feature.
    let text: String = sqlx::query_scalar("SELECT pg_temp.plan_of($1)")
        .bind(&execute)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{execute}: {e}"));
    conn.execute("DEALLOCATE hot").await.expect("deallocate");
    let plan: Value = serde_json::from_str(&text).expect("EXPLAIN's JSON");
    plan[0]["Plan"].clone()
}

/// What is wrong with a plan: every node reading `events` that is not an
/// index scan of a unique index with an index condition on its key alone.
fn violations(node: &Value, out: &mut Vec<String>) {
    let rel = node["Relation Name"].as_str().unwrap_or("");
    let kind = node["Node Type"].as_str().unwrap_or("");
    if rel.starts_with("events") && kind != "ModifyTable" {
        let index = node["Index Name"].as_str().unwrap_or("");
        let cond = node["Index Cond"].as_str().unwrap_or("");
        // A leaf's indexes are named after the leaf and the columns
        // (events_1_pkey, events_1_tenant_handler_idempotency_key_leaf_idx).
        let keyed = if index.ends_with("_pkey") {
            cond.contains("(id =")
        } else if index.contains("idempotency_key") {
            cond.contains("idempotency_key =")
        } else {
            false
        };
        // A bitmap of the batch's ids, fetched in physical order: bounded
        // too (the claim, a plain statement, may get one).
        let bitmap_of_ids = kind == "Bitmap Heap Scan"
            && node["Plans"].as_array().is_some_and(|c| {
                let bitmaps: Vec<&Value> = c
                    .iter()
                    .filter(|b| b["Node Type"] != "Result" && b["Relation Name"].is_null())
                    .collect();
                !bitmaps.is_empty()
                    && bitmaps.iter().all(|b| {
                        b["Node Type"] == "Bitmap Index Scan"
                            && b["Index Name"]
                                .as_str()
                                .is_some_and(|i| i.ends_with("_pkey"))
                            && b["Index Cond"]
                                .as_str()
                                .is_some_and(|c| c.contains("(id = ANY"))
                    })
            });
        // A list of leaves in the index condition too (the indexes hold
        // the leaf last) would descend once per id and listed leaf: the
        // hot statements name the ring's leaves for run-time pruning only.
        // One leaf, as the second statement names events_cold's, is one
        // descent per id, as without it.
        let keyed = keyed && !cond.contains("leaf = ANY");
        let index_scan = matches!(kind, "Index Scan" | "Index Only Scan") && keyed;
        if !index_scan && !bitmap_of_ids {
            out.push(format!(
                "{kind} on {rel} (index {index:?}, cond {cond:?}, estimated rows {})",
                node["Plan Rows"]
            ));
        }
    }
    if let Some(children) = node["Plans"].as_array() {
        for c in children {
            violations(c, out);
        }
    }
}

/// A plan in one line, for reading: each node's type, the relation and the
/// index it reads, and its children in brackets.
fn shape(node: &Value) -> String {
    let mut s = node["Node Type"].as_str().unwrap_or("?").to_string();
    if let Some(rel) = node["Relation Name"].as_str() {
        s += &format!(" {rel}");
    }
    if let Some(index) = node["Index Name"].as_str() {
        s += &format!(" using {index}");
    }
    if let Some(children) = node["Plans"].as_array() {
        let inner: Vec<String> = children.iter().map(shape).collect();
        s += &format!(" [{}]", inner.join(", "));
    }
    s
}

/// Ways the statistics can be: each is set up on a truncated table.
const STATISTICS: &[&str] = &[
    "fresh",
    "stale",
    "empty-analyzed",
    "reltuples=1",
    "reltuples=1e9",
    // What autovacuum and ANALYZE leave on a busy table that was nearly
    // empty at that moment (seen in bench/long-horizon.sh: 18,000 pages).
    "reltuples=0",
    // bench/compare.sh's stale case: analyzed while only a backlog in
    // events_cold was stored and the ring's leaves were empty, which have
    // grown since.
    "stale-leaves",
];

async fn set_statistics(conn: &mut PgConnection, schema: &str, q: &str, how: &str) {
    conn.execute(format!("TRUNCATE {q}.events").as_str())
        .await
        .expect("truncate");
    let analyze = format!("ANALYZE {q}.events");
    match how {
        "fresh" | "reltuples=0" | "reltuples=1" | "reltuples=1e9" => {
            load(conn, q, ROWS).await;
            conn.execute(analyze.as_str()).await.expect("analyze");
        }
        // Analyzed small, grown since.
        "stale" => {
            load(conn, q, 200).await;
            conn.execute(analyze.as_str()).await.expect("analyze");
            load(conn, q, ROWS).await;
        }
        "stale-leaves" => {
            load(conn, q, ROWS).await;
            conn.execute(format!("TRUNCATE {q}.events_1, {q}.events_2, {q}.events_3").as_str())
                .await
                .expect("empty the ring's leaves");
            conn.execute(format!("VACUUM {analyze}").as_str())
                .await
                .expect("vacuum analyze");
            // An empty leaf's ANALYZE keeps the column statistics it had;
            // a new schema's leaves have none (needs superuser).
            sqlx::query(
                "DELETE FROM pg_statistic WHERE starelid IN \
                   (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                    WHERE n.nspname = $1 AND c.relname IN ('events_1', 'events_2', 'events_3'))",
            )
            .bind(schema)
            .execute(&mut *conn)
            .await
            .expect("forget the leaves' statistics (superuser)");
            load(conn, q, ROWS).await;
        }
        // pg_statistic (and reltuples) of an empty table.
        "empty-analyzed" => {
            conn.execute(analyze.as_str()).await.expect("analyze");
            load(conn, q, ROWS).await;
        }
        other => panic!("unknown statistics {other}"),
    }
    let reltuples = match how {
        "reltuples=0" => "0",
        "reltuples=1" => "1",
        "reltuples=1e9" => "1e9",
        _ => return,
    };
    // The table and its indexes (needs superuser: the test database's user).
    sqlx::query(&format!(
        "UPDATE pg_class SET reltuples = {reltuples} WHERE oid IN \
           (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
            WHERE n.nspname = $1 AND c.relname LIKE 'events%')"
    ))
    .bind(schema)
    .execute(&mut *conn)
    .await
    .expect("set reltuples (superuser)");
    if how == "reltuples=0" {
        // And indexes that vacuum has just emptied: a few pages.
        sqlx::query(
            "UPDATE pg_class SET relpages = 1 WHERE relkind = 'i' AND oid IN \
               (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                WHERE n.nspname = $1 AND c.relname LIKE 'events%')",
        )
        .bind(schema)
        .execute(&mut *conn)
        .await
        .expect("set relpages (superuser)");
    }
}

/// `pg_temp.plan_of(statement)`: runs an EXPLAIN and returns its text (as
/// `text`: EXPLAIN's `json` would need sqlx's `json` feature).
async fn create_plan_of(conn: &mut PgConnection) {
    conn.execute(
        "CREATE FUNCTION pg_temp.plan_of(statement text) RETURNS text LANGUAGE plpgsql \
         AS $$ DECLARE plan text; BEGIN EXECUTE statement INTO plan; RETURN plan; END $$",
    )
    .await
    .expect("create plan_of");
}

/// Opens a transaction with the routine's own settings, as its calls run.
async fn begin_with_settings(conn: &mut PgConnection, routine: &testing::Routine) {
    conn.execute("BEGIN").await.expect("begin");
    for s in &routine.settings {
        let (k, v) = s.split_once('=').expect("name=value");
        sqlx::query("SELECT set_config($1, $2, true)")
            .bind(k)
            .bind(v)
            .execute(&mut *conn)
            .await
            .expect("set_config");
    }
}

#[tokio::test]
async fn hot_statements_stay_bounded_by_the_batch_under_any_statistics() {
    let Some((store, guard)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let schema = guard.name().to_string();
    let q = format!("\"{schema}\"");
    let statements: Vec<(&str, String)> = store
        .statements()
        .into_iter()
        .filter(|(n, _)| HOT.contains(n))
        .collect();
    assert_eq!(statements.len(), HOT.len(), "every hot statement is named");
    store.pool().close().await;
    let mut conn = PgConnection::connect_with(&testing::connect_options())
        .await
        .expect("connect");
    create_plan_of(&mut conn).await;
    let mut wrong = Vec::new();
    let mut checked = 0;
    for how in STATISTICS {
        set_statistics(&mut conn, &schema, &q, how).await;
        for mode in ["force_generic_plan", "force_custom_plan"] {
            conn.execute(format!("SET plan_cache_mode = {mode}").as_str())
                .await
                .expect("plan_cache_mode");
            for (name, sql) in &statements {
                let mut plans = vec![(name.to_string(), explain(&mut conn, &q, sql, None).await)];
                for r in testing::routines(&mut conn, &schema, &q, sql).await {
                    // The body under the function's own settings.
                    begin_with_settings(&mut conn, &r).await;
                    let plan = explain(&mut conn, &q, &r.body, Some(&r.types)).await;
                    conn.execute("ROLLBACK").await.expect("rollback");
                    plans.push((format!("{name} → {}", r.name), plan));
                }
                for (what, plan) in plans {
                    checked += 1;
                    // PLANS=print: every plan's shape, for reading.
                    if std::env::var_os("PLANS").is_some_and(|v| v == "print") {
                        println!("{what} [{how}, {mode}]: {}", shape(&plan));
                    }
                    let mut v = Vec::new();
                    violations(&plan, &mut v);
                    if !v.is_empty() {
                        eprintln!("{what} [{how}, {mode}]: {plan:#}");
                    }
                    for v in v {
                        wrong.push(format!("{what} [{how}, {mode}]: {v}"));
                    }
                }
            }
        }
    }
    let _ = conn.close().await;
    assert!(
        wrong.is_empty(),
        "{} of {checked} plans read events other than by key:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// `Actual Loops` of every node of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan
/// that scans `index`, summed, leaving out InitPlans (run once per
/// statement).
fn loops_on(node: &Value, index: &str) -> u64 {
    if node["Parent Relationship"].as_str() == Some("InitPlan") {
        return 0;
    }
    let own = if node["Index Name"].as_str() == Some(index) {
        node["Actual Loops"].as_u64().unwrap_or(0)
    } else {
        0
    };
    own + node["Plans"]
        .as_array()
        .map_or(0, |c| c.iter().map(|n| loops_on(n, index)).sum())
}

/// EXPLAIN ANALYZE of `routine`'s body, run with `args` (literals: EXECUTE
/// takes no subqueries) under the function's own settings, in a
/// transaction rolled back: the plan's top node.
async fn analyze(conn: &mut PgConnection, routine: &testing::Routine, args: &str) -> Value {
    begin_with_settings(conn, routine).await;
    conn.execute(
        format!(
            "PREPARE r({}) AS {}",
            routine.types.join(", "),
            routine.body
        )
        .as_str(),
    )
    .await
    .expect("prepare the body");
    let text: String = sqlx::query_scalar("SELECT pg_temp.plan_of($1)")
        .bind(format!("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE r({args})"))
        .fetch_one(&mut *conn)
        .await
        .expect("explain analyze the body");
    conn.execute("ROLLBACK").await.expect("rollback");
    conn.execute("DEALLOCATE r").await.expect("deallocate");
    let plan: Value = serde_json::from_str(&text).expect("EXPLAIN's JSON");
    plan[0]["Plan"].clone()
}

/// Every stored id, in order, as an array literal.
async fn stored_ids(conn: &mut PgConnection, q: &str) -> String {
    sqlx::query_scalar(&format!(
        "SELECT array_agg(id ORDER BY id)::text FROM {q}.events"
    ))
    .fetch_one(&mut *conn)
    .await
    .expect("the ids")
}

/// The claim's body over every stored event for `handlers` with the
/// tenants hint `tenants` (text[] literals): the rows it took and its
/// per-row probes of `rules_pkey` (the once-per-claim check scans it too,
/// once: not counted).
async fn claim_probes(
    conn: &mut PgConnection,
    routine: &testing::Routine,
    q: &str,
    handlers: &str,
    tenants: &str,
) -> (u64, u64) {
    let ids = stored_ids(conn, q).await;
    let top = analyze(
        conn,
        routine,
        // The ids themselves as the tokens: one per id.
        &format!("'{ids}'::uuid[], 30000, '{ids}', '{handlers}', '{tenants}'"),
    )
    .await;
    (
        top["Actual Rows"].as_u64().expect("rows"),
        loops_on(&top, "rules_pkey"),
    )
}

/// The claim probes `rules_pkey` per row only when a rule names
/// one of its handlers, and then only the rows whose tenant its hint does
/// not name, or every row when a rule names a hinted tenant with one of its
/// handlers; otherwise its once-per-claim checks leave the per-row probe
/// unexecuted. The claim's body is run under its
/// own settings with EXPLAIN ANALYZE, inside a transaction that is rolled
/// back, so each case claims the same rows.
#[tokio::test]
async fn the_claim_probes_rules_per_row_only_where_its_tenants_hint_cannot_vouch() {
    let Some((store, guard)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let schema = guard.name().to_string();
    let q = format!("\"{schema}\"");
    let claim = store
        .statements()
        .into_iter()
        .find(|(n, _)| *n == "claim")
        .expect("the claim statement")
        .1;
    store.pool().close().await;
    let mut conn = PgConnection::connect_with(&testing::connect_options())
        .await
        .expect("connect");
    create_plan_of(&mut conn).await;
    // 64 events: tenant t(i % 4), handler h(i % 8), over the ring's leaves
    // (the claim's first statement reads those; events_cold is its
    // second's).
    load_into(&mut conn, &q, 64, "1 + i % 3").await;
    let routine = testing::routines(&mut conn, &schema, &q, &claim)
        .await
        .into_iter()
        .find(|r| r.name == "claim")
        .expect("the claim function");
    let all = "{h0,h1,h2,h3,h4,h5,h6,h7}";
    let every_tenant = "{t0,t1,t2,t3}";
    for hint in [every_tenant, "{t1,t2,t3}", "{}"] {
        assert_eq!(
            claim_probes(&mut conn, &routine, &q, all, hint).await,
            (64, 0),
            "no rule names the claim's handlers: no per-row probe, hint {hint}"
        );
    }
    conn.execute(
        format!(
            "INSERT INTO {q}.rules (tenant, handler, kind, created_at) VALUES ('t0', 'h0', 'pause', 0)"
        )
        .as_str(),
    )
    .await
    .expect("add a pause");
    // i % 8 = 0 are h0 and t0: the 8 paused rows are left.
    assert_eq!(
        claim_probes(&mut conn, &routine, &q, all, every_tenant).await,
        (56, 64),
        "a rule names a hinted tenant and a handler of the claim: every row probed"
    );
    assert_eq!(
        claim_probes(&mut conn, &routine, &q, all, "{t1,t2,t3}").await,
        (56, 16),
        "the rule's tenant is not in the hint: only that tenant's rows probed"
    );
    assert_eq!(
        claim_probes(&mut conn, &routine, &q, all, "{}").await,
        (56, 64),
        "a rule names a handler of the claim and there is no hint: every row probed"
    );
    assert_eq!(
        claim_probes(&mut conn, &routine, &q, "{h1}", every_tenant).await,
        (8, 0),
        "the rule names no handler of the claim: no per-row probe"
    );
    let _ = conn.close().await;
}

/// The claim, the settles and the renewal probe no ring leaf
/// marked empty (run-time pruning leaves its scan unexecuted), and probe a
/// leaf again once a flip makes it filling. Their first statement leaves
/// events_cold out (a second statement looks there, when needed; the next
/// test).
#[tokio::test]
async fn the_hot_statements_skip_the_empty_leaves() {
    let Some((store, guard)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let schema = guard.name().to_string();
    let q = format!("\"{schema}\"");
    let statements = store.statements();
    store.pool().close().await;
    let mut conn = PgConnection::connect_with(&testing::connect_options())
        .await
        .expect("connect");
    create_plan_of(&mut conn).await;
    // 64 events in the filling leaf (1); leaves 2 and 3 empty, as migrated.
    load_into(&mut conn, &q, 64, "1").await;
    let ids = stored_ids(&mut conn, &q).await;
    let nulls = format!("'{{{}}}'", vec!["NULL"; 64].join(","));
    let ords = format!(
        "'{{{}}}'",
        (1..=64)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    // Each statement's function with arguments that find all 64 (the
    // settles fence on "no lease", which these events have) and the rows it
    // returns: the renewal's fence (a lease token) holds for none, but it
    // probes the same leaves.
    let calls = [
        (
            "claim",
            format!("'{ids}'::uuid[], 30000, '{ids}', '{{h0,h1,h2,h3,h4,h5,h6,h7}}', '{{t0,t1,t2,t3}}'"),
        ),
        ("settle_delete", format!("'{ids}', {nulls}, {ords}")),
        ("settle_archive", format!("'{ids}', {nulls}, {ords}")),
        ("settle_release", format!("'{ids}', {nulls}, {ords}, array_fill(0::int8, ARRAY[64]), array_fill(0, ARRAY[64]), array_fill(NULL::text, ARRAY[64])")),
        ("settle_bury", format!("'{ids}', {nulls}, {ords}, array_fill('e'::text, ARRAY[64])")),
        ("renew", format!("30000, '{ids}', array_fill(gen_random_uuid(), ARRAY[64]), {ords}")),
    ];
    let mut routines = Vec::new();
    for (name, args) in &calls {
        let sql = &statements
            .iter()
            .find(|(n, _)| n == name)
            .expect("the statement")
            .1;
        let routine = testing::routines(&mut conn, &schema, &q, sql)
            .await
            .into_iter()
            .find(|r| r.name == *name)
            .expect("its function");
        let rows = if *name == "renew" { 0 } else { 64 };
        routines.push((routine, args.clone(), rows));
    }
    let probed = |top: &Value| -> Vec<u64> {
        [
            "events_cold_pkey",
            "events_1_pkey",
            "events_2_pkey",
            "events_3_pkey",
        ]
        .iter()
        .map(|i| loops_on(top, i))
        .collect()
    };
    for (routine, args, rows) in &routines {
        let top = analyze(&mut conn, routine, args).await;
        assert_eq!(
            top["Actual Rows"].as_u64(),
            Some(*rows),
            "{}: {top:#}",
            routine.name
        );
        assert_eq!(
            probed(&top),
            [0, 1, 0, 0],
            "{}: the filling leaf probed, the empty ones and events_cold not",
            routine.name
        );
    }
    // A flip makes leaf 2 filling: it is probed from then on.
    let flipped: bool = sqlx::query_scalar(&format!("SELECT {q}.ring_flip(1::int2, 2::int2)"))
        .fetch_one(&mut conn)
        .await
        .expect("flip");
    assert!(flipped);
    for (routine, args, _) in &routines {
        let top = analyze(&mut conn, routine, args).await;
        assert_eq!(
            probed(&top),
            [0, 1, 1, 0],
            "{} after the flip",
            routine.name
        );
    }
    let _ = conn.close().await;
}

/// How many times this transaction has scanned events_cold's primary key
/// (the backend's own count, before it is reported).
async fn cold_scans(conn: &mut PgConnection, q: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT pg_stat_get_xact_numscans('{q}.events_cold_pkey'::regclass)"
    ))
    .fetch_one(&mut *conn)
    .await
    .expect("the transaction's scans")
}

/// The rows `call` (a function call) returns, and the scans of
/// events_cold's primary key it made, inside the open transaction.
async fn rows_and_cold_scans(conn: &mut PgConnection, q: &str, call: &str) -> (i64, i64) {
    let before = cold_scans(conn, q).await;
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {call}"))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{call}: {e}"));
    (rows, cold_scans(conn, q).await - before)
}

/// The claim, the settles and the renewal look in events_cold
/// only when the ring's leaves did not give them a row for every id: a
/// batch the filling leaf holds whole never scans it; a batch with ids in
/// events_cold, or one whose fence fails, does, and finds what is there.
/// The functions are called as the store calls them (not their bodies),
/// each in a transaction rolled back.
#[tokio::test]
async fn the_hot_statements_look_in_events_cold_only_for_what_the_ring_did_not_have() {
    let Some((store, guard)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let q = format!("\"{}\"", guard.name());
    store.pool().close().await;
    let mut conn = PgConnection::connect_with(&testing::connect_options())
        .await
        .expect("connect");
    // 64 events in the filling leaf (1), 64 in events_cold.
    load_into(&mut conn, &q, 64, "1").await;
    load_into(&mut conn, &q, 64, "0").await;
    let ids_of = |which: &str| {
        format!("SELECT array_agg(id ORDER BY id)::text FROM {q}.events WHERE {which}")
    };
    let ring: String = sqlx::query_scalar(&ids_of("leaf = 1"))
        .fetch_one(&mut conn)
        .await
        .expect("the ring's ids");
    let all: String = sqlx::query_scalar(&ids_of("true"))
        .fetch_one(&mut conn)
        .await
        .expect("every id");
    let token = "'00000000-0000-4000-8000-000000000001'::uuid";
    // The calls over `ids` (an array literal) of `n` events; `fence` the
    // tokens the settles and the renewal are fenced by.
    let calls = |ids: &str, n: usize, fence: &str| -> Vec<(&'static str, String)> {
        let ords = format!("(SELECT array_agg(i) FROM generate_series(1, {n}) AS i)");
        let fences = format!("array_fill({fence}, ARRAY[{n}])");
        vec![
            (
                "claim",
                format!(
                    "{q}.claim(array_fill({token}, ARRAY[{n}]), 30000, '{ids}', '{{h0,h1,h2,h3,h4,h5,h6,h7}}', '{{t0,t1,t2,t3}}')"
                ),
            ),
            ("settle_delete", format!("{q}.settle_delete('{ids}', {fences}, {ords})")),
            ("settle_archive", format!("{q}.settle_archive('{ids}', {fences}, {ords})")),
            (
                "settle_release",
                format!(
                    "{q}.settle_release('{ids}', {fences}, {ords}, array_fill(0::int8, ARRAY[{n}]), \
                     array_fill(0, ARRAY[{n}]), array_fill(NULL::text, ARRAY[{n}]))"
                ),
            ),
            (
                "settle_bury",
                format!("{q}.settle_bury('{ids}', {fences}, {ords}, array_fill('e'::text, ARRAY[{n}]))"),
            ),
        ]
    };
    // Each call in a transaction rolled back. The settles fence on "no
    // lease", which the loaded events have.
    let mut once = async |call: &str| {
        conn.execute("BEGIN").await.expect("begin");
        let seen = rows_and_cold_scans(&mut conn, &q, call).await;
        conn.execute("ROLLBACK").await.expect("rollback");
        seen
    };
    for (name, call) in calls(&ring, 64, "NULL::uuid") {
        assert_eq!(
            once(&call).await,
            (64, 0),
            "{name}: a batch the ring holds whole is taken without events_cold"
        );
    }
    for (name, call) in calls(&all, 128, "NULL::uuid") {
        let (rows, scans) = once(&call).await;
        assert_eq!(rows, 128, "{name}: the ids in events_cold are found there");
        assert!(scans > 0, "{name}: events_cold scanned for its ids");
    }
    // A settle whose fence fails (a lease token no event holds) takes
    // nothing, and so looks in events_cold too (the claim has no fence).
    let wrong = "'00000000-0000-4000-8000-000000000002'::uuid";
    for (name, call) in calls(&ring, 64, wrong).into_iter().skip(1) {
        let (rows, scans) = once(&call).await;
        assert_eq!(rows, 0, "{name}: no fence holds");
        assert!(scans > 0, "{name}: a short batch looks in events_cold");
    }
    // The renewal, of the leases a claim took in the same transaction.
    for (ids, n, cold) in [(&ring, 64, false), (&all, 128, true)] {
        let (_, claim) = calls(ids, n, token).swap_remove(0);
        conn.execute("BEGIN").await.expect("begin");
        let (claimed, _) = rows_and_cold_scans(&mut conn, &q, &claim).await;
        assert_eq!(claimed, n as i64, "claimed for the renewal");
        let renew = format!(
            "{q}.renew(30000, '{ids}', array_fill({token}, ARRAY[{n}]), \
             (SELECT array_agg(i) FROM generate_series(1, {n}) AS i))"
        );
        let (renewed, scans) = rows_and_cold_scans(&mut conn, &q, &renew).await;
        conn.execute("ROLLBACK").await.expect("rollback");
        assert_eq!(renewed, n as i64, "renew: every lease held");
        assert_eq!(
            scans > 0,
            cold,
            "renew of {n}: events_cold scanned only for its ids"
        );
    }
    let _ = conn.close().await;
}
