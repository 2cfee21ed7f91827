//! Pause and block rules, and the re-notification of a handler's pending
//! events when a rule is lifted.

use herald::backend::{Scheduled, StoreResult};
use herald::{EventId, Millis, Rule, RuleKind, RuleMatch, StoreError};
use uuid::Uuid;

use crate::rows::{limit_i64, Ctx, DbResult};
use crate::PgStore;

fn rule_kind(kind: &str, op: &str) -> StoreResult<RuleKind> {
    RuleKind::parse(kind)
        .ok_or_else(|| StoreError::backend(op, format!("unknown rule kind {kind}")))
}

impl PgStore {
    /// One try of [`herald::backend::Rules::add_rule`]: whether the rule is new.
    pub(crate) async fn add_rule_once(&self, rule: &Rule) -> DbResult<bool> {
        self.exec_one(
            "add_rule",
            sqlx::query(&self.sql.add_rule)
                .bind(&rule.tenant)
                .bind(&rule.handler)
                .bind(rule.kind.as_str()),
        )
        .await
    }

    /// One try of [`herald::backend::Rules::remove_rule`]: whether the rule was there.
    pub(crate) async fn remove_rule_once(&self, rule: &Rule) -> DbResult<bool> {
        self.exec_one(
            "remove_rule",
            sqlx::query(&self.sql.remove_rule)
                .bind(&rule.tenant)
                .bind(&rule.handler)
                .bind(rule.kind.as_str()),
        )
        .await
    }

    /// [`herald::backend::Rules::rules_for`].
    pub(crate) async fn rules_for_once(
        &self,
        tenant: &str,
        handler: &str,
    ) -> StoreResult<RuleMatch> {
        const OP: &str = "rules_for";
        let kinds: Vec<String> = sqlx::query_scalar(&self.sql.rules_for)
            .bind(tenant)
            .bind(handler)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut m = RuleMatch::default();
        for k in kinds {
            match rule_kind(&k, OP)? {
                RuleKind::Block => m.blocked = true,
                RuleKind::Pause => m.paused = true,
            }
        }
        Ok(m)
    }

    /// [`herald::backend::Rules::rules`].
    pub(crate) async fn rules_once(&self) -> StoreResult<Vec<Rule>> {
        const OP: &str = "rules";
        let rows: Vec<(String, String, String)> = sqlx::query_as(&self.sql.rules)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        rows.into_iter()
            .map(|(tenant, handler, kind)| {
                Ok(Rule {
                    tenant,
                    handler,
                    kind: rule_kind(&kind, OP)?,
                })
            })
            .collect()
    }

    /// One try of [`herald::backend::Rules::renotify_page`].
    pub(crate) async fn renotify_once(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> DbResult<Vec<Scheduled>> {
        const OP: &str = "renotify_page";
        let q = match after {
            None => sqlx::query_as::<_, (Uuid, i64, i64)>(&self.sql.renotify),
            Some(_) => sqlx::query_as(&self.sql.renotify_after),
        }
        .bind(tenant)
        .bind(handler)
        .bind(limit_i64(limit));
        let q = match after {
            Some(a) => q.bind(a.0),
            None => q,
        };
        let mut page = q.fetch_all(&self.pool).await.ctx(OP)?;
        page.sort_unstable_by_key(|&(id, _, _)| id);
        Ok(page
            .into_iter()
            .map(|(id, run_at, now)| Scheduled {
                tenant: tenant.to_string(),
                event_id: EventId(id),
                delay: Millis(now).until(Millis(run_at)),
            })
            .collect())
    }
}
