//! Conversions between herald's types and SQLite values.

use herald::backend::StoreError;
use herald::{Event, EventId, EventState, Lease, LeaseToken, Millis};
use rusqlite::types::Type;
use rusqlite::Row;
use uuid::Uuid;

/// The columns [`event`] reads, in order.
pub(crate) const EVENT_COLUMNS: &str = "id, tenant, handler, payload, state, run_at, attempt, \
     max_attempts, lease_token, lease_expires_at, last_error, idempotency_key, created_at, \
     updated_at, topic, concurrency_key, rate_turn";

/// Wraps a rusqlite error as a backend error naming the operation.
pub(crate) fn backend(op: &str, e: rusqlite::Error) -> StoreError {
    StoreError::backend(op, e)
}

/// `.ctx("op")` on rusqlite results.
pub(crate) trait Ctx<T> {
    fn ctx(self, op: &str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for rusqlite::Result<T> {
    fn ctx(self, op: &str) -> Result<T, StoreError> {
        self.map_err(|e| backend(op, e))
    }
}

fn bad(idx: usize, ty: Type, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, ty, what.into())
}

fn state_from(idx: usize, v: i64) -> rusqlite::Result<EventState> {
    EventState::from_code(v)
        .ok_or_else(|| bad(idx, Type::Integer, format!("unknown event state {v}")))
}

fn uuid_at(row: &Row<'_>, idx: usize) -> rusqlite::Result<Uuid> {
    let bytes: [u8; 16] = row.get(idx)?;
    Ok(Uuid::from_bytes(bytes))
}

fn u32_at(row: &Row<'_>, idx: usize) -> rusqlite::Result<u32> {
    let v: i64 = row.get(idx)?;
    u32::try_from(v).map_err(|_| bad(idx, Type::Integer, format!("{v} is out of range")))
}

/// An id as its BLOB.
pub(crate) fn blob(id: EventId) -> [u8; 16] {
    *id.0.as_bytes()
}

/// A lease token as its BLOB.
pub(crate) fn token_blob(token: LeaseToken) -> [u8; 16] {
    *token.0.as_bytes()
}

/// The keyset cursor as a BLOB; with no cursor a zero-length BLOB, which
/// sorts before every 16-byte id.
pub(crate) fn after_blob(after: Option<EventId>) -> Vec<u8> {
    after.map(|a| blob(a).to_vec()).unwrap_or_default()
}

/// A limit as an SQL integer.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Reads an id column.
pub(crate) fn event_id(row: &Row<'_>, idx: usize) -> rusqlite::Result<EventId> {
    uuid_at(row, idx).map(EventId)
}

/// Reads [`EVENT_COLUMNS`] starting at column 0.
pub(crate) fn event(row: &Row<'_>) -> rusqlite::Result<Event> {
    let token: Option<[u8; 16]> = row.get(8)?;
    let expires: Option<i64> = row.get(9)?;
    let lease = match (token, expires) {
        (Some(t), Some(at)) => Some(Lease {
            token: LeaseToken(Uuid::from_bytes(t)),
            expires_at: Millis(at),
        }),
        (None, None) => None,
        _ => {
            return Err(bad(
                8,
                Type::Blob,
                "lease_token and lease_expires_at must both be set or both NULL".into(),
            ))
        }
    };
    Ok(Event {
        id: event_id(row, 0)?,
        tenant: row.get(1)?,
        handler: row.get(2)?,
        payload: row.get(3)?,
        state: state_from(4, row.get(4)?)?,
        run_at: Millis(row.get(5)?),
        attempt: u32_at(row, 6)?,
        max_attempts: u32_at(row, 7)?,
        lease,
        last_error: row.get(10)?,
        idempotency_key: row.get(11)?,
        topic: row.get(14)?,
        concurrency_key: row.get(15)?,
        rate_turn: row.get::<_, Option<i64>>(16)?.map(Millis),
        created_at: Millis(row.get(12)?),
        updated_at: Millis(row.get(13)?),
    })
}
