//! The hot path's first half: claiming events (taking their leases) and
//! inspecting the ones a claim did not take.

use std::time::Duration;

use herald::backend::{Inspected, Inspection};
use herald::{Event, LimitKind, LimitScope, LimitWait, Millis, RuleMatch};
use sqlx::Row;
use uuid::Uuid;

use crate::rows::{event, event_row, ms, Ctx, DbResult, EVENT_COLUMN_COUNT};
use crate::PgStore;

impl PgStore {
    /// One try of [`herald::backend::EventStore::claim`]: `ids` sorted, without repeats,
    /// and `tokens` theirs, in the same order.
    pub(crate) async fn claim_once(
        &self,
        ids: &[Uuid],
        tokens: &[Uuid],
        handlers: &[String],
        tenants: &[String],
        lease: Duration,
    ) -> DbResult<Vec<Event>> {
        const OP: &str = "claim";
        sqlx::query(&self.sql.claim)
            .bind(tokens)
            .bind(ms(lease))
            .bind(ids)
            .bind(handlers)
            .bind(tenants)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?
            .iter()
            .map(event_row)
            .collect::<Result<_, _>>()
            .ctx(OP)
    }

    /// One try of [`herald::backend::EventStore::inspect`].
    pub(crate) async fn inspect_once(&self, ids: &[Uuid]) -> DbResult<Inspection> {
        const OP: &str = "inspect";
        let rows = sqlx::query(&self.sql.inspect)
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut now = Millis(0);
        let mut found = Vec::with_capacity(rows.len());
        for r in &rows {
            now = Millis(r.try_get(0).ctx(OP)?);
            let Some(ev) = event(r, 1).ctx(OP)? else {
                continue;
            };
            let blocked: bool = r.try_get(1 + EVENT_COLUMN_COUNT).ctx(OP)?;
            let paused: bool = r.try_get(2 + EVENT_COLUMN_COUNT).ctx(OP)?;
            let waiting = waiting(r, 3 + EVENT_COLUMN_COUNT, &ev.handler).ctx(OP)?;
            found.push(Inspected {
                event: ev,
                rules: RuleMatch { blocked, paused },
                waiting,
            });
        }
        Ok(Inspection { found, now })
    }
}

/// Reads inspect's wait columns from `at`: the scope a parked event waits
/// for, its live slots and its limit (`None`: the event is not waiting).
fn waiting(
    r: &sqlx::postgres::PgRow,
    at: usize,
    handler: &str,
) -> Result<Option<LimitWait>, sqlx::Error> {
    let Some(kind) = r.try_get::<Option<i16>, _>(at)? else {
        return Ok(None);
    };
    let Some(kind) = LimitKind::from_code(kind.into()) else {
        return Ok(None);
    };
    let tenant: String = r.try_get(at + 1)?;
    let key: String = r.try_get(at + 2)?;
    let running: Option<i64> = r.try_get(at + 3)?;
    let limit: Option<i32> = r.try_get(at + 4)?;
    Ok(Some(LimitWait {
        handler: handler.to_string(),
        scope: LimitScope::from_names(kind, &tenant, &key),
        running: u32::try_from(running.unwrap_or(0)).unwrap_or(u32::MAX),
        limit: u32::try_from(limit.unwrap_or(0)).unwrap_or(0),
    }))
}
