//! The sweep's primitives: the core's [`Sweep`] decides, these statements
//! read its candidates, stamp and park them, and un-park orphans.

use std::time::Duration;

use herald::backend::sweep::{Candidate, Source, Step, Sweep, Writes, PARKED};
use herald::backend::{StoreResult, SweepPage, SweepPass};
use herald::Millis;
use rusqlite::{params, Connection};

use crate::rows::{blob, event_id, sql_limit, Ctx};

/// Unparks up to `?3` parked events (`notified_at` = `?4`, [`PARKED`]) of
/// one handler (`?1` tenant, `?2` handler), walking its pending range of
/// `events_by_handler`.
pub(crate) const UNPARK_SQL: &str = "UPDATE events SET notified_at = run_at \
     WHERE id IN (SELECT id FROM events WHERE tenant = ?1 AND handler = ?2 AND state = 0 \
                  AND notified_at = ?4 LIMIT ?3)";

/// The sweep's dead-worker source, walking `events_by_lease`: `?1` now,
/// `?2` the bound (now), `?3`/`?4` the cursor, `?5` the chunk size.
pub(crate) const SWEEP_EXPIRED_SQL: &str = "SELECT id, tenant, handler, \
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
pub(crate) const SWEEP_QUIET_SQL: &str = "SELECT id, tenant, handler, \
       EXISTS (SELECT 1 FROM rules r WHERE r.tenant = e.tenant AND r.handler = e.handler), \
       notified_at, rowid \
     FROM events e \
     WHERE state = 0 AND notified_at < ?2 AND (notified_at, rowid) > (?3, ?4) \
       AND run_at <= ?1 AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) \
     ORDER BY notified_at, rowid LIMIT ?5";

/// The sweep's keyset cursor: the key of the index walked (`notified_at`
/// or `lease_expires_at`) and the rowid (the index's tie-breaker).
type SweepCursor = (i64, i64);

/// [`herald::backend::Reconciliation::sweep`]: carries out one sweep call's [`Step`]s on the
/// writer thread's transaction.
pub(crate) fn page(
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
            Step::ListOrphans => sweep.orphans(orphans(conn)?),
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
            } => sweep.read(read(conn, source, after, limit, now, cutoff)?),
            Step::Write(writes) => {
                write(conn, &writes)?;
                sweep.resume()
            }
            Step::Done(page) => return Ok(page),
        }
    }
}

/// The pairs of `parked` that no rule holds any more.
fn orphans(conn: &Connection) -> StoreResult<Vec<(String, String)>> {
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
fn read(
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
fn write(conn: &Connection, writes: &Writes) -> StoreResult<()> {
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
