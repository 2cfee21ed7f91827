//! The hot path's first half: claiming events (taking their leases) and
//! inspecting the ones a claim did not take.

use std::time::Duration;

use herald::backend::{Inspected, Inspection};
use herald::{Event, Millis, RuleMatch};
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
            found.push(Inspected {
                event: ev,
                rules: RuleMatch { blocked, paused },
            });
        }
        Ok(Inspection { found, now })
    }
}
