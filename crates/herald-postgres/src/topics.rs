//! Topics: the subscriptions that a topic emit fans out to, and the
//! topic emit inside the caller's transaction.
//!
//! A subscription for every tenant is stored with tenant `''` (tenant
//! names are never empty), so that the primary key `(topic, tenant,
//! handler)` holds it once.

use herald::backend::{StoreResult, SubscriptionSync};
use herald::{Client, ClientError, EmitOptions, StoredTopicEmit, Subscription};
use sqlx::PgConnection;

use crate::rows::{Ctx, DbResult};
use crate::PgStore;

/// The stored tenant of a subscription: `''` for every tenant.
fn stored_tenant(s: &Subscription) -> &str {
    s.tenant.as_deref().unwrap_or("")
}

/// Adds an API subscription: `$1` topic, `$2` tenant, `$3` handler.
pub(crate) const SUBSCRIBE: &str = "INSERT INTO {s}.subscriptions \
     (topic, tenant, handler, source, created_at) VALUES ($1, $2, $3, 'api', {now}) \
     ON CONFLICT DO NOTHING";

pub(crate) const UNSUBSCRIBE: &str = "DELETE FROM {s}.subscriptions \
     WHERE topic = $1 AND tenant = $2 AND handler = $3";

/// The handlers of `$1` topic for `$2` tenant or every tenant.
pub(crate) const SUBSCRIBERS: &str = "SELECT DISTINCT handler FROM {s}.subscriptions \
     WHERE topic = $1 AND tenant IN ('', $2) ORDER BY handler";

/// Every subscription, or `$1` topic's.
pub(crate) const SUBSCRIPTIONS: &str = "SELECT topic, tenant, handler FROM {s}.subscriptions \
     WHERE $1::text IS NULL OR topic = $1 ORDER BY topic, tenant, handler";

/// The config's rows not in `$1`/`$2`/`$3` (topics, tenants, handlers) go.
const SYNC_REMOVE: &str = "DELETE FROM {s}.subscriptions AS s WHERE s.source = 'config' \
     AND NOT EXISTS (SELECT 1 FROM unnest($1::text[], $2::text[], $3::text[]) AS d(topic, tenant, handler) \
                     WHERE d.topic = s.topic AND d.tenant = s.tenant AND d.handler = s.handler)";

/// The declared rows are added, or taken over from the API.
const SYNC_ADD: &str =
    "INSERT INTO {s}.subscriptions AS s (topic, tenant, handler, source, created_at) \
     SELECT DISTINCT d.topic, d.tenant, d.handler, 'config', {now} \
     FROM unnest($1::text[], $2::text[], $3::text[]) AS d(topic, tenant, handler) \
     ON CONFLICT (topic, tenant, handler) DO UPDATE SET source = 'config' \
     WHERE s.source <> 'config'";

impl PgStore {
    /// One try of [`herald::backend::Topics::subscribe`].
    pub(crate) async fn subscribe_once(&self, s: &Subscription) -> DbResult<bool> {
        self.exec_one(
            "subscribe",
            sqlx::query(&self.sql.subscribe)
                .bind(&s.topic)
                .bind(stored_tenant(s))
                .bind(&s.handler),
        )
        .await
    }

    /// One try of [`herald::backend::Topics::unsubscribe`].
    pub(crate) async fn unsubscribe_once(&self, s: &Subscription) -> DbResult<bool> {
        self.exec_one(
            "unsubscribe",
            sqlx::query(&self.sql.unsubscribe)
                .bind(&s.topic)
                .bind(stored_tenant(s))
                .bind(&s.handler),
        )
        .await
    }

    /// [`herald::backend::Topics::subscribers`] on `conn` (the pool's, or the
    /// caller's transaction for [`PgStore::emit_topic_in`]).
    pub(crate) async fn subscribers_on(
        &self,
        conn: &mut PgConnection,
        tenant: &str,
        topic: &str,
    ) -> DbResult<Vec<String>> {
        sqlx::query_scalar(&self.sql.subscribers)
            .bind(topic)
            .bind(tenant)
            .fetch_all(conn)
            .await
            .ctx("subscribers")
    }

    /// One try of [`herald::backend::Topics::subscribers`].
    pub(crate) async fn subscribers_once(
        &self,
        tenant: &str,
        topic: &str,
    ) -> DbResult<Vec<String>> {
        let mut conn = self.pool.acquire().await.ctx("subscribers")?;
        self.subscribers_on(&mut conn, tenant, topic).await
    }

    /// One try of [`herald::backend::Topics::subscriptions`].
    pub(crate) async fn subscriptions_once(
        &self,
        topic: Option<&str>,
    ) -> DbResult<Vec<Subscription>> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(&self.sql.subscriptions)
            .bind(topic)
            .fetch_all(&self.pool)
            .await
            .ctx("subscriptions")?;
        Ok(rows
            .into_iter()
            .map(|(topic, tenant, handler)| Subscription {
                topic,
                tenant: (!tenant.is_empty()).then_some(tenant),
                handler,
            })
            .collect())
    }

    /// One try of [`herald::backend::Topics::sync_subscriptions`], in one transaction.
    pub(crate) async fn sync_subscriptions_once(
        &self,
        declared: &[Subscription],
    ) -> DbResult<SubscriptionSync> {
        const OP: &str = "sync_subscriptions";
        let topics: Vec<&str> = declared.iter().map(|s| s.topic.as_str()).collect();
        let tenants: Vec<&str> = declared.iter().map(stored_tenant).collect();
        let handlers: Vec<&str> = declared.iter().map(|s| s.handler.as_str()).collect();
        let mut tx = self.pool.begin().await.ctx(OP)?;
        let removed = sqlx::query(&self.sql.fill(SYNC_REMOVE))
            .bind(&topics)
            .bind(&tenants)
            .bind(&handlers)
            .execute(&mut *tx)
            .await
            .ctx(OP)?
            .rows_affected();
        let added = sqlx::query(&self.sql.fill(SYNC_ADD))
            .bind(&topics)
            .bind(&tenants)
            .bind(&handlers)
            .execute(&mut *tx)
            .await
            .ctx(OP)?
            .rows_affected();
        tx.commit().await.ctx(OP)?;
        Ok(SubscriptionSync { added, removed })
    }

    /// A topic emit inside the caller's transaction (or on any
    /// connection): reads the subscribers there, builds one event per
    /// handler with `client`'s checks ([`Client::prepare_topic`]) and stores
    /// them with [`PgStore::emit_in`]. Nothing is visible, and nothing will
    /// run, unless the caller commits; then publish with
    /// [`Client::notify_topic`] (if that never happens, the reconciler
    /// notifies them after its quiet period). No subscriber:
    /// [`ClientError::NoSubscribers`], nothing stored.
    ///
    /// ```no_run
    /// # async fn demo(store: herald_postgres::PgStore, client: herald::Client)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// // ... the application's own writes on `tx` ...
    /// let stored = store
    ///     .emit_topic_in(&mut tx, &client, "acme", "user.signup", r#"{"user":7}"#,
    ///                    herald::EmitOptions::default())
    ///     .await?;
    /// tx.commit().await?;
    /// client.notify_topic(&stored).await;
    /// # Ok(()) }
    /// ```
    pub async fn emit_topic_in(
        &self,
        conn: &mut PgConnection,
        client: &Client,
        tenant: &str,
        topic: &str,
        payload: &str,
        options: EmitOptions,
    ) -> Result<StoredTopicEmit, ClientError> {
        // The checks first, so that bad input reads nothing.
        client.check_topic_emit(tenant, topic, payload, &options)?;
        let handlers = self.subscribers_in(&mut *conn, tenant, topic).await?;
        let events = client.prepare_topic(tenant, topic, payload, options, &handlers)?;
        let emitted = self.emit_in(conn, &events).await?;
        Ok(StoredTopicEmit {
            topic: topic.to_string(),
            events,
            emitted,
        })
    }

    /// The handlers subscribed to `topic` for `tenant`, read inside the
    /// caller's transaction (or on any connection), as
    /// [`PgStore::emit_topic_in`] reads them.
    pub async fn subscribers_in(
        &self,
        conn: &mut PgConnection,
        tenant: &str,
        topic: &str,
    ) -> StoreResult<Vec<String>> {
        Ok(self.subscribers_on(conn, tenant, topic).await?)
    }
}
