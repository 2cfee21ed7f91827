//! Pause and block rules, and the re-notification of a handler's pending
//! events when a rule is lifted.

use herald::backend::{Scheduled, StoreResult};
use herald::{EventId, Millis, Rule, RuleKind, RuleMatch, StoreError};
use rusqlite::{params, Connection};

use crate::rows::{after_blob, event_id, sql_limit, Ctx};

/// One page of a handler's pending events, stamped notified: `?1` now,
/// `?2` tenant, `?3` handler, `?4` cursor, `?5` page size.
pub(crate) const RENOTIFY_SQL: &str = "UPDATE events SET notified_at = max(run_at, ?1) \
     WHERE id IN (SELECT id FROM events \
                  WHERE tenant = ?2 AND handler = ?3 AND state = 0 AND id > ?4 \
                  ORDER BY id LIMIT ?5) \
     RETURNING id, run_at";

/// The rules that match `(tenant, handler)`; `op` names the caller.
pub(crate) fn rule_match(
    conn: &Connection,
    op: &str,
    tenant: &str,
    handler: &str,
) -> StoreResult<RuleMatch> {
    let mut stmt = conn
        .prepare_cached("SELECT kind FROM rules WHERE tenant = ?1 AND handler = ?2")
        .ctx(op)?;
    let mut rows = stmt.query(params![tenant, handler]).ctx(op)?;
    let mut m = RuleMatch::default();
    while let Some(row) = rows.next().ctx(op)? {
        let kind: String = row.get(0).ctx(op)?;
        match RuleKind::parse(&kind) {
            Some(RuleKind::Block) => m.blocked = true,
            Some(RuleKind::Pause) => m.paused = true,
            None => return Err(StoreError::backend(op, format!("unknown rule kind {kind}"))),
        }
    }
    Ok(m)
}

/// [`herald::backend::Rules::add_rule`]: whether the rule is new.
pub(crate) fn add(conn: &Connection, now: Millis, rule: &Rule) -> StoreResult<bool> {
    conn.prepare_cached(
        "INSERT INTO rules (tenant, handler, kind, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT DO NOTHING",
    )
    .and_then(|mut st| {
        st.execute(params![
            rule.tenant,
            rule.handler,
            rule.kind.as_str(),
            now.0
        ])
    })
    .map(|n| n == 1)
    .ctx("add_rule")
}

/// [`herald::backend::Rules::remove_rule`]: whether the rule was there.
pub(crate) fn remove(conn: &Connection, rule: &Rule) -> StoreResult<bool> {
    conn.prepare_cached("DELETE FROM rules WHERE tenant = ?1 AND handler = ?2 AND kind = ?3")
        .and_then(|mut st| st.execute(params![rule.tenant, rule.handler, rule.kind.as_str()]))
        .map(|n| n == 1)
        .ctx("remove_rule")
}

/// [`herald::backend::Rules::rules`]: every rule, in order.
pub(crate) fn all(conn: &Connection) -> StoreResult<Vec<Rule>> {
    const OP: &str = "rules";
    let mut stmt = conn
        .prepare_cached("SELECT tenant, handler, kind FROM rules ORDER BY tenant, handler, kind")
        .ctx(OP)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .ctx(OP)?;
    let mut out = Vec::new();
    for row in rows {
        let (tenant, handler, kind) = row.ctx(OP)?;
        let kind = RuleKind::parse(&kind)
            .ok_or_else(|| StoreError::backend(OP, format!("unknown rule kind {kind}")))?;
        out.push(Rule {
            tenant,
            handler,
            kind,
        });
    }
    Ok(out)
}

/// [`herald::backend::Rules::renotify_page`]: one page of the handler's pending
/// events, stamped notified, in id order.
pub(crate) fn renotify_page(
    conn: &Connection,
    now: Millis,
    tenant: &str,
    handler: &str,
    after: Option<EventId>,
    limit: usize,
) -> StoreResult<Vec<Scheduled>> {
    const OP: &str = "renotify_page";
    let mut stmt = conn.prepare_cached(RENOTIFY_SQL).ctx(OP)?;
    let rows = stmt
        .query_map(
            params![now.0, tenant, handler, after_blob(after), sql_limit(limit)],
            |r| Ok((event_id(r, 0)?, Millis(r.get(1)?))),
        )
        .ctx(OP)?;
    let mut page: Vec<(EventId, Millis)> = rows.collect::<rusqlite::Result<_>>().ctx(OP)?;
    page.sort_unstable_by_key(|&(id, _)| id);
    Ok(page
        .into_iter()
        .map(|(id, run_at)| Scheduled {
            tenant: tenant.to_string(),
            event_id: id,
            delay: now.until(run_at),
        })
        .collect())
}
