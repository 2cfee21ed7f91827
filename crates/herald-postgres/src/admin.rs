//! The operator's writes: reviving a dead event, deleting one, purging
//! old dead and done events.

use std::time::Duration;

use herald::backend::Scheduled;
use herald::{EventId, EventState, StoreError};
use uuid::Uuid;

use crate::rows::{limit_i64, ms, Ctx, DbError, DbResult};
use crate::PgStore;

impl PgStore {
    /// One try of [`herald::backend::Operator::revive`].
    pub(crate) async fn revive_once(&self, id: EventId) -> DbResult<Option<Scheduled>> {
        const OP: &str = "revive";
        // Reviving must not make a second live event with the same
        // idempotency key (the unique index would refuse it anyway).
        let clash: Option<Uuid> = sqlx::query_scalar(&self.sql.revive_clash)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?;
        let refuse = |live: &dyn std::fmt::Display| -> DbError {
            StoreError::Invalid(format!(
                "cannot revive {id}: event {live} is live with the same idempotency key"
            ))
            .into()
        };
        if let Some(live) = clash {
            return Err(refuse(&live));
        }
        match sqlx::query_scalar::<_, String>(&self.sql.revive)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(t) => Ok(t.map(|tenant| Scheduled::due(tenant, id))),
            // A live event with the key appeared in between.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                Err(refuse(&"another"))
            }
            Err(e) => Err(e).ctx(OP),
        }
    }

    /// One try of [`herald::backend::Operator::delete`].
    pub(crate) async fn delete_once(&self, id: EventId) -> DbResult<bool> {
        self.exec_one("delete", sqlx::query(&self.sql.delete).bind(id.0))
            .await
    }

    /// One try of [`herald::backend::Reconciliation::purge`]: old dead events, then done
    /// ones, up to `limit` in all.
    pub(crate) async fn purge_once(
        &self,
        dead_retention: Duration,
        done_retention: Duration,
        limit: usize,
    ) -> DbResult<u64> {
        const OP: &str = "purge";
        let dead = sqlx::query(&self.sql.purge)
            .bind(EventState::Dead.code())
            .bind(ms(dead_retention))
            .bind(limit_i64(limit))
            .execute(&self.pool)
            .await
            .ctx(OP)?
            .rows_affected();
        let done = if (dead as usize) < limit {
            sqlx::query(&self.sql.purge)
                .bind(EventState::Done.code())
                .bind(ms(done_retention))
                .bind(limit_i64(limit - dead as usize))
                .execute(&self.pool)
                .await
                .ctx(OP)?
                .rows_affected()
        } else {
            0
        };
        Ok(dead + done)
    }
}
