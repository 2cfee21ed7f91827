//! Concurrency limits (ADR 0017): the claim's check of the limits that
//! count each claimed event, the settle's release of slots, the wake of
//! the events a full limit holds, and the limits themselves. Every
//! function runs inside the writer's transaction, so a count and the write
//! it decides are one atomic step (SQLite has one writer).

use std::collections::{HashMap, HashSet};

use herald::backend::{LeaseRef, Scheduled, StoreResult, WakePage};
use herald::{
    Event, EventId, Limit, LimitKind, LimitScope, LimitSource, LimitWait, Millis, StoredLimit,
};
use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{blob, event_id, token_blob, Ctx};

/// `notified_at` of a parked event.
const PARKED: i64 = i64::MAX;

/// Waiters woken in one scope whose limit is gone, per call.
const WAKE_UNLIMITED: i64 = 1000;

/// One scope as `limit_slots` and `limit_waits` name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Scope {
    kind: LimitKind,
    handler: String,
    tenant: String,
    key: String,
}

impl Scope {
    /// The scopes that could count `e`: its handler's, its tenant's, and
    /// its key's when it has one.
    fn of(e: &Event) -> Vec<Scope> {
        let scope = |kind, tenant: &str, key: &str| Scope {
            kind,
            handler: e.handler.clone(),
            tenant: tenant.to_string(),
            key: key.to_string(),
        };
        let mut out = vec![
            scope(LimitKind::Handler, "", ""),
            scope(LimitKind::Tenant, &e.tenant, ""),
        ];
        if let Some(k) = &e.concurrency_key {
            out.push(scope(LimitKind::Key, &e.tenant, k));
        }
        out
    }

    /// The scope's limit now: its own row before the default; `None`
    /// when none is set.
    fn limit(&self, conn: &Connection, op: &str) -> StoreResult<Option<i64>> {
        conn.prepare_cached(
            "SELECT running FROM limits WHERE handler = ?1 AND kind = ?2 \
               AND tenant IN (?3, '') AND key IN (?4, '') \
             ORDER BY tenant DESC, key DESC LIMIT 1",
        )
        .ctx(op)?
        .query_row(
            params![self.handler, self.kind.code(), self.tenant, self.key],
            |r| r.get(0),
        )
        .optional()
        .ctx(op)
    }

    /// The scope's live slots at `now`.
    fn live(&self, conn: &Connection, op: &str, now: Millis) -> StoreResult<i64> {
        conn.prepare_cached(
            "SELECT count(*) FROM limit_slots WHERE handler = ?1 AND kind = ?2 \
               AND tenant = ?3 AND key = ?4 AND expires_at > ?5",
        )
        .ctx(op)?
        .query_row(
            params![self.handler, self.kind.code(), self.tenant, self.key, now.0],
            |r| r.get(0),
        )
        .ctx(op)
    }
}

/// Whether a limit names one of `handlers`.
fn any_limit<'a>(
    conn: &Connection,
    op: &str,
    handlers: impl IntoIterator<Item = &'a str>,
) -> StoreResult<bool> {
    let mut stmt = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM limits WHERE handler = ?1)")
        .ctx(op)?;
    for h in handlers {
        if stmt.query_row([h], |r| r.get::<_, bool>(0)).ctx(op)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The claim's limit check, on the events the claim statement just took
/// in this transaction: in id order, an event whose every limited scope
/// has room keeps its claim and takes a slot in each (expiring with its
/// lease); any other has its claim undone (attempt, lease) and is parked,
/// waiting in the first of its scopes that is full. Returns the events
/// kept.
pub(crate) fn admit(
    conn: &Connection,
    now: Millis,
    claimed: Vec<Event>,
) -> StoreResult<Vec<Event>> {
    const OP: &str = "claim";
    let handlers: HashSet<&str> = claimed.iter().map(|e| e.handler.as_str()).collect();
    if claimed.is_empty() || !any_limit(conn, OP, handlers)? {
        return Ok(claimed);
    }
    let mut claimed = claimed;
    claimed.sort_by_key(|e| e.id);
    // Each scope's room left, looked up once; `None`: no limit counts it.
    let mut room: HashMap<Scope, Option<i64>> = HashMap::new();
    let mut take = conn
        .prepare_cached(
            "INSERT INTO limit_slots (token, kind, handler, tenant, key, event_id, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .ctx(OP)?;
    let mut undo = conn
        .prepare_cached(
            "UPDATE events SET attempt = attempt - 1, lease_token = NULL, \
                 lease_expires_at = NULL, notified_at = ?2 \
             WHERE id = ?1 AND state = 0",
        )
        .ctx(OP)?;
    let mut wait = conn
        .prepare_cached(
            "INSERT INTO limit_waits (handler, kind, tenant, key, event_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .ctx(OP)?;
    let mut kept = Vec::with_capacity(claimed.len());
    for e in claimed {
        let mut limited = Vec::new();
        for s in Scope::of(&e) {
            let left = match room.get(&s) {
                Some(r) => *r,
                None => {
                    let r = match s.limit(conn, OP)? {
                        Some(limit) => Some(limit - s.live(conn, OP, now)?),
                        None => None,
                    };
                    room.insert(s.clone(), r);
                    r
                }
            };
            if let Some(left) = left {
                limited.push((s, left));
            }
        }
        let Some(lease) = e.lease else {
            kept.push(e);
            continue;
        };
        if let Some((full, _)) = limited.iter().find(|(_, left)| *left <= 0) {
            undo.execute(params![blob(e.id), PARKED]).ctx(OP)?;
            wait.execute(params![
                full.handler,
                full.kind.code(),
                full.tenant,
                full.key,
                blob(e.id)
            ])
            .ctx(OP)?;
            continue;
        }
        for (s, left) in limited {
            take.execute(params![
                token_blob(lease.token),
                s.kind.code(),
                s.handler,
                s.tenant,
                s.key,
                blob(e.id),
                lease.expires_at.0
            ])
            .ctx(OP)?;
            room.insert(s, Some(left - 1));
        }
        kept.push(e);
    }
    Ok(kept)
}

/// Ends the slots of runs whose settle held and wakes, in each scope that
/// lost one, as many waiters as it has room for now.
pub(crate) fn free(
    conn: &Connection,
    now: Millis,
    tokens: &[LeaseRef],
) -> StoreResult<Vec<Scheduled>> {
    const OP: &str = "settle";
    let mut delete = conn
        .prepare_cached(
            "DELETE FROM limit_slots WHERE token = ?1 RETURNING kind, handler, tenant, key",
        )
        .ctx(OP)?;
    let mut freed = Vec::new();
    for l in tokens {
        let rows = delete.query_map([token_blob(l.token)], scope_row).ctx(OP)?;
        for s in rows {
            freed.push(s.ctx(OP)?);
        }
    }
    wake_scopes(conn, OP, now, freed)
}

fn scope_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Scope> {
    let code: i64 = r.get(0)?;
    let kind = LimitKind::from_code(code).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Integer,
            format!("unknown limit kind {code}").into(),
        )
    })?;
    Ok(Scope {
        kind,
        handler: r.get(1)?,
        tenant: r.get(2)?,
        key: r.get(3)?,
    })
}

/// Wakes, in each of `scopes` (each once), as many waiters as it has room
/// for now (up to [`WAKE_UNLIMITED`] where its limit is gone).
fn wake_scopes(
    conn: &Connection,
    op: &str,
    now: Millis,
    scopes: Vec<Scope>,
) -> StoreResult<Vec<Scheduled>> {
    let mut seen = HashSet::new();
    let mut woken = Vec::new();
    for s in scopes {
        if !seen.insert(s.clone()) {
            continue;
        }
        let room = match s.limit(conn, op)? {
            Some(limit) => (limit - s.live(conn, op, now)?).min(WAKE_UNLIMITED),
            None => WAKE_UNLIMITED,
        };
        if room > 0 {
            woken.extend(wake_scope(conn, op, now, &s, room)?);
        }
    }
    Ok(woken)
}

/// Wakes up to `want` of the events parked in `scope`, oldest first: each
/// is un-parked (notified now) and returned. A waiter whose event is no
/// longer parked (unpaused, retried, deleted) is dropped without counting.
fn wake_scope(
    conn: &Connection,
    op: &str,
    now: Millis,
    scope: &Scope,
    mut want: i64,
) -> StoreResult<Vec<Scheduled>> {
    let mut next = conn
        .prepare_cached(
            "SELECT seq, event_id FROM limit_waits \
             WHERE handler = ?1 AND kind = ?2 AND tenant = ?3 AND key = ?4 \
             ORDER BY seq LIMIT ?5",
        )
        .ctx(op)?;
    let mut forget = conn
        .prepare_cached("DELETE FROM limit_waits WHERE seq = ?1")
        .ctx(op)?;
    let mut unpark = conn
        .prepare_cached(
            "UPDATE events SET notified_at = max(run_at, ?2) \
             WHERE id = ?1 AND state = 0 AND notified_at = ?3 RETURNING tenant",
        )
        .ctx(op)?;
    let mut woken = Vec::new();
    while want > 0 {
        let page: Vec<(i64, EventId)> = next
            .query_map(
                params![
                    scope.handler,
                    scope.kind.code(),
                    scope.tenant,
                    scope.key,
                    want
                ],
                |r| Ok((r.get(0)?, event_id(r, 1)?)),
            )
            .ctx(op)?
            .collect::<rusqlite::Result<_>>()
            .ctx(op)?;
        let asked = want;
        for &(seq, id) in &page {
            forget.execute([seq]).ctx(op)?;
            let tenant: Option<String> = unpark
                .query_row(params![blob(id), now.0, PARKED], |r| r.get(0))
                .optional()
                .ctx(op)?;
            if let Some(tenant) = tenant {
                woken.push(Scheduled::due(tenant, id));
                want -= 1;
            }
        }
        if (page.len() as i64) < asked {
            break;
        }
    }
    Ok(woken)
}

/// Extends the slots of renewed runs to the lease's new expiry.
pub(crate) fn renew(conn: &Connection, renewed: &[LeaseRef], until: Millis) -> StoreResult<()> {
    const OP: &str = "renew";
    let mut stmt = conn
        .prepare_cached("UPDATE limit_slots SET expires_at = ?2 WHERE token = ?1")
        .ctx(OP)?;
    for l in renewed {
        stmt.execute(params![token_blob(l.token), until.0])
            .ctx(OP)?;
    }
    Ok(())
}

/// The full limit that holds `id`, if it is parked with a waiter's row.
pub(crate) fn waiting(
    conn: &Connection,
    now: Millis,
    id: EventId,
    handler: &str,
) -> StoreResult<Option<LimitWait>> {
    const OP: &str = "inspect";
    let scope = conn
        .prepare_cached(
            "SELECT w.kind, w.handler, w.tenant, w.key FROM limit_waits AS w \
             JOIN events AS e ON e.id = w.event_id \
             WHERE w.event_id = ?1 AND e.notified_at = ?2 ORDER BY w.seq DESC LIMIT 1",
        )
        .ctx(OP)?
        .query_row(params![blob(id), PARKED], scope_row)
        .optional()
        .ctx(OP)?;
    let Some(scope) = scope else {
        return Ok(None);
    };
    let running = scope.live(conn, OP, now)?;
    let limit = scope.limit(conn, OP)?;
    Ok(Some(LimitWait {
        handler: handler.to_string(),
        scope: LimitScope::from_names(scope.kind, &scope.tenant, &scope.key),
        running: u32::try_from(running).unwrap_or(u32::MAX),
        limit: limit.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
    }))
}

/// [`herald::backend::Reconciliation::lapse_slots`].
pub(crate) fn lapse(conn: &Connection, now: Millis, limit: usize) -> StoreResult<Vec<Scheduled>> {
    const OP: &str = "lapse_slots";
    let lapsed: Vec<Scope> = conn
        .prepare_cached(
            "DELETE FROM limit_slots WHERE rowid IN \
               (SELECT rowid FROM limit_slots WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2) \
             RETURNING kind, handler, tenant, key",
        )
        .ctx(OP)?
        .query_map(params![now.0, crate::rows::sql_limit(limit)], scope_row)
        .ctx(OP)?
        .collect::<rusqlite::Result<_>>()
        .ctx(OP)?;
    wake_scopes(conn, OP, now, lapsed)
}

/// [`herald::backend::Limits::set_limit`] (source `api`).
pub(crate) fn set(
    conn: &Connection,
    now: Millis,
    limit: &Limit,
    source: LimitSource,
) -> StoreResult<bool> {
    const OP: &str = "set_limit";
    let (tenant, key) = limit.scope.names();
    conn.prepare_cached(
        "INSERT INTO limits (handler, kind, tenant, key, running, source, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (handler, kind, tenant, key) DO UPDATE \
           SET running = excluded.running, source = excluded.source \
           WHERE running <> excluded.running OR source <> excluded.source",
    )
    .ctx(OP)?
    .execute(params![
        limit.handler,
        limit.scope.kind().code(),
        tenant,
        key,
        i64::from(limit.running),
        source.as_str(),
        now.0
    ])
    .map(|n| n == 1)
    .ctx(OP)
}

/// [`herald::backend::Limits::remove_limit`].
pub(crate) fn remove(conn: &Connection, handler: &str, scope: &LimitScope) -> StoreResult<bool> {
    const OP: &str = "remove_limit";
    let (tenant, key) = scope.names();
    conn.prepare_cached(
        "DELETE FROM limits WHERE handler = ?1 AND kind = ?2 AND tenant = ?3 AND key = ?4",
    )
    .ctx(OP)?
    .execute(params![handler, scope.kind().code(), tenant, key])
    .map(|n| n == 1)
    .ctx(OP)
}

/// [`herald::backend::Limits::limits`].
pub(crate) fn list(conn: &Connection, handler: Option<&str>) -> StoreResult<Vec<StoredLimit>> {
    const OP: &str = "limits";
    let mut stmt = conn
        .prepare_cached(
            "SELECT handler, kind, tenant, key, running, source FROM limits \
             WHERE ?1 IS NULL OR handler = ?1 ORDER BY handler, kind, tenant, key",
        )
        .ctx(OP)?;
    let rows = stmt
        .query_map([handler], |r| {
            let kind: i64 = r.get(1)?;
            let source: String = r.get(5)?;
            let running: i64 = r.get(4)?;
            Ok((
                r.get::<_, String>(0)?,
                kind,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                running,
                source,
            ))
        })
        .ctx(OP)?;
    let mut out = Vec::new();
    for row in rows {
        let (handler, kind, tenant, key, running, source) = row.ctx(OP)?;
        let (Some(kind), Some(source)) = (LimitKind::from_code(kind), LimitSource::parse(&source))
        else {
            return Err(herald::StoreError::backend(
                OP,
                format!("a limit row of kind {kind} and source {source:?} is not herald's"),
            ));
        };
        out.push(StoredLimit {
            limit: Limit {
                handler,
                scope: LimitScope::from_names(kind, &tenant, &key),
                running: u32::try_from(running).unwrap_or(u32::MAX),
            },
            source,
        });
    }
    Ok(out)
}

/// [`herald::backend::Limits::sync_limits`].
pub(crate) fn sync(
    conn: &Connection,
    now: Millis,
    declared: &[Limit],
) -> StoreResult<Vec<(String, LimitKind)>> {
    let before = list(conn, None)?;
    let mut loosened: Vec<(String, LimitKind)> = Vec::new();
    let declared_keys: HashSet<(&str, &LimitScope)> = declared
        .iter()
        .map(|l| (l.handler.as_str(), &l.scope))
        .collect();
    for old in before.iter().filter(|o| o.source == LimitSource::Config) {
        if !declared_keys.contains(&(old.limit.handler.as_str(), &old.limit.scope)) {
            remove(conn, &old.limit.handler, &old.limit.scope)?;
            loosened.push((old.limit.handler.clone(), old.limit.scope.kind()));
        }
    }
    for l in declared {
        let prior = before
            .iter()
            .find(|o| o.limit.handler == l.handler && o.limit.scope == l.scope);
        if set(conn, now, l, LimitSource::Config)?
            && prior.is_some_and(|p| p.limit.running < l.running)
        {
            loosened.push((l.handler.clone(), l.scope.kind()));
        }
    }
    loosened.sort();
    loosened.dedup();
    Ok(loosened)
}

/// [`herald::backend::Limits::wake_limit`].
pub(crate) fn wake_limit(
    conn: &Connection,
    now: Millis,
    handler: &str,
    kind: LimitKind,
    after: Option<(String, String)>,
    scopes: usize,
) -> StoreResult<WakePage> {
    const OP: &str = "wake_limit";
    let (after_tenant, after_key) = match after {
        Some((t, k)) => (Some(t), Some(k)),
        None => (None, None),
    };
    let found: Vec<Scope> = conn
        .prepare_cached(
            "SELECT DISTINCT ?2, ?1, tenant, key FROM limit_waits \
             WHERE handler = ?1 AND kind = ?2 AND (?3 IS NULL OR (tenant, key) > (?3, ?4)) \
             ORDER BY tenant, key LIMIT ?5",
        )
        .ctx(OP)?
        .query_map(
            params![
                handler,
                kind.code(),
                after_tenant,
                after_key,
                crate::rows::sql_limit(scopes)
            ],
            scope_row,
        )
        .ctx(OP)?
        .collect::<rusqlite::Result<_>>()
        .ctx(OP)?;
    let next = (found.len() >= scopes)
        .then(|| found.last().map(|s| (s.tenant.clone(), s.key.clone())))
        .flatten();
    let woken = wake_scopes(conn, OP, now, found)?;
    Ok(WakePage { woken, next })
}
