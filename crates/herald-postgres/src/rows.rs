//! Conversions between herald's types and PostgreSQL rows.

use std::time::Duration;

use herald::{Event, EventId, EventState, Lease, LeaseToken, Millis, StoreError};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

/// The columns [`event`] reads, in order, each prefixed with `e.`.
pub(crate) const EVENT_COLUMNS: &str = "e.id, e.tenant, e.handler, e.payload, e.state, e.run_at, \
     e.attempt, e.max_attempts, e.lease_token, e.lease_expires_at, e.last_error, \
     e.idempotency_key, e.created_at, e.updated_at, e.topic, e.concurrency_key, e.rate_turn";

/// How many columns [`EVENT_COLUMNS`] has.
pub(crate) const EVENT_COLUMN_COUNT: usize = 17;

/// What went wrong inside the store, before it becomes a [`StoreError`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    /// A statement failed; `op` names the store operation.
    #[error("{op}: {source}")]
    Sql {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },
    /// Anything else, already in herald's terms.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl DbError {
    /// A deadlock victim or a serialization failure: the statement did
    /// nothing and may simply run again.
    pub(crate) fn transient(&self) -> bool {
        match self {
            DbError::Sql {
                source: sqlx::Error::Database(e),
                ..
            } => matches!(e.code().as_deref(), Some("40P01" | "40001")),
            _ => false,
        }
    }

    /// The connection was lost or could not be had: an I/O error, a pool
    /// that found no live connection in time, or the server's "admin
    /// shutdown" class (57P01 terminated, 57P02 crash shutdown, 57P03
    /// cannot connect now) and connection exceptions (08xxx). The
    /// statement may or may not have committed.
    pub(crate) fn connection_lost(&self) -> bool {
        match self {
            DbError::Sql { source, .. } => connection_error(source),
            DbError::Store(_) => false,
        }
    }
}

pub(crate) fn connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Store(e) => e,
            DbError::Sql { op, source } if connection_error(&source) => StoreError::Unavailable {
                op,
                source: Box::new(source),
            },
            DbError::Sql { op, source } => StoreError::backend(op, source),
        }
    }
}

/// Results inside the store.
pub(crate) type DbResult<T> = Result<T, DbError>;

/// `.ctx("op")` on sqlx results.
pub(crate) trait Ctx<T> {
    fn ctx(self, op: &'static str) -> Result<T, DbError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, op: &'static str) -> Result<T, DbError> {
        self.map_err(|source| DbError::Sql { op, source })
    }
}

fn bad(index: usize, what: String) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: what.into(),
    }
}

pub(crate) fn state_from(index: usize, v: i16) -> Result<EventState, sqlx::Error> {
    EventState::from_code(v.into()).ok_or_else(|| bad(index, format!("unknown event state {v}")))
}

fn u32_at(row: &PgRow, index: usize) -> Result<u32, sqlx::Error> {
    let v: i32 = row.try_get(index)?;
    u32::try_from(v).map_err(|_| bad(index, format!("{v} is out of range")))
}

/// Reads [`EVENT_COLUMNS`] starting at column `at`. `None` when the id is
/// NULL (the empty side of an outer join).
pub(crate) fn event(row: &PgRow, at: usize) -> Result<Option<Event>, sqlx::Error> {
    let Some(id) = row.try_get::<Option<Uuid>, _>(at)? else {
        return Ok(None);
    };
    let token: Option<Uuid> = row.try_get(at + 8)?;
    let expires: Option<i64> = row.try_get(at + 9)?;
    let lease = match (token, expires) {
        (Some(t), Some(until)) => Some(Lease {
            token: LeaseToken(t),
            expires_at: Millis(until),
        }),
        (None, None) => None,
        _ => {
            return Err(bad(
                at + 8,
                "lease_token and lease_expires_at must both be set or both NULL".into(),
            ))
        }
    };
    Ok(Some(Event {
        id: EventId(id),
        tenant: row.try_get(at + 1)?,
        handler: row.try_get(at + 2)?,
        payload: row.try_get(at + 3)?,
        state: state_from(at + 4, row.try_get(at + 4)?)?,
        run_at: Millis(row.try_get(at + 5)?),
        attempt: u32_at(row, at + 6)?,
        max_attempts: u32_at(row, at + 7)?,
        lease,
        last_error: row.try_get(at + 10)?,
        idempotency_key: row.try_get(at + 11)?,
        topic: row.try_get(at + 14)?,
        concurrency_key: row.try_get(at + 15)?,
        rate_turn: row.try_get::<Option<i64>, _>(at + 16)?.map(Millis),
        created_at: Millis(row.try_get(at + 12)?),
        updated_at: Millis(row.try_get(at + 13)?),
    }))
}

/// Reads an event that must be there.
pub(crate) fn event_row(row: &PgRow) -> Result<Event, sqlx::Error> {
    event(row, 0)?.ok_or_else(|| bad(0, "the event id is NULL".into()))
}

/// A `Duration` in milliseconds for SQL, capped at a century so that adding
/// it to a time can neither overflow nor reach the parked mark.
pub(crate) fn ms(d: Duration) -> i64 {
    const CENTURY_MS: u128 = 100 * 365 * 24 * 3600 * 1000;
    d.as_millis().min(CENTURY_MS) as i64
}

/// A limit as an SQL `bigint`.
pub(crate) fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Event ids as UUIDs, to bind as an array.
pub(crate) fn uuids(ids: &[EventId]) -> Vec<Uuid> {
    ids.iter().map(|id| id.0).collect()
}

/// `max_attempts` as stored (an `integer`): values beyond `i32::MAX` are
/// stored as `i32::MAX`, which is as good as unlimited.
pub(crate) fn max_attempts(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_statement_keeps_sqlx_s_error_as_the_source() {
        let failed: Result<(), sqlx::Error> = Err(sqlx::Error::RowNotFound);
        let e = StoreError::from(failed.ctx("claim").unwrap_err());
        match &e {
            StoreError::Backend { context, source } => {
                assert_eq!(context, "claim");
                assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
            }
            other => panic!("expected Backend, got {other:?}"),
        }
        assert!(e.to_string().starts_with("store failed: claim: "), "{e}");
    }
}
