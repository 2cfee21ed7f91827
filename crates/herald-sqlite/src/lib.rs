//! herald's embedded store: one SQLite file in WAL mode.
//!
//! [`SqliteStore`] implements [`herald::Store`]. One dedicated OS thread owns
//! the connection; every call is sent to it as a job, and the thread
//! group-commits whatever is queued (up to 256 jobs) in one
//! `BEGIN IMMEDIATE … COMMIT`; a failing job rolls back only itself (the
//! group is then run again with a savepoint per job). The thread's
//! clock, read once per transaction, is "the database's clock" that judges
//! leases and `run_at`.
//!
//! Several processes may open the same file: writers wait for each other up
//! to a 5 s busy timeout, then fail with [`StoreError::Backend`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), herald::StoreError> {
//! use herald::Store;
//! let store = herald_sqlite::SqliteStore::open("herald.db")?;
//! let counts = store.counts(&herald::CountsQuery::all()).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod rows;
mod schema;
mod writer;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald::store::{
    CappedCount, CountsQuery, EventFilter, Finish, HandlerCounts, Inspected, Inspection, LeaseRef,
    PendingSample, Scheduled, Settle, StoreResult, SweepPage, SweepPass,
};
use herald::sweep::{Candidate, Source, Step, Sweep, Writes, PARKED};
use herald::{
    AttemptError, Emitted, Event, EventId, EventState, Leadership, LeaseToken, Millis, NewEvent,
    Notification, Rule, RuleKind, RuleMatch, Store, StoreError,
};
use rusqlite::types::Value;
use rusqlite::vtab::array::Array;
use rusqlite::{params, CachedStatement, Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::rows::{event, event_id, Ctx, EVENT_COLUMNS};
use crate::writer::{Call, Job};

pub use crate::schema::SCHEMA_VERSION;

/// herald's store on an SQLite file. Cheap to clone: clones share the
/// connection's thread, which ends when the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Box<dyn Job>>,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the database at `path`, creating the file if it is missing and
    /// applying pending migrations.
    ///
    /// Blocks while it opens and migrates (milliseconds; up to the 5 s busy
    /// timeout if another process holds the write lock).
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] if the file can't be opened or created (missing
    /// directory, permissions), [`StoreError::NotHerald`] if it is not an
    /// SQLite file or is another application's database,
    /// [`StoreError::TooNew`] if a newer herald migrated it.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = schema::open(&path)?;
        let (jobs, queue) = mpsc::channel::<Box<dyn Job>>();
        std::thread::Builder::new()
            .name("herald-sqlite".into())
            .spawn(move || writer::run(conn, queue))
            .map_err(|e| StoreError::Open {
                location: path.display().to_string(),
                reason: format!("cannot start the writer thread: {e}"),
            })?;
        tracing::debug!(path = %path.display(), "herald-sqlite: store opened");
        Ok(SqliteStore {
            jobs,
            path: Arc::new(path),
        })
    }

    /// The database file's path, as given to [`SqliteStore::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`Store::claim`] for a larger batch: one statement for all the ids.
    async fn claim_batch(
        &self,
        ids: &[EventId],
        handlers: &[String],
        token: LeaseToken,
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        let ids: Vec<Value> = ids
            .iter()
            .map(|&id| Value::Blob(blob(id).to_vec()))
            .collect();
        let handlers: Vec<Value> = handlers.iter().cloned().map(Value::Text).collect();
        self.call("claim", move |conn, now| {
            const OP: &str = "claim";
            let ids: Array = Rc::new(ids.clone());
            let handlers: Array = Rc::new(handlers.clone());
            let mut stmt = conn.prepare_cached(CLAIM_BATCH_SQL).ctx(OP)?;
            let rows = stmt
                .query_map(
                    params![token_blob(token), now.plus(lease).0, now.0, ids, handlers],
                    event,
                )
                .ctx(OP)?;
            rows.collect::<rusqlite::Result<_>>().ctx(OP)
        })
        .await
    }

    /// Runs `work` on the writer thread, inside a group-committed
    /// transaction, and waits for the commit.
    ///
    /// `work` may run twice (see the writer module): it must act on the
    /// database only. If the returned future is dropped, the work still runs
    /// and commits.
    async fn call<T, F>(&self, op: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection, Millis) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Box::new(Call::new(op, work, reply)))
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

fn blob(id: EventId) -> [u8; 16] {
    *id.0.as_bytes()
}

fn token_blob(token: LeaseToken) -> [u8; 16] {
    *token.0.as_bytes()
}

/// The keyset cursor as a BLOB; with no cursor a zero-length BLOB, which
/// sorts before every 16-byte id.
fn after_blob(after: Option<EventId>) -> Vec<u8> {
    after.map(|a| blob(a).to_vec()).unwrap_or_default()
}

fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn rule_match(conn: &Connection, op: &str, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
    let mut stmt = conn
        .prepare_cached("SELECT kind FROM rules WHERE tenant = ?1 AND handler = ?2")
        .ctx(op)?;
    let mut rows = stmt.query(params![tenant, handler]).ctx(op)?;
    let mut m = RuleMatch::default();
    while let Some(row) = rows.next().ctx(op)? {
        let kind: String = row.get(0).ctx(op)?;
        match RuleKind::parse(&kind) {
            Some(RuleKind::Block) => m.blocked = true,
            Some(RuleKind::Pause) => m.paused = true,
            None => return Err(StoreError::backend(op, format!("unknown rule kind {kind}"))),
        }
    }
    Ok(m)
}

/// The sweep's keyset cursor: the key of the index walked (`notified_at`
/// or `lease_expires_at`) and the rowid (the index's tie-breaker).
type SweepCursor = (i64, i64);

/// Carries out one sweep call's [`Step`]s on the writer thread's
/// transaction.
fn sweep_call(
    conn: &Connection,
    now: Millis,
    quiet: Duration,
    pass: Option<SweepPass>,
    limit: usize,
) -> StoreResult<SweepPage> {
    const OP: &str = "sweep";
    let mut sweep = Sweep::<SweepCursor>::new(now, quiet, pass, limit);
    let mut step = sweep.start();
    loop {
        step = match step {
            Step::ListOrphans => sweep.orphans(sweep_orphans(conn)?),
            Step::Unpark {
                tenant,
                handler,
                limit,
            } => {
                let n = conn
                    .prepare_cached(UNPARK_SQL)
                    .and_then(|mut st| {
                        st.execute(params![tenant, handler, sql_limit(limit), PARKED.0])
                    })
                    .ctx(OP)?;
                sweep.unparked(n as u64)
            }
            Step::ForgetParked { tenant, handler } => {
                conn.prepare_cached("DELETE FROM parked WHERE tenant = ?1 AND handler = ?2")
                    .and_then(|mut st| st.execute(params![tenant, handler]))
                    .ctx(OP)?;
                sweep.resume()
            }
            Step::Read {
                source,
                after,
                limit,
                now,
                cutoff,
            } => sweep.read(sweep_read(conn, source, after, limit, now, cutoff)?),
            Step::Write(writes) => {
                sweep_write(conn, &writes)?;
                sweep.resume()
            }
            Step::Done(page) => return Ok(page),
        }
    }
}

/// The pairs of `parked` that no rule holds any more.
fn sweep_orphans(conn: &Connection) -> StoreResult<Vec<(String, String)>> {
    const OP: &str = "sweep";
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, handler FROM parked p WHERE NOT EXISTS \
               (SELECT 1 FROM rules r WHERE r.tenant = p.tenant AND r.handler = p.handler)",
        )
        .ctx(OP)?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).ctx(OP)?;
    rows.collect::<rusqlite::Result<_>>().ctx(OP)
}

/// Up to `limit` candidates of one source after `after`: the dead-worker
/// source walks `events_by_lease` up to now, the quiet source
/// `events_to_notify` below the cutoff.
fn sweep_read(
    conn: &Connection,
    source: Source,
    after: Option<SweepCursor>,
    limit: usize,
    now: Millis,
    cutoff: Millis,
) -> StoreResult<Vec<Candidate<SweepCursor>>> {
    const OP: &str = "sweep";
    let (sql, bound) = match source {
        Source::Expired => (SWEEP_EXPIRED_SQL, now),
        Source::Quiet => (SWEEP_QUIET_SQL, cutoff),
    };
    let after = after.unwrap_or((i64::MIN, i64::MIN));
    let mut stmt = conn.prepare_cached(sql).ctx(OP)?;
    let rows = stmt
        .query_map(
            params![now.0, bound.0, after.0, after.1, sql_limit(limit)],
            |r| {
                Ok(Candidate {
                    id: event_id(r, 0)?,
                    tenant: r.get(1)?,
                    handler: r.get(2)?,
                    ruled: r.get(3)?,
                    cursor: (r.get(4)?, r.get(5)?),
                })
            },
        )
        .ctx(OP)?;
    rows.collect::<rusqlite::Result<_>>().ctx(OP)
}

/// Stamps the notified ones, parks the parked ones and notes their pairs.
fn sweep_write(conn: &Connection, writes: &Writes) -> StoreResult<()> {
    const OP: &str = "sweep";
    let mut stamp = conn
        .prepare_cached("UPDATE events SET notified_at = ?2 WHERE id = ?1")
        .ctx(OP)?;
    for &id in &writes.notified {
        stamp.execute(params![blob(id), writes.at.0]).ctx(OP)?;
    }
    for &id in &writes.parked {
        stamp.execute(params![blob(id), PARKED.0]).ctx(OP)?;
    }
    let mut note_parked = conn
        .prepare_cached(
            "INSERT INTO parked (tenant, handler) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )
        .ctx(OP)?;
    for (tenant, handler) in &writes.parked_pairs {
        note_parked.execute(params![tenant, handler]).ctx(OP)?;
    }
    Ok(())
}

/// Each settle kind's statement, looked up in the cache once per batch.
#[derive(Default)]
struct SettleStatements<'c> {
    delete: Option<CachedStatement<'c>>,
    archive: Option<CachedStatement<'c>>,
    release: Option<CachedStatement<'c>>,
    bury: Option<CachedStatement<'c>>,
}

impl<'c> SettleStatements<'c> {
    /// The statement that writes `finish`.
    fn get(
        &mut self,
        conn: &'c Connection,
        finish: &Finish,
    ) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let (slot, sql) = match finish {
            Finish::Delete => (&mut self.delete, SETTLE_DELETE_SQL),
            Finish::Archive => (&mut self.archive, SETTLE_ARCHIVE_SQL),
            Finish::Release { .. } => (&mut self.release, SETTLE_RELEASE_SQL),
            Finish::Bury { .. } => (&mut self.bury, SETTLE_BURY_SQL),
        };
        match slot {
            Some(stmt) => Ok(stmt),
            empty => Ok(empty.insert(conn.prepare_cached(sql)?)),
        }
    }
}

/// Rows of a listing, read with a prepared statement.
fn list_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> StoreResult<Vec<Event>> {
    const OP: &str = "list";
    let mut stmt = conn.prepare_cached(sql).ctx(OP)?;
    let rows = stmt.query_map(params, event).ctx(OP)?;
    rows.collect::<rusqlite::Result<_>>().ctx(OP)
}

#[async_trait]
impl Store for SqliteStore {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        let events = events.to_vec();
        self.call("emit", move |conn, now| {
            const OP: &str = "emit";
            let mut existing = conn.prepare_cached(EXISTING_KEY_SQL).ctx(OP)?;
            let mut insert = conn
                .prepare_cached(
                    "INSERT INTO events (id, tenant, handler, payload, state, run_at, attempt, \
                       max_attempts, notified_at, idempotency_key, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, 0, ?5, 0, ?6, ?5, ?7, ?8, ?8) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .ctx(OP)?;
            let mut out = Vec::with_capacity(events.len());
            for e in &events {
                if let Some(key) = &e.idempotency_key {
                    let found = existing
                        .query_row(params![e.tenant, e.handler, key], |r| event_id(r, 0))
                        .optional()
                        .ctx(OP)?;
                    if let Some(id) = found {
                        out.push(Emitted::Existing(id));
                        continue;
                    }
                }
                let n = insert
                    .execute(params![
                        blob(e.id),
                        e.tenant,
                        e.handler,
                        e.payload,
                        e.run_at.0,
                        i64::from(e.max_attempts),
                        e.idempotency_key,
                        now.0,
                    ])
                    .ctx(OP)?;
                // An id that is already stored: a retried emit whose first
                // try committed. Report it rather than failing the batch.
                out.push(if n == 1 {
                    Emitted::Created(e.id)
                } else {
                    Emitted::Existing(e.id)
                });
            }
            Ok(out)
        })
        .await
    }

    async fn claim(
        &self,
        ids: &[EventId],
        handlers: &[String],
        token: LeaseToken,
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        if ids.is_empty() || handlers.is_empty() {
            return Ok(Vec::new());
        }
        if ids.len() > CLAIM_ONE_BY_ONE {
            return self.claim_batch(ids, handlers, token, lease).await;
        }
        let ids: Vec<[u8; 16]> = ids.iter().map(|&id| blob(id)).collect();
        let handlers: HashSet<String> = handlers.iter().cloned().collect();
        self.call("claim", move |conn, now| {
            const OP: &str = "claim";
            let mut handler_of = conn.prepare_cached(HANDLER_OF_SQL).ctx(OP)?;
            let mut take = conn.prepare_cached(CLAIM_ONE_SQL).ctx(OP)?;
            let (token, until) = (token_blob(token), now.plus(lease).0);
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                let handler: Option<String> = handler_of
                    .query_row([id], |r| r.get(0))
                    .optional()
                    .ctx(OP)?;
                if !handler.is_some_and(|h| handlers.contains(&h)) {
                    continue;
                }
                if let Some(e) = take
                    .query_row(params![token, until, now.0, id], event)
                    .optional()
                    .ctx(OP)?
                {
                    out.push(e);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection> {
        let ids = ids.to_vec();
        self.call("inspect", move |conn, now| {
            const OP: &str = "inspect";
            let mut load = conn
                .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?1"))
                .ctx(OP)?;
            let mut rules: HashMap<(String, String), RuleMatch> = HashMap::new();
            let mut found = Vec::with_capacity(ids.len());
            for &id in &ids {
                let Some(ev) = load.query_row([blob(id)], event).optional().ctx(OP)? else {
                    continue;
                };
                let key = (ev.tenant.clone(), ev.handler.clone());
                let m = match rules.get(&key) {
                    Some(m) => *m,
                    None => {
                        let m = rule_match(conn, OP, &ev.tenant, &ev.handler)?;
                        rules.insert(key, m);
                        m
                    }
                };
                found.push(Inspected {
                    event: ev,
                    rules: m,
                });
            }
            Ok(Inspection { found, now })
        })
        .await
    }

    async fn settle(&self, batch: &[Settle]) -> StoreResult<Vec<bool>> {
        let batch = batch.to_vec();
        self.call("settle", move |conn, now| {
            const OP: &str = "settle";
            let mut stmts = SettleStatements::default();
            let mut out = Vec::with_capacity(batch.len());
            for s in &batch {
                let id = blob(s.id);
                let token = s.token.map(token_blob);
                let stmt = stmts.get(conn, &s.finish).ctx(OP)?;
                let n = match &s.finish {
                    Finish::Delete => stmt.execute(params![id, token]),
                    Finish::Archive => stmt.execute(params![id, token, now.0]),
                    Finish::Release {
                        wait,
                        error,
                        give_back,
                    } => stmt.execute(params![
                        id,
                        token,
                        now.0,
                        now.plus(*wait).0,
                        i64::from(*give_back),
                        error
                    ]),
                    Finish::Bury { error } => stmt.execute(params![id, token, now.0, error]),
                }
                .ctx(OP)?;
                out.push(n == 1);
            }
            Ok(out)
        })
        .await
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        let leases = leases.to_vec();
        self.call("renew", move |conn, now| {
            const OP: &str = "renew";
            let mut stmt = conn
                .prepare_cached(
                    "UPDATE events SET lease_expires_at = ?3 \
                     WHERE id = ?1 AND lease_token = ?2 AND state = 0",
                )
                .ctx(OP)?;
            let until = now.plus(lease).0;
            leases
                .iter()
                .map(|l| {
                    stmt.execute(params![blob(l.id), token_blob(l.token), until])
                        .map(|n| n == 1)
                        .ctx(OP)
                })
                .collect()
        })
        .await
    }

    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool> {
        let rule = rule.clone();
        self.call("add_rule", move |conn, now| {
            conn.prepare_cached(
                "INSERT INTO rules (tenant, handler, kind, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT DO NOTHING",
            )
            .and_then(|mut st| {
                st.execute(params![
                    rule.tenant,
                    rule.handler,
                    rule.kind.as_str(),
                    now.0
                ])
            })
            .map(|n| n == 1)
            .ctx("add_rule")
        })
        .await
    }

    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool> {
        let rule = rule.clone();
        self.call("remove_rule", move |conn, _| {
            conn.prepare_cached(
                "DELETE FROM rules WHERE tenant = ?1 AND handler = ?2 AND kind = ?3",
            )
            .and_then(|mut st| st.execute(params![rule.tenant, rule.handler, rule.kind.as_str()]))
            .map(|n| n == 1)
            .ctx("remove_rule")
        })
        .await
    }

    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
        let (tenant, handler) = (tenant.to_string(), handler.to_string());
        self.call("rules_for", move |conn, _| {
            rule_match(conn, "rules_for", &tenant, &handler)
        })
        .await
    }

    async fn rules(&self) -> StoreResult<Vec<Rule>> {
        self.call("rules", move |conn, _| {
            const OP: &str = "rules";
            let mut stmt = conn
                .prepare_cached(
                    "SELECT tenant, handler, kind FROM rules ORDER BY tenant, handler, kind",
                )
                .ctx(OP)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .ctx(OP)?;
            let mut out = Vec::new();
            for row in rows {
                let (tenant, handler, kind) = row.ctx(OP)?;
                let kind = RuleKind::parse(&kind)
                    .ok_or_else(|| StoreError::backend(OP, format!("unknown rule kind {kind}")))?;
                out.push(Rule {
                    tenant,
                    handler,
                    kind,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn renotify_page(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<Scheduled>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (tenant, handler) = (tenant.to_string(), handler.to_string());
        self.call("renotify_page", move |conn, now| {
            const OP: &str = "renotify_page";
            let mut stmt = conn.prepare_cached(RENOTIFY_SQL).ctx(OP)?;
            let rows = stmt
                .query_map(
                    params![now.0, tenant, handler, after_blob(after), sql_limit(limit)],
                    |r| Ok((event_id(r, 0)?, Millis(r.get(1)?))),
                )
                .ctx(OP)?;
            let mut page: Vec<(EventId, Millis)> = rows.collect::<rusqlite::Result<_>>().ctx(OP)?;
            page.sort_unstable_by_key(|&(id, _)| id);
            Ok(page
                .into_iter()
                .map(|(id, run_at)| Scheduled {
                    notification: Notification {
                        tenant: tenant.clone(),
                        event_id: id,
                    },
                    delay: now.until(run_at),
                })
                .collect())
        })
        .await
    }

    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
        self.call("sweep", move |conn, now| {
            sweep_call(conn, now, quiet, pass, limit)
        })
        .await
    }

    async fn lead(&self, role: &str, holder: &str, lease: Duration) -> StoreResult<Leadership> {
        let (role, holder) = (role.to_string(), holder.to_string());
        self.call("lead", move |conn, now| {
            const OP: &str = "lead";
            let taken = conn
                .prepare_cached(
                    "INSERT INTO leaders (role, holder, expires_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (role) DO UPDATE \
                       SET holder = excluded.holder, expires_at = excluded.expires_at \
                       WHERE leaders.holder = excluded.holder OR leaders.expires_at <= ?4",
                )
                .and_then(|mut st| st.execute(params![role, holder, now.plus(lease).0, now.0]))
                .ctx(OP)?
                == 1;
            if taken {
                return Ok(Leadership {
                    leading: true,
                    left: lease,
                });
            }
            // Someone else holds it: the same connection, so the same moment.
            let expires: Option<i64> = conn
                .prepare_cached("SELECT expires_at FROM leaders WHERE role = ?1")
                .and_then(|mut st| st.query_row(params![role], |r| r.get(0)).optional())
                .ctx(OP)?;
            let left_ms = expires.map_or(0, |e| e.saturating_sub(now.0).max(0));
            Ok(Leadership {
                leading: false,
                left: Duration::from_millis(left_ms as u64),
            })
        })
        .await
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        let (role, holder) = (role.to_string(), holder.to_string());
        self.call("resign", move |conn, _| {
            conn.prepare_cached("DELETE FROM leaders WHERE role = ?1 AND holder = ?2")
                .and_then(|mut st| st.execute(params![role, holder]))
                .map(|_| ())
                .ctx("resign")
        })
        .await
    }

    async fn purge(
        &self,
        dead_before: Millis,
        done_before: Millis,
        limit: usize,
    ) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        self.call("purge", move |conn, _| {
            const OP: &str = "purge";
            let mut stmt = conn.prepare_cached(PURGE_SQL).ctx(OP)?;
            let dead = stmt
                .execute(params![
                    EventState::Dead.code(),
                    dead_before.0,
                    sql_limit(limit)
                ])
                .ctx(OP)?;
            let done = if dead < limit {
                stmt.execute(params![
                    EventState::Done.code(),
                    done_before.0,
                    sql_limit(limit - dead)
                ])
                .ctx(OP)?
            } else {
                0
            };
            Ok((dead + done) as u64)
        })
        .await
    }

    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.call("get", move |conn, _| {
            conn.prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?1"))
                .and_then(|mut st| st.query_row([blob(id)], event).optional())
                .ctx("get")
        })
        .await
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<AttemptError>> {
        let text: Option<String> = self
            .call("history", move |conn, _| {
                conn.prepare_cached("SELECT errors FROM events WHERE id = ?1")
                    .and_then(|mut st| st.query_row([blob(id)], |r| r.get(0)).optional())
                    .map(Option::flatten)
                    .ctx("history")
            })
            .await?;
        text.map_or(Ok(Vec::new()), |t| {
            serde_json::from_str(&t).map_err(|e| {
                StoreError::backend(format!("history: event {id} has unreadable errors"), e)
            })
        })
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let filter = filter.clone();
        self.call("list", move |conn, _| {
            let after = after_blob(filter.after);
            let lim = sql_limit(limit);
            match (&filter.tenant, &filter.handler, filter.state) {
                // One handler: walk the (tenant, handler, state, id) index,
                // one state range at a time, and merge.
                (Some(tenant), Some(handler), state) => {
                    let states = match state {
                        Some(s) => vec![s],
                        None => vec![EventState::Pending, EventState::Dead, EventState::Done],
                    };
                    let mut out = Vec::new();
                    for s in states {
                        out.extend(list_rows(
                            conn,
                            &format!(
                                "SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ?1 \
                                 AND handler = ?2 AND state = ?3 AND id > ?4 \
                                 ORDER BY id LIMIT ?5"
                            ),
                            params![tenant, handler, s.code(), after, lim],
                        )?);
                    }
                    out.sort_unstable_by_key(|e| e.id);
                    out.truncate(limit);
                    Ok(out)
                }
                // Otherwise walk the primary key from the cursor, filtering.
                (tenant, handler, state) => list_rows(
                    conn,
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM events WHERE id > ?1 \
                         AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR handler = ?3) \
                         AND (?4 IS NULL OR state = ?4) ORDER BY id LIMIT ?5"
                    ),
                    params![after, tenant, handler, state.map(EventState::code), lim],
                ),
            }
        })
        .await
    }

    async fn counts(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>> {
        let query = query.clone();
        self.call("counts", move |conn, now| {
            const OP: &str = "counts";
            // The pairs by a skip scan of events_by_handler: one seek per
            // pair, however many events each has.
            let mut next = conn
                .prepare_cached(
                    "SELECT tenant, handler FROM events WHERE (tenant, handler) > (?1, ?2) \
                     ORDER BY tenant, handler LIMIT 1",
                )
                .ctx(OP)?;
            let mut pairs: Vec<(String, String)> = Vec::new();
            let mut at = (query.tenant.clone().unwrap_or_default(), String::new());
            while let Some(pair) = next
                .query_row(params![at.0, at.1], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .optional()
                .ctx(OP)?
            {
                if query.tenant.as_ref().is_some_and(|t| *t != pair.0) {
                    break;
                }
                if query.handler.as_ref().is_none_or(|h| *h == pair.1) {
                    pairs.push(pair.clone());
                }
                at = pair;
            }
            // Per state, at most `cap` entries of the covering index: the
            // count, and the ids that extrapolate it beyond the cap.
            let mut capped = conn
                .prepare_cached(
                    // One read of at most the cap: the cap-th id, and only
                    // when there is none, the exact count below it.
                    "SELECT CASE WHEN c.at_cap IS NULL \
                              THEN (SELECT count(*) FROM events \
                                    WHERE tenant = ?1 AND handler = ?2 AND state = ?3) \
                              ELSE ?4 END, \
                            (SELECT id FROM events WHERE tenant = ?1 AND handler = ?2 AND state = ?3 \
                              ORDER BY id LIMIT 1), \
                            c.at_cap, \
                            (SELECT id FROM events WHERE tenant = ?1 AND handler = ?2 AND state = ?3 \
                              ORDER BY id DESC LIMIT 1) \
                     FROM (SELECT (SELECT id FROM events \
                                   WHERE tenant = ?1 AND handler = ?2 AND state = ?3 \
                                   ORDER BY id LIMIT 1 OFFSET ?4 - 1) AS at_cap) AS c",
                )
                .ctx(OP)?;
            let mut held = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM rules WHERE tenant = ?1 AND handler = ?2)",
                )
                .ctx(OP)?;
            let mut sample = conn
                .prepare_cached(
                    "SELECT count(*), \
                       coalesce(sum(lease_expires_at > ?3), 0), \
                       coalesce(sum((lease_expires_at IS NULL OR lease_expires_at <= ?3) \
                                    AND run_at > ?3), 0) \
                     FROM (SELECT run_at, lease_expires_at FROM events \
                           WHERE tenant = ?1 AND handler = ?2 AND state = 0 \
                           ORDER BY id LIMIT ?4)",
                )
                .ctx(OP)?;
            let cap = i64::try_from(query.exact_up_to.max(1)).unwrap_or(i64::MAX);
            let split = i64::try_from(query.split_up_to).unwrap_or(i64::MAX);
            let mut out = Vec::with_capacity(pairs.len());
            for (tenant, handler) in pairs {
                let mut by_state = [CappedCount::default(); 3];
                for (i, state) in [EventState::Pending, EventState::Dead, EventState::Done]
                    .into_iter()
                    .enumerate()
                {
                    by_state[i] = capped
                        .query_row(params![tenant, handler, state.code(), cap], |r| {
                            let id = |i| {
                                r.get::<_, Option<[u8; 16]>>(i)
                                    .map(|b| b.map(|b| EventId(uuid::Uuid::from_bytes(b))))
                            };
                            let span = match (id(1)?, id(2)?, id(3)?) {
                                (Some(a), Some(b), Some(c)) => Some([a, b, c]),
                                _ => None,
                            };
                            Ok(CappedCount {
                                counted: r.get::<_, i64>(0)?.max(0) as u64,
                                span,
                            })
                        })
                        .ctx(OP)?;
                }
                let is_held: bool = held
                    .query_row(params![tenant, handler], |r| r.get(0))
                    .ctx(OP)?;
                let seen = if is_held || by_state[0].counted == 0 || split == 0 {
                    PendingSample::default()
                } else {
                    sample
                        .query_row(params![tenant, handler, now.0, split], |r| {
                            Ok(PendingSample {
                                read: r.get::<_, i64>(0)?.max(0) as u64,
                                running: r.get::<_, i64>(1)?.max(0) as u64,
                                delayed: r.get::<_, i64>(2)?.max(0) as u64,
                            })
                        })
                        .ctx(OP)?
                };
                out.push(HandlerCounts::from_parts(
                    tenant, handler, by_state, is_held, seen,
                ));
            }
            Ok(out)
        })
        .await
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        self.call("revive", move |conn, now| {
            const OP: &str = "revive";
            // Reviving must not make a second live event with the same
            // idempotency key (the unique index would refuse it anyway).
            let clash: Option<EventId> = conn
                .prepare_cached(
                    "SELECT live.id FROM events AS dead JOIN events AS live \
                       ON live.tenant = dead.tenant AND live.handler = dead.handler \
                      AND live.idempotency_key = dead.idempotency_key AND live.state = 0 \
                     WHERE dead.id = ?1 AND dead.state = 1",
                )
                .and_then(|mut st| st.query_row([blob(id)], |r| event_id(r, 0)).optional())
                .ctx(OP)?;
            if let Some(live) = clash {
                return Err(StoreError::Invalid(format!(
                    "cannot revive {id}: event {live} is live with the same idempotency key"
                )));
            }
            conn.prepare_cached(
                "UPDATE events SET state = 0, attempt = 0, run_at = ?2, notified_at = ?2, \
                   lease_token = NULL, lease_expires_at = NULL, finished_at = NULL, \
                   updated_at = ?2 \
                 WHERE id = ?1 AND state = 1 RETURNING tenant",
            )
            .and_then(|mut st| {
                st.query_row(params![blob(id), now.0], |r| r.get::<_, String>(0))
                    .optional()
            })
            .map(|t| t.map(|tenant| Scheduled::due(tenant, id)))
            .ctx(OP)
        })
        .await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        self.call("delete", move |conn, now| {
            conn.prepare_cached(
                "DELETE FROM events WHERE id = ?1 \
                 AND NOT (state = 0 AND lease_expires_at IS NOT NULL AND lease_expires_at > ?2)",
            )
            .and_then(|mut st| st.execute(params![blob(id), now.0]))
            .map(|n| n == 1)
            .ctx("delete")
        })
        .await
    }
}

/// Claims of up to this many ids run one statement per id
/// ([`CLAIM_ONE_SQL`]); larger ones one statement for the batch
/// ([`CLAIM_BATCH_SQL`]).
///
/// Both are planned as a primary-key search per id (the plan tests check).
/// The batch form binds the ids and the handler names as `rarray`s, which
/// SQLite materializes into two ephemeral tables per execution: cheap per id
/// in a batch of 512 (about 30% faster than 512 single statements), but the
/// larger part of the cost when the runtime claims one or two ids at a time,
/// where the single statements are about 30% faster.
const CLAIM_ONE_BY_ONE: usize = 4;

/// The single-id claim's handler check: the event's handler, by primary key,
/// tested in Rust. It runs in the same write transaction as the
/// compare-and-set that follows, so nothing changes the row in between.
const HANDLER_OF_SQL: &str = "SELECT handler FROM events WHERE id = ?1";

/// The happy path's compare-and-set for one id: pending, due, unleased or
/// expired, attempts left, no rule (the handler was checked just before).
/// `?1` token, `?2` new expiry, `?3` now, `?4` the id.
const CLAIM_ONE_SQL: &str = "UPDATE events \
     SET attempt = attempt + 1, lease_token = ?1, lease_expires_at = ?2, updated_at = ?3 \
     WHERE id = ?4 \
       AND state = 0 \
       AND run_at <= ?3 \
       AND (lease_expires_at IS NULL OR lease_expires_at <= ?3) \
       AND attempt < max_attempts \
       AND NOT EXISTS (SELECT 1 FROM rules r \
                       WHERE r.tenant = events.tenant AND r.handler = events.handler) \
     RETURNING id, tenant, handler, payload, state, run_at, attempt, max_attempts, \
       lease_token, lease_expires_at, last_error, idempotency_key, created_at, updated_at";

/// The happy path in one statement for a batch: pending, due, unleased or
/// expired, attempts left, a handler this worker has, no rule. `?1` token,
/// `?2` new expiry, `?3` now, `?4` the ids (rarray), `?5` the handlers
/// (rarray). `id IN rarray(?4)` is planned as a loop over the array with a
/// primary-key search per element (`SEARCH events USING INDEX sqlite_autoindex_events_1 (id=?)`).
const CLAIM_BATCH_SQL: &str = "UPDATE events \
     SET attempt = attempt + 1, lease_token = ?1, lease_expires_at = ?2, updated_at = ?3 \
     WHERE id IN rarray(?4) \
       AND state = 0 \
       AND run_at <= ?3 \
       AND (lease_expires_at IS NULL OR lease_expires_at <= ?3) \
       AND attempt < max_attempts \
       AND handler IN rarray(?5) \
       AND NOT EXISTS (SELECT 1 FROM rules r \
                       WHERE r.tenant = events.tenant AND r.handler = events.handler) \
     RETURNING id, tenant, handler, payload, state, run_at, attempt, max_attempts, \
       lease_token, lease_expires_at, last_error, idempotency_key, created_at, updated_at";

/// The live event with an idempotency key: `?1` tenant, `?2` handler, `?3`
/// key. The literal `state = 0` lets the planner use the partial unique index.
const EXISTING_KEY_SQL: &str = "SELECT id FROM events \
     WHERE tenant = ?1 AND handler = ?2 AND idempotency_key = ?3 AND state = 0";

/// One page of a handler's pending events, stamped notified: `?1` now,
/// `?2` tenant, `?3` handler, `?4` cursor, `?5` page size.
const RENOTIFY_SQL: &str = "UPDATE events SET notified_at = max(run_at, ?1) \
     WHERE id IN (SELECT id FROM events \
                  WHERE tenant = ?2 AND handler = ?3 AND state = 0 AND id > ?4 \
                  ORDER BY id LIMIT ?5) \
     RETURNING id, run_at";

/// Old dead or done events: `?1` state, `?2` finished before, `?3` limit.
const PURGE_SQL: &str = "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events \
     WHERE state = ?1 AND finished_at < ?2 LIMIT ?3)";

/// Settle statements: `?1` id, `?2` the fence token (`IS`, so `NULL` fences
/// on "no lease"). Only pending events have runs to end.
const SETTLE_DELETE_SQL: &str =
    "DELETE FROM events WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now.
const SETTLE_ARCHIVE_SQL: &str = "UPDATE events \
     SET state = 2, finished_at = ?3, updated_at = ?3, lease_token = NULL, lease_expires_at = NULL \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now, `?4` the new run_at, `?5` 1 to give the attempt back, `?6` error.
const SETTLE_RELEASE_SQL: &str = "UPDATE events \
     SET lease_token = NULL, lease_expires_at = NULL, run_at = ?4, notified_at = ?4, \
         attempt = max(attempt - ?5, 0), last_error = coalesce(?6, last_error), updated_at = ?3, \
         errors = CASE WHEN ?6 IS NULL THEN errors ELSE json_insert(coalesce(errors, '[]'), '$[#]', \
             json_object('attempt', attempt, 'at', ?3, 'error', ?6)) END \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now, `?4` error.
const SETTLE_BURY_SQL: &str = "UPDATE events \
     SET state = 1, finished_at = ?3, updated_at = ?3, last_error = ?4, \
         lease_token = NULL, lease_expires_at = NULL, \
         errors = json_insert(coalesce(errors, '[]'), '$[#]', \
             json_object('attempt', attempt, 'at', ?3, 'error', ?4)) \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// Unparks up to `?3` parked events (`notified_at` = `?4`, [`PARKED`]) of
/// one handler (`?1` tenant, `?2` handler), walking its pending range of
/// `events_by_handler`.
const UNPARK_SQL: &str = "UPDATE events SET notified_at = run_at \
     WHERE id IN (SELECT id FROM events WHERE tenant = ?1 AND handler = ?2 AND state = 0 \
                  AND notified_at = ?4 LIMIT ?3)";

/// The sweep's dead-worker source, walking `events_by_lease`: `?1` now,
/// `?2` the bound (now), `?3`/`?4` the cursor, `?5` the chunk size.
const SWEEP_EXPIRED_SQL: &str = "SELECT id, tenant, handler, \
       EXISTS (SELECT 1 FROM rules r WHERE r.tenant = e.tenant AND r.handler = e.handler), \
       lease_expires_at, rowid \
     FROM events e \
     WHERE lease_expires_at <= ?2 AND (lease_expires_at, rowid) > (?3, ?4) \
       AND state = 0 AND run_at <= ?1 AND notified_at < lease_expires_at \
     ORDER BY lease_expires_at, rowid LIMIT ?5";

/// The sweep's quiet source, walking `events_to_notify`: `?1` now, `?2` the
/// pass's cutoff (now - quiet at its start; strictly before, so that events
/// stamped by the pass's first call are above it even with no quiet), `?3`/`?4`
/// the cursor, `?5` the chunk size. Events with a live lease are running:
/// skipped, not stamped.
const SWEEP_QUIET_SQL: &str = "SELECT id, tenant, handler, \
       EXISTS (SELECT 1 FROM rules r WHERE r.tenant = e.tenant AND r.handler = e.handler), \
       notified_at, rowid \
     FROM events e \
     WHERE state = 0 AND notified_at < ?2 AND (notified_at, rowid) > (?3, ?4) \
       AND run_at <= ?1 AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) \
     ORDER BY notified_at, rowid LIMIT ?5";

#[cfg(test)]
mod plan_tests;

#[cfg(test)]
mod group_tests;
