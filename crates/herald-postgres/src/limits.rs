//! Concurrency limits (ADR 0017): the limits themselves, the settle's
//! release of slots and the wakes. The claim's check is in the claim
//! statement (`sql/limits.sql`).

use herald::backend::{Scheduled, WakePage};
use herald::limit::Rate;
use herald::{EventId, Limit, LimitKind, LimitScope, LimitSource, StoreError, StoredLimit};
use sqlx::Row;
use uuid::Uuid;

use crate::rows::{Ctx, DbResult};
use crate::PgStore;

/// Ends the slots of runs whose settle held (`$1` their tokens) and wakes
/// their scopes' waiters (`sql/limits.sql`, `free_slots`).
pub(crate) const FREE_SLOTS: &str = "SELECT tenant, id FROM {s}.free_slots($1)";

/// `$1` most slots: lapsed slots freed, their scopes' waiters woken.
const LAPSE_SLOTS: &str = "SELECT tenant, id FROM {s}.lapse_slots($1)";

/// `$1` handler, `$2` kind, `$3` scopes, `$4`/`$5` the cursor.
const WAKE_LIMIT: &str =
    "SELECT tenant, id, last_tenant, last_key FROM {s}.wake_limit($1, $2, $3, $4, $5)";

/// `$1` handler, `$2` kind, `$3` tenant, `$4` key, `$5` running, `$6`
/// source, `$7` starts, `$8` period in ms, `$9` burst: inserted, or the
/// row changed; nothing when it was already so.
const SET_LIMIT: &str = "INSERT INTO {s}.limits AS l \
     (handler, kind, tenant, key, running, source, created_at, starts, period_ms, burst) \
     VALUES ($1, $2, $3, $4, $5, $6, {now}, $7, $8, $9) \
     ON CONFLICT (handler, kind, tenant, key) DO UPDATE \
       SET running = excluded.running, source = excluded.source, starts = excluded.starts, \
           period_ms = excluded.period_ms, burst = excluded.burst \
       WHERE (l.running, l.source, l.starts, l.period_ms, l.burst) IS DISTINCT FROM \
             (excluded.running, excluded.source, excluded.starts, excluded.period_ms, excluded.burst)";

const REMOVE_LIMIT: &str = "DELETE FROM {s}.limits \
     WHERE handler = $1 AND kind = $2 AND tenant = $3 AND key = $4";

/// Every limit, or `$1` handler's.
const LIMITS: &str =
    "SELECT handler, kind, tenant, key, running, source, starts, period_ms, burst \
     FROM {s}.limits \
     WHERE $1::text IS NULL OR handler = $1 ORDER BY handler, kind, tenant, key";

/// The config's rows not in `$1`..`$4` (handlers, kinds, tenants, keys)
/// go; returns their handler and kind.
const SYNC_REMOVE: &str = "DELETE FROM {s}.limits AS l WHERE l.source = 'config' \
     AND NOT EXISTS (SELECT 1 FROM unnest($1::text[], $2::int2[], $3::text[], $4::text[]) \
                       AS d(handler, kind, tenant, key) \
                     WHERE d.handler = l.handler AND d.kind = l.kind AND d.tenant = l.tenant \
                       AND d.key = l.key) \
     RETURNING l.handler, l.kind";

/// The declared rows (`$5` running, `$6` starts, `$7` period in ms, `$8`
/// burst) are added, changed, or taken over from the API; returns the
/// handler and kind of those whose concurrency limit rose or went.
const SYNC_SET: &str = "WITH d AS (SELECT * FROM unnest($1::text[], $2::int2[], $3::text[], \
       $4::text[], $5::int4[], $6::int4[], $7::int8[], $8::int4[]) \
       AS d(handler, kind, tenant, key, running, starts, period_ms, burst)), \
     old AS (SELECT l.handler, l.kind, l.tenant, l.key, l.running FROM {s}.limits AS l \
       JOIN d ON d.handler = l.handler AND d.kind = l.kind AND d.tenant = l.tenant \
         AND d.key = l.key), \
     up AS (INSERT INTO {s}.limits AS l (handler, kind, tenant, key, running, starts, period_ms, \
         burst, source, created_at) \
       SELECT d.handler, d.kind, d.tenant, d.key, d.running, d.starts, d.period_ms, d.burst, \
         'config', {now} FROM d \
       ON CONFLICT (handler, kind, tenant, key) DO UPDATE \
         SET running = excluded.running, starts = excluded.starts, \
             period_ms = excluded.period_ms, burst = excluded.burst, source = 'config' \
         WHERE (l.running, l.starts, l.period_ms, l.burst, l.source) IS DISTINCT FROM \
               (excluded.running, excluded.starts, excluded.period_ms, excluded.burst, 'config') \
       RETURNING l.handler, l.kind, l.tenant, l.key, l.running) \
     SELECT up.handler, up.kind FROM up JOIN old ON old.handler = up.handler \
       AND old.kind = up.kind AND old.tenant = up.tenant AND old.key = up.key \
     WHERE old.running IS NOT NULL AND (up.running IS NULL OR up.running > old.running)";

/// Reads `(tenant, id)` rows of woken events.
fn woken(rows: &[sqlx::postgres::PgRow], op: &'static str) -> DbResult<Vec<Scheduled>> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let id: Option<Uuid> = r.try_get("id").ctx(op)?;
        if let Some(id) = id {
            out.push(Scheduled::due(r.try_get("tenant").ctx(op)?, EventId(id)));
        }
    }
    Ok(out)
}

/// A rate from its stored columns (all set, or none).
fn rate_of(starts: Option<i32>, period_ms: Option<i64>, burst: Option<i32>) -> Option<Rate> {
    Some(Rate {
        starts: u32::try_from(starts?).unwrap_or(0),
        period: std::time::Duration::from_millis(u64::try_from(period_ms?).unwrap_or(0)),
        burst: u32::try_from(burst?).unwrap_or(1),
    })
}

fn kind_of(code: i16, op: &'static str) -> DbResult<LimitKind> {
    LimitKind::from_code(code.into())
        .ok_or_else(|| StoreError::backend(op, format!("unknown limit kind {code}")).into())
}

impl PgStore {
    /// One try of the slots' release after a settle: `tokens` of the runs
    /// whose settle held.
    pub(crate) async fn free_slots_once(&self, tokens: &[Uuid]) -> DbResult<Vec<Scheduled>> {
        const OP: &str = "settle";
        let rows = sqlx::query(&self.sql.free_slots)
            .bind(tokens)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        woken(&rows, OP)
    }

    /// One try of [`herald::backend::Reconciliation::lapse_slots`].
    pub(crate) async fn lapse_slots_once(&self, limit: usize) -> DbResult<Vec<Scheduled>> {
        const OP: &str = "lapse_slots";
        let rows = sqlx::query(&self.sql.fill(LAPSE_SLOTS))
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        woken(&rows, OP)
    }

    /// One try of [`herald::backend::Limits::wake_limit`].
    pub(crate) async fn wake_limit_once(
        &self,
        handler: &str,
        kind: LimitKind,
        after: Option<&(String, String)>,
        scopes: usize,
    ) -> DbResult<WakePage> {
        const OP: &str = "wake_limit";
        let rows = sqlx::query(&self.sql.fill(WAKE_LIMIT))
            .bind(handler)
            .bind(kind.code())
            .bind(i32::try_from(scopes).unwrap_or(i32::MAX))
            .bind(after.map(|a| a.0.as_str()))
            .bind(after.map(|a| a.1.as_str()))
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut next = None;
        for r in &rows {
            let last: Option<String> = r.try_get("last_tenant").ctx(OP)?;
            if let Some(t) = last {
                next = Some((t, r.try_get::<String, _>("last_key").ctx(OP)?));
            }
        }
        Ok(WakePage {
            woken: woken(&rows, OP)?,
            next,
        })
    }

    /// One try of [`herald::backend::Limits::set_limit`].
    pub(crate) async fn set_limit_once(&self, limit: &Limit) -> DbResult<bool> {
        let (tenant, key) = limit.scope.names();
        self.exec_one(
            "set_limit",
            sqlx::query(&self.sql.fill(SET_LIMIT))
                .bind(&limit.handler)
                .bind(limit.scope.kind().code())
                .bind(tenant)
                .bind(key)
                .bind(limit.running.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
                .bind(LimitSource::Api.as_str())
                .bind(
                    limit
                        .rate
                        .map(|r| i32::try_from(r.starts).unwrap_or(i32::MAX)),
                )
                .bind(limit.rate.map(|r| r.period.as_millis() as i64))
                .bind(
                    limit
                        .rate
                        .map(|r| i32::try_from(r.burst).unwrap_or(i32::MAX)),
                ),
        )
        .await
    }

    /// One try of [`herald::backend::Limits::remove_limit`].
    pub(crate) async fn remove_limit_once(
        &self,
        handler: &str,
        scope: &LimitScope,
    ) -> DbResult<bool> {
        let (tenant, key) = scope.names();
        self.exec_one(
            "remove_limit",
            sqlx::query(&self.sql.fill(REMOVE_LIMIT))
                .bind(handler)
                .bind(scope.kind().code())
                .bind(tenant)
                .bind(key),
        )
        .await
    }

    /// One try of [`herald::backend::Limits::limits`].
    pub(crate) async fn limits_once(&self, handler: Option<&str>) -> DbResult<Vec<StoredLimit>> {
        const OP: &str = "limits";
        let rows = sqlx::query(&self.sql.fill(LIMITS))
            .bind(handler)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let kind = kind_of(r.try_get("kind").ctx(OP)?, OP)?;
            let tenant: String = r.try_get("tenant").ctx(OP)?;
            let key: String = r.try_get("key").ctx(OP)?;
            let running: Option<i32> = r.try_get("running").ctx(OP)?;
            let starts: Option<i32> = r.try_get("starts").ctx(OP)?;
            let period_ms: Option<i64> = r.try_get("period_ms").ctx(OP)?;
            let burst: Option<i32> = r.try_get("burst").ctx(OP)?;
            let source: String = r.try_get("source").ctx(OP)?;
            let source = LimitSource::parse(&source).ok_or_else(|| {
                StoreError::backend(OP, format!("unknown limit source {source:?}"))
            })?;
            out.push(StoredLimit {
                limit: Limit {
                    handler: r.try_get("handler").ctx(OP)?,
                    scope: LimitScope::from_names(kind, &tenant, &key),
                    running: running.map(|n| u32::try_from(n).unwrap_or(0)),
                    rate: rate_of(starts, period_ms, burst),
                },
                source,
            });
        }
        Ok(out)
    }

    /// One try of [`herald::backend::Limits::sync_limits`].
    pub(crate) async fn sync_limits_once(
        &self,
        declared: &[Limit],
    ) -> DbResult<Vec<(String, LimitKind)>> {
        const OP: &str = "sync_limits";
        let handlers: Vec<&str> = declared.iter().map(|l| l.handler.as_str()).collect();
        let kinds: Vec<i16> = declared.iter().map(|l| l.scope.kind().code()).collect();
        let tenants: Vec<&str> = declared.iter().map(|l| l.scope.names().0).collect();
        let keys: Vec<&str> = declared.iter().map(|l| l.scope.names().1).collect();
        let running: Vec<Option<i32>> = declared
            .iter()
            .map(|l| l.running.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
            .collect();
        let starts: Vec<Option<i32>> = declared
            .iter()
            .map(|l| l.rate.map(|r| i32::try_from(r.starts).unwrap_or(i32::MAX)))
            .collect();
        let periods: Vec<Option<i64>> = declared
            .iter()
            .map(|l| l.rate.map(|r| r.period.as_millis() as i64))
            .collect();
        let bursts: Vec<Option<i32>> = declared
            .iter()
            .map(|l| l.rate.map(|r| i32::try_from(r.burst).unwrap_or(i32::MAX)))
            .collect();
        let mut tx = self.pool.begin().await.ctx(OP)?;
        let mut loosened = Vec::new();
        for r in sqlx::query(&self.sql.fill(SYNC_REMOVE))
            .bind(&handlers)
            .bind(&kinds)
            .bind(&tenants)
            .bind(&keys)
            .fetch_all(&mut *tx)
            .await
            .ctx(OP)?
            .iter()
            .chain(
                sqlx::query(&self.sql.fill(SYNC_SET))
                    .bind(&handlers)
                    .bind(&kinds)
                    .bind(&tenants)
                    .bind(&keys)
                    .bind(&running)
                    .bind(&starts)
                    .bind(&periods)
                    .bind(&bursts)
                    .fetch_all(&mut *tx)
                    .await
                    .ctx(OP)?
                    .iter(),
            )
        {
            let handler: String = r.try_get(0).ctx(OP)?;
            loosened.push((handler, kind_of(r.try_get(1).ctx(OP)?, OP)?));
        }
        tx.commit().await.ctx(OP)?;
        loosened.sort();
        loosened.dedup();
        Ok(loosened)
    }
}
