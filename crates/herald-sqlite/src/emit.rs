//! Storing new events: one insert per event, after a look-up of its
//! idempotency key; a keyed event's key row is written with it, so that
//! the key names it after it finished too (ADR 0013).

use herald::backend::StoreResult;
use herald::{Emitted, Keep, Millis, NewEvent};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{blob, event_id, sql_limit, Ctx};

/// The live event with an idempotency key: `?1` tenant, `?2` handler, `?3`
/// key. The literal `state = 0` lets the planner use the partial unique index.
pub(crate) const EXISTING_KEY_SQL: &str = "SELECT id FROM events \
     WHERE tenant = ?1 AND handler = ?2 AND idempotency_key = ?3 AND state = 0";

/// The event a stored key names: `?1` tenant, `?2` handler, `?3` key.
pub(crate) const KEY_SQL: &str = "SELECT event_id FROM idempotency_keys \
     WHERE tenant = ?1 AND handler = ?2 AND key = ?3";

/// A key's row, naming its event: `?1` tenant, `?2` handler, `?3` key, `?4`
/// event id, `?5` now.
pub(crate) const STORE_KEY_SQL: &str = "INSERT INTO idempotency_keys \
     (tenant, handler, key, event_id, stored_at) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (tenant, handler, key) DO UPDATE SET event_id = excluded.event_id, \
     stored_at = excluded.stored_at";

/// The oldest waiting event of a singleton key (pending, not under a live
/// lease): `?1` tenant, `?2` handler, `?3` key, `?4` now.
const SINGLETON_WAITING_SQL: &str = "SELECT id FROM events \
     WHERE tenant = ?1 AND handler = ?2 AND singleton_key = ?3 AND state = 0 \
       AND (lease_expires_at IS NULL OR lease_expires_at <= ?4) ORDER BY id LIMIT 1";

/// Deletes a singleton key's waiting events: as [`SINGLETON_WAITING_SQL`].
const SINGLETON_REPLACE_SQL: &str = "DELETE FROM events \
     WHERE tenant = ?1 AND handler = ?2 AND singleton_key = ?3 AND state = 0 \
       AND (lease_expires_at IS NULL OR lease_expires_at <= ?4)";

/// [`herald::backend::EventStore::emit`]: each event created, or the one that already
/// holds its id or its idempotency key (a stored key, or a live event that
/// has none: emitted before keys were stored, or revived). A delay is
/// counted from `now`, the store's clock.
pub(crate) fn emit(
    conn: &Connection,
    now: Millis,
    events: &[NewEvent],
) -> StoreResult<Vec<Emitted>> {
    const OP: &str = "emit";
    let mut existing = conn.prepare_cached(EXISTING_KEY_SQL).ctx(OP)?;
    let mut stored_key = conn.prepare_cached(KEY_SQL).ctx(OP)?;
    let mut store_key = conn.prepare_cached(STORE_KEY_SQL).ctx(OP)?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO events (id, tenant, handler, payload, state, run_at, attempt, \
                       max_attempts, notified_at, idempotency_key, created_at, updated_at, topic, \
                       concurrency_key, singleton_key) \
                     VALUES (?1, ?2, ?3, ?4, 0, ?5, 0, ?6, ?5, ?7, ?8, ?8, ?9, ?10, ?11) \
                     ON CONFLICT (id) DO NOTHING",
        )
        .ctx(OP)?;
    let mut waiting = conn.prepare_cached(SINGLETON_WAITING_SQL).ctx(OP)?;
    let mut replace = conn.prepare_cached(SINGLETON_REPLACE_SQL).ctx(OP)?;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        // One writer: the look-up and the write are one step.
        if let Some(single) = &e.singleton {
            let args = params![e.tenant, e.handler, single.key, now.0];
            if single.keep == Keep::Oldest {
                let found = waiting
                    .query_row(args, |r| event_id(r, 0))
                    .optional()
                    .ctx(OP)?;
                if let Some(id) = found {
                    out.push(Emitted::Existing(id));
                    continue;
                }
            } else {
                replace.execute(args).ctx(OP)?;
            }
        }
        if let Some(key) = &e.idempotency_key {
            let named = stored_key
                .query_row(params![e.tenant, e.handler, key], |r| event_id(r, 0))
                .optional()
                .ctx(OP)?;
            if let Some(id) = named {
                out.push(Emitted::Existing(id));
                continue;
            }
            let live = existing
                .query_row(params![e.tenant, e.handler, key], |r| event_id(r, 0))
                .optional()
                .ctx(OP)?;
            if let Some(id) = live {
                store_key
                    .execute(params![e.tenant, e.handler, key, blob(id), now.0])
                    .ctx(OP)?;
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
                e.run_at.resolve(now).0,
                i64::from(e.max_attempts),
                e.idempotency_key,
                now.0,
                e.topic,
                e.concurrency_key,
                e.singleton.as_ref().map(|s| s.key.as_str()),
            ])
            .ctx(OP)?;
        if let (1, Some(key)) = (n, &e.idempotency_key) {
            store_key
                .execute(params![e.tenant, e.handler, key, blob(e.id), now.0])
                .ctx(OP)?;
        }
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

/// The keys stored before `before`, oldest first, at most `?2`: `?1` before.
/// Whether each one's event is live is looked up by the live-key index.
const DUE_KEYS_SQL: &str =
    "SELECT k.tenant, k.handler, k.key, k.gone, EXISTS (SELECT 1 FROM events e \
     WHERE e.tenant = k.tenant AND e.handler = k.handler AND e.idempotency_key = k.key \
     AND e.state = 0) FROM idempotency_keys k WHERE k.stored_at < ?1 \
     ORDER BY k.stored_at LIMIT ?2";

const DELETE_KEY_SQL: &str =
    "DELETE FROM idempotency_keys WHERE tenant = ?1 AND handler = ?2 AND key = ?3";

const KEEP_KEY_SQL: &str = "UPDATE idempotency_keys SET stored_at = ?4, gone = ?5 \
     WHERE tenant = ?1 AND handler = ?2 AND key = ?3";

/// [`herald::backend::Reconciliation::purge_keys`]: up to `limit` keys stored before
/// `before`. A key whose event is live, or was not yet seen gone, is kept
/// with its time reset to `now` (and marked gone if its event is no longer
/// live); one already seen gone a window ago goes. Returns how many went.
pub(crate) fn purge_keys(
    conn: &Connection,
    now: Millis,
    before: Millis,
    limit: usize,
) -> StoreResult<u64> {
    const OP: &str = "purge_keys";
    let due: Vec<(String, String, String, bool, bool)> = conn
        .prepare_cached(DUE_KEYS_SQL)
        .ctx(OP)?
        .query_map(params![before.0, sql_limit(limit)], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .ctx(OP)?
        .collect::<Result<_, _>>()
        .ctx(OP)?;
    let mut delete = conn.prepare_cached(DELETE_KEY_SQL).ctx(OP)?;
    let mut keep = conn.prepare_cached(KEEP_KEY_SQL).ctx(OP)?;
    let mut gone = 0;
    for (tenant, handler, key, seen_gone, live) in due {
        if !live && seen_gone {
            gone += delete.execute(params![tenant, handler, key]).ctx(OP)? as u64;
        } else {
            keep.execute(params![tenant, handler, key, now.0, !live])
                .ctx(OP)?;
        }
    }
    Ok(gone)
}
