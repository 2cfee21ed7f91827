//! The writer thread's group commit: one transaction per group; when a job
//! fails, the group runs again with one savepoint per job.

use std::time::Duration;

use herald::backend::StoreResult;
use herald::{Millis, StoreError};
use rusqlite::Connection;

use crate::rows::Ctx;
use crate::SqliteStore;

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("group.db")).unwrap();
    (dir, store)
}

fn insert_leader(conn: &Connection, role: &str) -> StoreResult<()> {
    conn.execute(
        "INSERT INTO leaders (role, holder, expires_at) VALUES (?1, 'x', 1)",
        [role],
    )
    .map(|_| ())
    .ctx("test")
}

async fn leaders(store: &SqliteStore) -> Vec<String> {
    store
        .call("test", |conn, _| {
            let mut st = conn
                .prepare("SELECT role FROM leaders ORDER BY role")
                .ctx("t")?;
            let rows = st.query_map([], |r| r.get(0)).ctx("t")?;
            rows.collect::<rusqlite::Result<Vec<String>>>().ctx("t")
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_rolls_back_only_itself_and_the_group_shares_one_clock() {
    let (_dir, store) = store();
    // Keep the writer busy so that the next jobs queue up behind it and are
    // drained as one group.
    let busy = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .call("busy", |_, now| {
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(now)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (a, bad, c) = tokio::join!(
        store.call("a", |conn, now| insert_leader(conn, "a").map(|()| now)),
        store.call("bad", |conn, now| {
            insert_leader(conn, "bad")?;
            Err::<Millis, _>(StoreError::Invalid(format!("no at {}", now.0)))
        }),
        store.call("c", |conn, now| insert_leader(conn, "c").map(|()| now)),
    );
    let busy = busy.await.unwrap().unwrap();
    let (a, c) = (a.unwrap(), c.unwrap());
    assert_eq!(a, c, "one group, one transaction, one clock");
    assert!(a.0 >= busy.0 + 200, "the group ran after the busy job");
    match bad {
        Err(StoreError::Invalid(msg)) => assert_eq!(msg, format!("no at {}", a.0)),
        other => panic!("expected the job's own error, got {other:?}"),
    }
    assert_eq!(
        leaders(&store).await,
        vec!["a".to_string(), "c".to_string()]
    );
}

#[tokio::test]
async fn a_failing_job_alone_rolls_back() {
    let (_dir, store) = store();
    let bad = store
        .call("bad", |conn, _| {
            insert_leader(conn, "bad")?;
            Err::<(), _>(StoreError::Invalid("no".into()))
        })
        .await;
    assert!(matches!(bad, Err(StoreError::Invalid(_))));
    assert!(leaders(&store).await.is_empty());
}

#[tokio::test]
async fn a_panicking_job_is_a_backend_error_and_the_store_goes_on() {
    let (_dir, store) = store();
    let r = store
        .call("explode", |conn, _| -> StoreResult<()> {
            insert_leader(conn, "half")?;
            panic!("boom")
        })
        .await;
    match r {
        Err(e @ StoreError::Backend { .. }) => {
            assert_eq!(
                e.to_string(),
                "store failed: explode: the operation panicked"
            )
        }
        other => panic!("expected Backend, got {other:?}"),
    }
    assert!(leaders(&store).await.is_empty());
    store
        .call("ok", |conn, _| insert_leader(conn, "ok"))
        .await
        .unwrap();
    assert_eq!(leaders(&store).await, vec!["ok".to_string()]);
}

#[tokio::test]
async fn an_sql_error_names_the_operation() {
    let (_dir, store) = store();
    let r = store
        .call("frobnicate", |conn, _| {
            conn.execute("INSERT INTO nowhere VALUES (1)", [])
                .map(|_| ())
                .ctx("frobnicate")
        })
        .await;
    match r {
        Err(StoreError::Backend { context, source }) => {
            assert_eq!(context, "frobnicate");
            // SQLite's own error is kept as the source.
            let sqlite = source.downcast_ref::<rusqlite::Error>().expect("rusqlite");
            assert!(sqlite.to_string().contains("nowhere"), "{sqlite}");
        }
        other => panic!("expected Backend, got {other:?}"),
    }
}
