//! The reads of the API and the dashboard: one event, its error history,
//! listings and counts.

use herald::backend::{
    CappedCount, CountsQuery, EventFilter, HandlerCounts, PendingSample, StoreResult,
};
use herald::{AttemptError, Event, EventId, EventState, Millis, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{after_blob, blob, event, sql_limit, Ctx, EVENT_COLUMNS};

/// [`herald::backend::Operator::get`].
pub(crate) fn get(conn: &Connection, id: EventId) -> StoreResult<Option<Event>> {
    conn.prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?1"))
        .and_then(|mut st| st.query_row([blob(id)], event).optional())
        .ctx("get")
}

/// The stored error history of an event, as JSON text.
pub(crate) fn errors(conn: &Connection, id: EventId) -> StoreResult<Option<String>> {
    conn.prepare_cached("SELECT errors FROM events WHERE id = ?1")
        .and_then(|mut st| st.query_row([blob(id)], |r| r.get(0)).optional())
        .map(Option::flatten)
        .ctx("history")
}

/// [`herald::backend::Operator::history`] from the text [`errors`] read.
pub(crate) fn attempt_errors(id: EventId, text: Option<String>) -> StoreResult<Vec<AttemptError>> {
    text.map_or(Ok(Vec::new()), |t| {
        serde_json::from_str(&t).map_err(|e| {
            StoreError::backend(format!("history: event {id} has unreadable errors"), e)
        })
    })
}

/// [`herald::backend::Operator::list`]: up to `limit` events after the filter's cursor,
/// in id order.
pub(crate) fn list(
    conn: &Connection,
    filter: &EventFilter,
    limit: usize,
) -> StoreResult<Vec<Event>> {
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

/// [`herald::backend::Operator::counts`]: per `(tenant, handler)`, each state counted up
/// to the query's cap.
pub(crate) fn counts(
    conn: &Connection,
    now: Millis,
    query: &CountsQuery,
) -> StoreResult<Vec<HandlerCounts>> {
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
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM rules WHERE tenant = ?1 AND handler = ?2)")
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
}
