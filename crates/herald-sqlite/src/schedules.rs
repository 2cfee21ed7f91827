//! Schedules: their definitions, the due ones, and the compare-and-set that
//! moves a cursor and inserts its occurrences' events in one transaction
//! (the writer's).

use herald::backend::StoreResult;
use herald::schedule::{DueSchedules, Schedule, ScheduleFiring, ScheduleRow};
use herald::{Emitted, Millis, StoreError};
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::emit;
use crate::rows::{blob, event_id, sql_limit, Ctx};

/// The columns [`schedule`] reads, in order.
const COLUMNS: &str = "tenant, name, handler, cron, every_ms, timezone, payload, max_attempts, \
     missed, missed_cap, paused, source, next_at, last_occurrence, last_event_id";

fn row(r: &Row<'_>) -> rusqlite::Result<ScheduleRow> {
    let last: Option<[u8; 16]> = r.get(14)?;
    Ok(ScheduleRow {
        tenant: r.get(0)?,
        name: r.get(1)?,
        handler: r.get(2)?,
        cron: r.get(3)?,
        every_ms: r.get(4)?,
        timezone: r.get(5)?,
        payload: r.get(6)?,
        max_attempts: r.get(7)?,
        missed: r.get(8)?,
        missed_cap: r.get(9)?,
        paused: r.get::<_, i64>(10)? != 0,
        source: r.get(11)?,
        next_at: r.get(12)?,
        last_occurrence: r.get(13)?,
        last_event_id: match last {
            Some(_) => Some(event_id(r, 14)?),
            None => None,
        },
    })
}

fn schedule(op: &str, row: ScheduleRow) -> StoreResult<Schedule> {
    row.into_schedule()
        .map_err(|e| StoreError::backend(op, format!("a stored schedule does not read: {e}")))
}

/// [`herald::backend::Schedules::put_schedule`]: whether it was created.
pub(crate) fn put(conn: &Connection, now: Millis, s: &Schedule) -> StoreResult<bool> {
    const OP: &str = "put_schedule";
    let r = ScheduleRow::of(s);
    let existed: bool = conn
        .prepare_cached("SELECT 1 FROM schedules WHERE tenant = ?1 AND name = ?2")
        .and_then(|mut st| st.exists(params![r.tenant, r.name]))
        .ctx(OP)?;
    // Same cron (or interval) and zone: the stored cursor stays.
    conn.prepare_cached(
        "INSERT INTO schedules (tenant, name, handler, cron, every_ms, timezone, payload, \
           max_attempts, missed, missed_cap, paused, source, next_at, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?14) \
         ON CONFLICT (tenant, name) DO UPDATE SET \
           next_at = CASE WHEN schedules.cron IS excluded.cron \
                           AND schedules.every_ms IS excluded.every_ms \
                           AND schedules.timezone = excluded.timezone \
                     THEN schedules.next_at ELSE excluded.next_at END, \
           handler = excluded.handler, cron = excluded.cron, every_ms = excluded.every_ms, \
           timezone = excluded.timezone, payload = excluded.payload, \
           max_attempts = excluded.max_attempts, missed = excluded.missed, \
           missed_cap = excluded.missed_cap, source = excluded.source, \
           updated_at = excluded.updated_at",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.tenant,
            r.name,
            r.handler,
            r.cron,
            r.every_ms,
            r.timezone,
            r.payload,
            r.max_attempts,
            r.missed,
            r.missed_cap,
            i64::from(r.paused),
            r.source,
            r.next_at,
            now.0,
        ])
    })
    .ctx(OP)?;
    Ok(!existed)
}

/// [`herald::backend::Schedules::schedule`].
pub(crate) fn get(conn: &Connection, tenant: &str, name: &str) -> StoreResult<Option<Schedule>> {
    const OP: &str = "schedule";
    let found = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules WHERE tenant = ?1 AND name = ?2"
        ))
        .and_then(|mut st| st.query_row(params![tenant, name], row).optional())
        .ctx(OP)?;
    found.map(|r| schedule(OP, r)).transpose()
}

/// [`herald::backend::Schedules::schedules`].
pub(crate) fn list(conn: &Connection, tenant: Option<&str>) -> StoreResult<Vec<Schedule>> {
    const OP: &str = "schedules";
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules WHERE ?1 IS NULL OR tenant = ?1 ORDER BY tenant, name"
        ))
        .ctx(OP)?;
    let rows = st
        .query_map(params![tenant], row)
        .ctx(OP)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .ctx(OP)?;
    rows.into_iter().map(|r| schedule(OP, r)).collect()
}

/// [`herald::backend::Schedules::pause_schedule`].
pub(crate) fn pause(
    conn: &Connection,
    now: Millis,
    tenant: &str,
    name: &str,
    paused: bool,
) -> StoreResult<bool> {
    conn.prepare_cached(
        "UPDATE schedules SET paused = ?3, updated_at = ?4 WHERE tenant = ?1 AND name = ?2",
    )
    .and_then(|mut st| st.execute(params![tenant, name, i64::from(paused), now.0]))
    .map(|n| n == 1)
    .ctx("pause_schedule")
}

/// [`herald::backend::Schedules::delete_schedule`].
pub(crate) fn delete(conn: &Connection, tenant: &str, name: &str) -> StoreResult<bool> {
    conn.prepare_cached("DELETE FROM schedules WHERE tenant = ?1 AND name = ?2")
        .and_then(|mut st| st.execute(params![tenant, name]))
        .map(|n| n == 1)
        .ctx("delete_schedule")
}

/// [`herald::backend::Schedules::due_schedules`]: by the `schedules_due` index.
pub(crate) fn due(conn: &Connection, now: Millis, limit: usize) -> StoreResult<DueSchedules> {
    const OP: &str = "due_schedules";
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND next_at <= ?1 \
             ORDER BY next_at LIMIT ?2"
        ))
        .ctx(OP)?;
    let rows = st
        .query_map(params![now.0, sql_limit(limit)], row)
        .ctx(OP)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .ctx(OP)?;
    Ok(DueSchedules {
        now,
        schedules: rows
            .into_iter()
            .map(|r| schedule(OP, r))
            .collect::<StoreResult<_>>()?,
    })
}

/// [`herald::backend::Schedules::fire_schedule`]: the cursor's compare-and-set, the
/// events, and the last occurrence, in the writer's transaction (a failure
/// rolls back all three).
pub(crate) fn fire(
    conn: &Connection,
    now: Millis,
    f: &ScheduleFiring,
) -> StoreResult<Option<Vec<Emitted>>> {
    const OP: &str = "fire_schedule";
    let moved = conn
        .prepare_cached(
            "UPDATE schedules SET next_at = ?4, updated_at = ?5 \
             WHERE tenant = ?1 AND name = ?2 AND next_at = ?3",
        )
        .and_then(|mut st| {
            st.execute(params![
                f.tenant,
                f.name,
                f.expected_next_at.0,
                f.next_at.0,
                now.0
            ])
        })
        .ctx(OP)?;
    if moved != 1 {
        return Ok(None);
    }
    let emitted = emit::emit(conn, now, &f.events)?;
    if let (Some(at), Some(out)) = (f.last_occurrence(), emitted.last()) {
        conn.prepare_cached(
            "UPDATE schedules SET last_occurrence = ?3, last_event_id = ?4 \
             WHERE tenant = ?1 AND name = ?2",
        )
        .and_then(|mut st| st.execute(params![f.tenant, f.name, at.0, blob(out.id())]))
        .ctx(OP)?;
    }
    Ok(Some(emitted))
}
