//! Leader election: a role held by one holder until its lease expires.

use std::time::Duration;

use herald::Leadership;

use crate::rows::{ms, Ctx, DbResult};
use crate::PgStore;

impl PgStore {
    /// One try of [`herald::backend::LeaderElection::lead`].
    pub(crate) async fn lead_once(
        &self,
        role: &str,
        holder: &str,
        lease: Duration,
    ) -> DbResult<Leadership> {
        let (leading, left_ms): (bool, i64) = sqlx::query_as(&self.sql.lead)
            .bind(role)
            .bind(holder)
            .bind(ms(lease))
            .fetch_one(&self.pool)
            .await
            .ctx("lead")?;
        Ok(Leadership {
            leading,
            left: Duration::from_millis(left_ms.max(0) as u64),
        })
    }

    /// One try of [`herald::backend::LeaderElection::resign`]: whether `holder` held `role`.
    pub(crate) async fn resign_once(&self, role: &str, holder: &str) -> DbResult<bool> {
        self.exec_one(
            "resign",
            sqlx::query(&self.sql.resign).bind(role).bind(holder),
        )
        .await
    }
}
