//! The hot path's second half: settling runs (one statement per kind of
//! end, fenced by the lease tokens) and renewing the leases of runs still
//! going.

use std::time::Duration;

use herald::backend::{Finish, LeaseRef, Settle};
use uuid::Uuid;

use crate::rows::{ms, Ctx, DbResult};
use crate::sql::SettleKind;
use crate::PgStore;

impl PgStore {
    /// One settle statement: the items of one kind, at their batch
    /// positions, in id order. Returns the positions whose fence held.
    pub(crate) async fn settle_kind(
        &self,
        kind: SettleKind,
        batch: &[Settle],
        items: &[usize],
    ) -> DbResult<Vec<usize>> {
        const OP: &str = "settle";
        let ids: Vec<Uuid> = items.iter().map(|&i| batch[i].id.0).collect();
        let tokens: Vec<Option<Uuid>> =
            items.iter().map(|&i| batch[i].token.map(|t| t.0)).collect();
        let ords: Vec<i32> = items.iter().map(|&i| i as i32).collect();
        let mut q = sqlx::query_scalar::<_, i32>(self.sql.settle(kind))
            .bind(ids)
            .bind(tokens)
            .bind(ords);
        match kind {
            SettleKind::Release => {
                let mut waits = Vec::with_capacity(items.len());
                let mut give_backs = Vec::with_capacity(items.len());
                let mut errors = Vec::with_capacity(items.len());
                for &i in items {
                    if let Finish::Release {
                        wait,
                        error,
                        give_back,
                    } = &batch[i].finish
                    {
                        waits.push(ms(*wait));
                        give_backs.push(i32::from(*give_back));
                        errors.push(error.as_deref());
                    }
                }
                q = q.bind(waits).bind(give_backs).bind(errors);
            }
            SettleKind::Bury => {
                let errors: Vec<&str> = items
                    .iter()
                    .map(|&i| match &batch[i].finish {
                        Finish::Bury { error } => error.as_str(),
                        _ => "",
                    })
                    .collect();
                q = q.bind(errors);
            }
            SettleKind::Delete | SettleKind::Archive => {}
        }
        let held = q.fetch_all(&self.pool).await.ctx(OP)?;
        Ok(held.into_iter().map(|i| i as usize).collect())
    }

    /// One try of [`herald::backend::EventStore::renew`], the leases in `order` (by id).
    /// Returns the positions whose lease was still held.
    pub(crate) async fn renew_once(
        &self,
        leases: &[LeaseRef],
        order: &[usize],
        lease: Duration,
    ) -> DbResult<Vec<usize>> {
        const OP: &str = "renew";
        let held = sqlx::query_scalar::<_, i32>(&self.sql.renew)
            .bind(ms(lease))
            .bind(order.iter().map(|&i| leases[i].id.0).collect::<Vec<_>>())
            .bind(order.iter().map(|&i| leases[i].token.0).collect::<Vec<_>>())
            .bind(order.iter().map(|&i| i as i32).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        Ok(held.into_iter().map(|i| i as usize).collect())
    }
}
