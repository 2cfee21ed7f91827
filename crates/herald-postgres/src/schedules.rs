//! Schedules: their definitions, the due ones, and the compare-and-set that
//! moves a cursor and inserts its occurrences' events in one transaction.

use herald::backend::StoreResult;
use herald::schedule::{DueSchedules, Schedule, ScheduleFiring, ScheduleRow};
use herald::{Emitted, EventId, Millis, StoreError};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::rows::{limit_i64, Ctx, DbResult};
use crate::PgStore;

/// The columns [`row`] reads from `at`, in order.
const COLUMNS: &str = "tenant, name, handler, cron, every_ms, timezone, payload, max_attempts, \
     missed, missed_cap, paused, source, next_at, last_occurrence, last_event_id";

/// Same cron (or interval) and zone: the stored cursor stays. `$1`…`$12`
/// the definition, `$13` the cursor for a new or changed one.
const PUT: &str = "INSERT INTO {s}.schedules AS o (tenant, name, handler, cron, every_ms, \
       timezone, payload, max_attempts, missed, missed_cap, paused, source, next_at, \
       created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, {now}, {now}) \
     ON CONFLICT (tenant, name) DO UPDATE SET \
       next_at = CASE WHEN o.cron IS NOT DISTINCT FROM excluded.cron \
                       AND o.every_ms IS NOT DISTINCT FROM excluded.every_ms \
                       AND o.timezone = excluded.timezone \
                 THEN o.next_at ELSE excluded.next_at END, \
       handler = excluded.handler, cron = excluded.cron, every_ms = excluded.every_ms, \
       timezone = excluded.timezone, payload = excluded.payload, \
       max_attempts = excluded.max_attempts, missed = excluded.missed, \
       missed_cap = excluded.missed_cap, source = excluded.source, \
       updated_at = excluded.updated_at \
     RETURNING (xmax = 0)";

const GET: &str = "SELECT {cols} FROM {s}.schedules WHERE tenant = $1 AND name = $2";

const LIST: &str =
    "SELECT {cols} FROM {s}.schedules WHERE $1::text IS NULL OR tenant = $1 ORDER BY tenant, name";

const PAUSE: &str = "UPDATE {s}.schedules SET paused = $3, updated_at = {now} \
     WHERE tenant = $1 AND name = $2";

const DELETE: &str = "DELETE FROM {s}.schedules WHERE tenant = $1 AND name = $2";

/// The clock, then the due schedules by the `schedules_due` index (one row
/// with NULLs when none is due). `$1` limit.
const DUE: &str = "WITH c AS (SELECT {nowexpr} AS now) \
     SELECT c.now, d.* FROM c LEFT JOIN LATERAL \
       (SELECT {cols} FROM {s}.schedules \
        WHERE NOT paused AND next_at <= c.now ORDER BY next_at LIMIT $1) d ON true";

/// The compare-and-set: `$3` the cursor as read, `$4` the new one.
const MOVE: &str = "UPDATE {s}.schedules SET next_at = $4, updated_at = {now} \
     WHERE tenant = $1 AND name = $2 AND next_at = $3";

const LAST: &str = "UPDATE {s}.schedules SET last_occurrence = $3, last_event_id = $4 \
     WHERE tenant = $1 AND name = $2";

fn fill(store: &PgStore, template: &str) -> String {
    store.sql.fill(&template.replace("{cols}", COLUMNS))
}

/// Reads [`COLUMNS`] from column `at`; `None` when the tenant is NULL.
fn row(r: &PgRow, at: usize) -> Result<Option<ScheduleRow>, sqlx::Error> {
    let Some(tenant) = r.try_get::<Option<String>, _>(at)? else {
        return Ok(None);
    };
    Ok(Some(ScheduleRow {
        tenant,
        name: r.try_get(at + 1)?,
        handler: r.try_get(at + 2)?,
        cron: r.try_get(at + 3)?,
        every_ms: r.try_get(at + 4)?,
        timezone: r.try_get(at + 5)?,
        payload: r.try_get(at + 6)?,
        max_attempts: i64::from(r.try_get::<i32, _>(at + 7)?),
        missed: r.try_get(at + 8)?,
        missed_cap: r.try_get(at + 9)?,
        paused: r.try_get(at + 10)?,
        source: r.try_get(at + 11)?,
        next_at: r.try_get(at + 12)?,
        last_occurrence: r.try_get(at + 13)?,
        last_event_id: r.try_get::<Option<Uuid>, _>(at + 14)?.map(EventId),
    }))
}

fn schedule(op: &'static str, row: ScheduleRow) -> StoreResult<Schedule> {
    row.into_schedule()
        .map_err(|e| StoreError::backend(op, format!("a stored schedule does not read: {e}")))
}

fn schedules(op: &'static str, rows: &[PgRow], at: usize) -> DbResult<Vec<Schedule>> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        if let Some(s) = row(r, at).ctx(op)? {
            out.push(schedule(op, s)?);
        }
    }
    Ok(out)
}

impl PgStore {
    /// One try of [`herald::backend::Schedules::put_schedule`].
    pub(crate) async fn put_schedule_once(&self, s: &Schedule) -> DbResult<bool> {
        let r = ScheduleRow::of(s);
        let created: bool = sqlx::query_scalar(&fill(self, PUT))
            .bind(&r.tenant)
            .bind(&r.name)
            .bind(&r.handler)
            .bind(&r.cron)
            .bind(r.every_ms)
            .bind(&r.timezone)
            .bind(&r.payload)
            .bind(r.max_attempts as i32)
            .bind(&r.missed)
            .bind(r.missed_cap)
            .bind(r.paused)
            .bind(&r.source)
            .bind(r.next_at)
            .fetch_one(&self.pool)
            .await
            .ctx("put_schedule")?;
        Ok(created)
    }

    /// One try of [`herald::backend::Schedules::schedule`].
    pub(crate) async fn schedule_once(
        &self,
        tenant: &str,
        name: &str,
    ) -> DbResult<Option<Schedule>> {
        const OP: &str = "schedule";
        let rows = sqlx::query(&fill(self, GET))
            .bind(tenant)
            .bind(name)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        Ok(schedules(OP, &rows, 0)?.pop())
    }

    /// One try of [`herald::backend::Schedules::schedules`].
    pub(crate) async fn schedules_once(&self, tenant: Option<&str>) -> DbResult<Vec<Schedule>> {
        const OP: &str = "schedules";
        let rows = sqlx::query(&fill(self, LIST))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        schedules(OP, &rows, 0)
    }

    /// One try of [`herald::backend::Schedules::pause_schedule`].
    pub(crate) async fn pause_schedule_once(
        &self,
        tenant: &str,
        name: &str,
        paused: bool,
    ) -> DbResult<bool> {
        let q = fill(self, PAUSE);
        self.exec_one(
            "pause_schedule",
            sqlx::query(&q).bind(tenant).bind(name).bind(paused),
        )
        .await
    }

    /// One try of [`herald::backend::Schedules::delete_schedule`].
    pub(crate) async fn delete_schedule_once(&self, tenant: &str, name: &str) -> DbResult<bool> {
        let q = fill(self, DELETE);
        self.exec_one("delete_schedule", sqlx::query(&q).bind(tenant).bind(name))
            .await
    }

    /// One try of [`herald::backend::Schedules::due_schedules`]: one statement.
    pub(crate) async fn due_schedules_once(&self, limit: usize) -> DbResult<DueSchedules> {
        const OP: &str = "due_schedules";
        let rows = sqlx::query(&fill(self, DUE))
            .bind(limit_i64(limit))
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let now = match rows.first() {
            Some(r) => Millis(r.try_get::<i64, _>(0).ctx(OP)?),
            None => return Err(StoreError::backend(OP, "the clock row is missing").into()),
        };
        Ok(DueSchedules {
            now,
            schedules: schedules(OP, &rows, 1)?,
        })
    }

    /// One try of [`herald::backend::Schedules::fire_schedule`]: the compare-and-set,
    /// the events (as emit inserts them) and the last occurrence, in one
    /// transaction.
    pub(crate) async fn fire_schedule_once(
        &self,
        f: &ScheduleFiring,
    ) -> DbResult<Option<Vec<Emitted>>> {
        const OP: &str = "fire_schedule";
        let mut tx = self.pool.begin().await.ctx(OP)?;
        let moved = sqlx::query(&fill(self, MOVE))
            .bind(&f.tenant)
            .bind(&f.name)
            .bind(f.expected_next_at.0)
            .bind(f.next_at.0)
            .execute(&mut *tx)
            .await
            .ctx(OP)?
            .rows_affected();
        if moved != 1 {
            tx.rollback().await.ctx(OP)?;
            return Ok(None);
        }
        let emitted = if f.events.is_empty() {
            Vec::new()
        } else {
            self.emit_on(&mut tx, &f.events).await?
        };
        if let (Some(at), Some(out)) = (f.last_occurrence(), emitted.last()) {
            sqlx::query(&fill(self, LAST))
                .bind(&f.tenant)
                .bind(&f.name)
                .bind(at.0)
                .bind(out.id().0)
                .execute(&mut *tx)
                .await
                .ctx(OP)?;
        }
        tx.commit().await.ctx(OP)?;
        Ok(Some(emitted))
    }
}
