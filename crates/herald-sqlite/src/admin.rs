//! The operator's writes: reviving a dead event, deleting one, purging
//! old dead and done events.

use herald::backend::{Scheduled, StoreResult};
use herald::{EventId, EventState, Millis, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{blob, event_id, sql_limit, Ctx};

/// Old dead or done events: `?1` state, `?2` finished before, `?3` limit.
pub(crate) const PURGE_SQL: &str = "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events \
     WHERE state = ?1 AND finished_at < ?2 LIMIT ?3)";

/// [`herald::backend::Operator::revive`]: the revived event's notification, if it was
/// dead.
pub(crate) fn revive(
    conn: &Connection,
    now: Millis,
    id: EventId,
) -> StoreResult<Option<Scheduled>> {
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
}

/// [`herald::backend::Operator::delete`]: whether an event that is not running was
/// deleted.
pub(crate) fn delete(conn: &Connection, now: Millis, id: EventId) -> StoreResult<bool> {
    conn.prepare_cached(
        "DELETE FROM events WHERE id = ?1 \
                 AND NOT (state = 0 AND lease_expires_at IS NOT NULL AND lease_expires_at > ?2)",
    )
    .and_then(|mut st| st.execute(params![blob(id), now.0]))
    .map(|n| n == 1)
    .ctx("delete")
}

/// [`herald::backend::Reconciliation::purge`]: how many old dead, then done, events were
/// deleted, up to `limit`.
pub(crate) fn purge(
    conn: &Connection,
    dead_before: Millis,
    done_before: Millis,
    limit: usize,
) -> StoreResult<u64> {
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
}
