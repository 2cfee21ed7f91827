//! The reads of the API and the dashboard: one event, its error history,
//! listings and counts.

use herald::backend::{
    CappedCount, CountsQuery, EventFilter, HandlerCounts, PendingSample, StoreResult,
};
use herald::{AttemptError, Event, EventId, EventState, StoreError};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::rows::{event_row, limit_i64, Ctx, DbResult};
use crate::PgStore;

impl PgStore {
    /// [`herald::backend::Operator::get`].
    pub(crate) async fn get_once(&self, id: EventId) -> StoreResult<Option<Event>> {
        const OP: &str = "get";
        Ok(sqlx::query(&self.sql.get)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?
            .as_ref()
            .map(event_row)
            .transpose()
            .ctx(OP)?)
    }

    /// [`herald::backend::Operator::history`].
    pub(crate) async fn history_once(&self, id: EventId) -> StoreResult<Vec<AttemptError>> {
        const OP: &str = "history";
        let text: Option<Option<String>> = sqlx::query_scalar(&self.sql.history)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?;
        match text.flatten() {
            None => Ok(Vec::new()),
            Some(t) => serde_json::from_str(&t).map_err(|e| {
                StoreError::backend(format!("{OP}: event {id} has unreadable errors"), e)
            }),
        }
    }

    /// [`herald::backend::Operator::list`], `limit` above 0.
    pub(crate) async fn list_once(
        &self,
        filter: &EventFilter,
        limit: usize,
    ) -> DbResult<Vec<Event>> {
        const OP: &str = "list";
        let lim = limit_i64(limit);
        let after = filter.after.map(|a| a.0);
        let read = |rows: Vec<PgRow>| -> DbResult<Vec<Event>> {
            rows.iter().map(event_row).collect::<Result<_, _>>().ctx(OP)
        };
        match (&filter.tenant, &filter.handler, filter.state) {
            // One handler: walk the (tenant, handler, state, id) index, one
            // state range at a time, and merge.
            (Some(tenant), Some(handler), state) => {
                let states = match state {
                    Some(s) => vec![s],
                    None => vec![EventState::Pending, EventState::Dead, EventState::Done],
                };
                let sql = self.sql.fill(if after.is_some() {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.tenant = $1 AND e.handler = $2 \
                     AND e.state = $3 AND e.id_key > $5 ORDER BY e.id_key LIMIT $4"
                } else {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.tenant = $1 AND e.handler = $2 \
                     AND e.state = $3 ORDER BY e.id_key LIMIT $4"
                });
                let mut out = Vec::new();
                for s in states {
                    let q = sqlx::query(&sql)
                        .bind(tenant)
                        .bind(handler)
                        .bind(s.code())
                        .bind(lim);
                    let q = match after {
                        Some(a) => q.bind(a),
                        None => q,
                    };
                    out.extend(read(q.fetch_all(&self.pool).await.ctx(OP)?)?);
                }
                out.sort_unstable_by_key(|e| e.id);
                out.truncate(limit);
                Ok(out)
            }
            // Otherwise walk the primary key from the cursor, filtering.
            (tenant, handler, state) => {
                let sql = self.sql.fill(if after.is_some() {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.id > $5 \
                     AND ($1::text IS NULL OR e.tenant = $1) \
                     AND ($2::text IS NULL OR e.handler = $2) \
                     AND ($3::int2 IS NULL OR e.state = $3) ORDER BY e.id LIMIT $4"
                } else {
                    "SELECT {cols} FROM {s}.events AS e WHERE \
                     ($1::text IS NULL OR e.tenant = $1) \
                     AND ($2::text IS NULL OR e.handler = $2) \
                     AND ($3::int2 IS NULL OR e.state = $3) ORDER BY e.id LIMIT $4"
                });
                let q = sqlx::query(&sql)
                    .bind(tenant.as_deref())
                    .bind(handler.as_deref())
                    .bind(state.map(EventState::code))
                    .bind(lim);
                let q = match after {
                    Some(a) => q.bind(a),
                    None => q,
                };
                read(q.fetch_all(&self.pool).await.ctx(OP)?)
            }
        }
    }

    /// [`herald::backend::Operator::counts`].
    pub(crate) async fn counts_once(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>> {
        const OP: &str = "counts";
        let pairs: Vec<(String, String)> = match &query.tenant {
            Some(t) => sqlx::query_as(&self.sql.count_pairs_of).bind(t),
            None => sqlx::query_as(&self.sql.count_pairs).bind(""),
        }
        .fetch_all(&self.pool)
        .await
        .ctx(OP)?;
        let cap = i64::try_from(query.exact_up_to.max(1)).unwrap_or(i64::MAX);
        let split = i64::try_from(query.split_up_to).unwrap_or(i64::MAX);
        let mut out = Vec::with_capacity(pairs.len());
        for (tenant, handler) in pairs {
            if query.handler.as_ref().is_some_and(|h| *h != handler) {
                continue;
            }
            let row = sqlx::query(&self.sql.count_pair)
                .bind(&tenant)
                .bind(&handler)
                .bind(cap)
                .bind(split)
                .fetch_one(&self.pool)
                .await
                .ctx(OP)?;
            let n = |i: usize| -> Result<u64, sqlx::Error> {
                Ok(row.try_get::<i64, _>(i)?.max(0) as u64)
            };
            let capped = |at: usize| -> Result<CappedCount, sqlx::Error> {
                let id = |i: usize| row.try_get::<Option<Uuid>, _>(i).map(|u| u.map(EventId));
                let span = match (id(at + 1)?, id(at + 2)?, id(at + 3)?) {
                    (Some(a), Some(b), Some(c)) => Some([a, b, c]),
                    _ => None,
                };
                Ok(CappedCount {
                    counted: n(at)?,
                    span,
                })
            };
            let parts = (|| {
                Ok::<_, sqlx::Error>((
                    [capped(0)?, capped(4)?, capped(8)?],
                    row.try_get::<bool, _>(12)?,
                    PendingSample {
                        read: n(13)?,
                        running: n(14)?,
                        delayed: n(15)?,
                    },
                ))
            })()
            .ctx(OP)?;
            out.push(HandlerCounts::from_parts(
                tenant, handler, parts.0, parts.1, parts.2,
            ));
        }
        Ok(out)
    }
}
