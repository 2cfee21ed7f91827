//! The sweep's primitives: the core's [`Sweep`] decides, these statements
//! read its candidates, stamp and park them, and un-park orphans.

use std::time::Duration;

use herald::backend::sweep::{Candidate, Source, Step, Sweep, Writes};
use herald::backend::{SweepPage, SweepPass};
use herald::{EventId, Millis};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::rows::{limit_i64, uuids, Ctx, DbResult};
use crate::PgStore;

/// The sweep's keyset cursor: `notified_at` and the id (the index's
/// tie-breaker).
type SweepCursor = (i64, Uuid);

impl PgStore {
    /// One sweep call, in one short transaction: carries out the
    /// [`Sweep`]'s steps.
    pub(crate) async fn sweep_once(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> DbResult<SweepPage> {
        const OP: &str = "sweep";
        let mut tx = self.pool.begin().await.ctx(OP)?;
        // The transaction's clock: the same for every statement of the call.
        let now = Millis(
            sqlx::query_scalar::<_, i64>(&self.sql.now)
                .fetch_one(&mut *tx)
                .await
                .ctx(OP)?,
        );
        let mut sweep = Sweep::<SweepCursor>::new(now, quiet, pass, limit);
        let mut step = sweep.start();
        let page = loop {
            step = match step {
                Step::ListOrphans => sweep.orphans(
                    sqlx::query_as(&self.sql.orphans)
                        .fetch_all(&mut *tx)
                        .await
                        .ctx(OP)?,
                ),
                Step::Unpark {
                    tenant,
                    handler,
                    limit,
                } => {
                    let n: i64 = sqlx::query_scalar(&self.sql.unpark)
                        .bind(&tenant)
                        .bind(&handler)
                        .bind(limit_i64(limit))
                        .fetch_one(&mut *tx)
                        .await
                        .ctx(OP)?;
                    sweep.unparked(n.max(0) as u64)
                }
                Step::ForgetParked { tenant, handler } => {
                    sqlx::query(&self.sql.forget_parked)
                        .bind(&tenant)
                        .bind(&handler)
                        .execute(&mut *tx)
                        .await
                        .ctx(OP)?;
                    sweep.resume()
                }
                Step::Read {
                    source,
                    after,
                    limit,
                    now,
                    cutoff,
                } => sweep.read(
                    self.sweep_read(&mut tx, source, after, limit, now, cutoff)
                        .await?,
                ),
                Step::Write(writes) => {
                    self.sweep_write(&mut tx, writes).await?;
                    sweep.resume()
                }
                Step::Done(page) => break page,
            };
        };
        tx.commit().await.ctx(OP)?;
        Ok(page)
    }

    /// Up to `limit` candidates of one source after `after`. Both walk
    /// `events_to_notify`: the dead-worker source over the pass's quiet
    /// window only (`cutoff <= notified_at < now`; its cursor starts just
    /// below the cutoff, see [`crate::sql`]), the quiet source below the cutoff.
    pub(crate) async fn sweep_read(
        &self,
        conn: &mut PgConnection,
        source: Source,
        after: Option<SweepCursor>,
        limit: usize,
        now: Millis,
        cutoff: Millis,
    ) -> DbResult<Vec<Candidate<SweepCursor>>> {
        const OP: &str = "sweep";
        let (sql, start) = match source {
            Source::Expired => (
                &self.sql.sweep_expired,
                (cutoff.0.saturating_sub(1), Uuid::max()),
            ),
            Source::Quiet => (&self.sql.sweep_quiet, (i64::MIN, Uuid::nil())),
        };
        let after = after.unwrap_or(start);
        let rows: Vec<(Uuid, String, String, bool, i64)> = sqlx::query_as(sql)
            .bind(now.0)
            .bind(cutoff.0)
            .bind(after.0)
            .bind(after.1)
            .bind(limit_i64(limit))
            .fetch_all(&mut *conn)
            .await
            .ctx(OP)?;
        Ok(rows
            .into_iter()
            .map(|(id, tenant, handler, ruled, key)| Candidate {
                id: EventId(id),
                tenant,
                handler,
                ruled,
                cursor: (key, id),
            })
            .collect())
    }

    /// Stamps the notified ones, parks the parked ones and notes their
    /// pairs; rows in id order, as claims take them.
    pub(crate) async fn sweep_write(
        &self,
        conn: &mut PgConnection,
        writes: Writes,
    ) -> DbResult<()> {
        const OP: &str = "sweep";
        let Writes {
            notified,
            parked,
            parked_pairs,
            at,
        } = writes;
        if !notified.is_empty() {
            let mut ids = uuids(&notified);
            ids.sort_unstable();
            sqlx::query(&self.sql.stamp)
                .bind(at.0)
                .bind(&ids)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
        }
        if !parked.is_empty() {
            let mut ids = uuids(&parked);
            ids.sort_unstable();
            sqlx::query(&self.sql.park)
                .bind(&ids)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
            let (tenants, handlers): (Vec<String>, Vec<String>) = parked_pairs.into_iter().unzip();
            sqlx::query(&self.sql.note_parked)
                .bind(&tenants)
                .bind(&handlers)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
        }
        Ok(())
    }
}
