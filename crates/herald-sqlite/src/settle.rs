//! The hot path's second half: settling runs (each kind of end, fenced by
//! the lease token) and renewing the leases of runs still going.

use std::time::Duration;

use herald::backend::{Finish, LeaseRef, Settle, StoreResult};
use herald::Millis;
use rusqlite::{params, CachedStatement, Connection};

use crate::rows::{blob, token_blob, Ctx};

/// Settle statements: `?1` id, `?2` the fence token (`IS`, so `NULL` fences
/// on "no lease"). Only pending events have runs to end.
pub(crate) const SETTLE_DELETE_SQL: &str =
    "DELETE FROM events WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now.
pub(crate) const SETTLE_ARCHIVE_SQL: &str = "UPDATE events \
     SET state = 2, finished_at = ?3, updated_at = ?3, lease_token = NULL, lease_expires_at = NULL \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now, `?4` the new run_at, `?5` 1 to give the attempt back, `?6` error.
pub(crate) const SETTLE_RELEASE_SQL: &str = "UPDATE events \
     SET lease_token = NULL, lease_expires_at = NULL, run_at = ?4, notified_at = ?4, \
         attempt = max(attempt - ?5, 0), last_error = coalesce(?6, last_error), updated_at = ?3, \
         errors = CASE WHEN ?6 IS NULL THEN errors ELSE json_insert(coalesce(errors, '[]'), '$[#]', \
             json_object('attempt', attempt, 'at', ?3, 'error', ?6)) END \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

/// `?3` now, `?4` error.
pub(crate) const SETTLE_BURY_SQL: &str = "UPDATE events \
     SET state = 1, finished_at = ?3, updated_at = ?3, last_error = ?4, \
         lease_token = NULL, lease_expires_at = NULL, \
         errors = json_insert(coalesce(errors, '[]'), '$[#]', \
             json_object('attempt', attempt, 'at', ?3, 'error', ?4)) \
     WHERE id = ?1 AND lease_token IS ?2 AND state = 0";

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

/// [`herald::backend::EventStore::settle`]: whether each item's fence held.
pub(crate) fn settle(conn: &Connection, now: Millis, batch: &[Settle]) -> StoreResult<Vec<bool>> {
    const OP: &str = "settle";
    let mut stmts = SettleStatements::default();
    let mut out = Vec::with_capacity(batch.len());
    for s in batch {
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
}

/// [`herald::backend::EventStore::renew`]: whether each lease was still held.
pub(crate) fn renew(
    conn: &Connection,
    now: Millis,
    leases: &[LeaseRef],
    lease: Duration,
) -> StoreResult<Vec<bool>> {
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
}
