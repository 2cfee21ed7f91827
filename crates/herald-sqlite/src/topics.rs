//! Topics: the subscriptions that a topic emit fans out to.
//!
//! A subscription for every tenant is stored with tenant `''` (tenant
//! names are never empty), so that the primary key `(topic, tenant,
//! handler)` holds it once.

use herald::backend::{StoreResult, SubscriptionSync};
use herald::{Millis, Subscription};
use rusqlite::{params, Connection};

use crate::rows::Ctx;

/// The stored tenant of a subscription: `''` for every tenant.
fn stored_tenant(s: &Subscription) -> &str {
    s.tenant.as_deref().unwrap_or("")
}

/// [`herald::backend::Topics::subscribe`]: whether it is new.
pub(crate) fn subscribe(conn: &Connection, now: Millis, s: &Subscription) -> StoreResult<bool> {
    conn.prepare_cached(
        "INSERT INTO subscriptions (topic, tenant, handler, source, created_at) \
         VALUES (?1, ?2, ?3, 'api', ?4) ON CONFLICT DO NOTHING",
    )
    .and_then(|mut st| st.execute(params![s.topic, stored_tenant(s), s.handler, now.0]))
    .map(|n| n == 1)
    .ctx("subscribe")
}

/// [`herald::backend::Topics::unsubscribe`]: whether it was there.
pub(crate) fn unsubscribe(conn: &Connection, s: &Subscription) -> StoreResult<bool> {
    conn.prepare_cached(
        "DELETE FROM subscriptions WHERE topic = ?1 AND tenant = ?2 AND handler = ?3",
    )
    .and_then(|mut st| st.execute(params![s.topic, stored_tenant(s), s.handler]))
    .map(|n| n == 1)
    .ctx("unsubscribe")
}

/// [`herald::backend::Topics::subscribers`]: the tenant's and every tenant's
/// handlers, each once, in order.
pub(crate) fn subscribers(
    conn: &Connection,
    tenant: &str,
    topic: &str,
) -> StoreResult<Vec<String>> {
    const OP: &str = "subscribers";
    let mut stmt = conn
        .prepare_cached(
            "SELECT DISTINCT handler FROM subscriptions \
             WHERE topic = ?1 AND tenant IN ('', ?2) ORDER BY handler",
        )
        .ctx(OP)?;
    let rows = stmt
        .query_map(params![topic, tenant], |r| r.get::<_, String>(0))
        .ctx(OP)?;
    rows.collect::<rusqlite::Result<_>>().ctx(OP)
}

/// [`herald::backend::Topics::subscriptions`]: of one topic or all, in order.
pub(crate) fn list(conn: &Connection, topic: Option<&str>) -> StoreResult<Vec<Subscription>> {
    const OP: &str = "subscriptions";
    let mut stmt = conn
        .prepare_cached(
            "SELECT topic, tenant, handler FROM subscriptions \
             WHERE ?1 IS NULL OR topic = ?1 ORDER BY topic, tenant, handler",
        )
        .ctx(OP)?;
    let rows = stmt
        .query_map(params![topic], |r| {
            let tenant: String = r.get(1)?;
            Ok(Subscription {
                topic: r.get(0)?,
                tenant: (!tenant.is_empty()).then_some(tenant),
                handler: r.get(2)?,
            })
        })
        .ctx(OP)?;
    rows.collect::<rusqlite::Result<_>>().ctx(OP)
}

/// [`herald::backend::Topics::sync_subscriptions`]: the config's rows become exactly
/// `declared` (the writer's transaction makes it all or nothing).
pub(crate) fn sync(
    conn: &Connection,
    now: Millis,
    declared: &[Subscription],
) -> StoreResult<SubscriptionSync> {
    const OP: &str = "sync_subscriptions";
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS declared_subscriptions \
           (topic TEXT NOT NULL, tenant TEXT NOT NULL, handler TEXT NOT NULL, \
            PRIMARY KEY (topic, tenant, handler)); \
         DELETE FROM temp.declared_subscriptions;",
    )
    .ctx(OP)?;
    {
        let mut put = conn
            .prepare_cached(
                "INSERT OR IGNORE INTO temp.declared_subscriptions (topic, tenant, handler) \
                 VALUES (?1, ?2, ?3)",
            )
            .ctx(OP)?;
        for s in declared {
            put.execute(params![s.topic, stored_tenant(s), s.handler])
                .ctx(OP)?;
        }
    }
    let removed = conn
        .execute(
            "DELETE FROM subscriptions WHERE source = 'config' AND NOT EXISTS \
               (SELECT 1 FROM temp.declared_subscriptions AS d WHERE d.topic = subscriptions.topic \
                AND d.tenant = subscriptions.tenant AND d.handler = subscriptions.handler)",
            [],
        )
        .ctx(OP)?;
    let added = conn
        .execute(
            "INSERT INTO subscriptions (topic, tenant, handler, source, created_at) \
             SELECT topic, tenant, handler, 'config', ?1 FROM temp.declared_subscriptions WHERE true \
             ON CONFLICT (topic, tenant, handler) DO UPDATE SET source = 'config' \
             WHERE subscriptions.source <> 'config'",
            params![now.0],
        )
        .ctx(OP)?;
    conn.execute_batch("DELETE FROM temp.declared_subscriptions;")
        .ctx(OP)?;
    Ok(SubscriptionSync {
        added: added as u64,
        removed: removed as u64,
    })
}
