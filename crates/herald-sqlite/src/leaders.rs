//! Leader election: a role held by one holder until its lease expires.

use std::time::Duration;

use herald::backend::StoreResult;
use herald::{Leadership, Millis};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::Ctx;

/// [`herald::backend::LeaderElection::lead`]: takes or keeps `role` for `holder`, or says how
/// long the current holder has left.
pub(crate) fn lead(
    conn: &Connection,
    now: Millis,
    role: &str,
    holder: &str,
    lease: Duration,
) -> StoreResult<Leadership> {
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
}

/// [`herald::backend::LeaderElection::resign`]: gives `role` up if `holder` holds it.
pub(crate) fn resign(conn: &Connection, role: &str, holder: &str) -> StoreResult<()> {
    conn.prepare_cached("DELETE FROM leaders WHERE role = ?1 AND holder = ?2")
        .and_then(|mut st| st.execute(params![role, holder]))
        .map(|_| ())
        .ctx("resign")
}
