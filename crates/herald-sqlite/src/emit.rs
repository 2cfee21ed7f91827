//! Storing new events: one insert per event, after a look-up of its
//! idempotency key.

use herald::store::StoreResult;
use herald::{Emitted, Millis, NewEvent};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{blob, event_id, Ctx};

/// The live event with an idempotency key: `?1` tenant, `?2` handler, `?3`
/// key. The literal `state = 0` lets the planner use the partial unique index.
pub(crate) const EXISTING_KEY_SQL: &str = "SELECT id FROM events \
     WHERE tenant = ?1 AND handler = ?2 AND idempotency_key = ?3 AND state = 0";

/// [`herald::Store::emit`]: each event created, or the one that already
/// holds its id or its idempotency key.
pub(crate) fn emit(
    conn: &Connection,
    now: Millis,
    events: &[NewEvent],
) -> StoreResult<Vec<Emitted>> {
    const OP: &str = "emit";
    let mut existing = conn.prepare_cached(EXISTING_KEY_SQL).ctx(OP)?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO events (id, tenant, handler, payload, state, run_at, attempt, \
                       max_attempts, notified_at, idempotency_key, created_at, updated_at, topic) \
                     VALUES (?1, ?2, ?3, ?4, 0, ?5, 0, ?6, ?5, ?7, ?8, ?8, ?9) \
                     ON CONFLICT (id) DO NOTHING",
        )
        .ctx(OP)?;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
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
                e.topic,
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
}
