//! Limits (ADR 0017): the claim's check of the concurrency limits and
//! rates that count each claimed event, the settle's release of slots,
//! the wake of the events a full limit holds, and the limits themselves.
//! Every function runs inside the writer's transaction, so a count and
//! the write it decides are one atomic step (SQLite has one writer).

use std::collections::{HashMap, HashSet};

use herald::backend::{LeaseRef, Scheduled, StoreResult, WakePage};
use herald::limit::Rate;
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

    /// The scope's concurrency limit now: its own row before the
    /// default; `None` when none is set.
    fn limit(&self, conn: &Connection, op: &str) -> StoreResult<Option<i64>> {
        Ok(self.row(conn, op)?.and_then(|r| r.running))
    }

    /// The scope's limits row now (its own before the default), if any.
    fn row(&self, conn: &Connection, op: &str) -> StoreResult<Option<ScopeRow>> {
        conn.prepare_cached(
            "SELECT running, starts, period_ms, burst FROM limits WHERE handler = ?1 AND kind = ?2 \
               AND tenant IN (?3, '') AND key IN (?4, '') \
             ORDER BY tenant DESC, key DESC LIMIT 1",
        )
        .ctx(op)?
        .query_row(
            params![self.handler, self.kind.code(), self.tenant, self.key],
            |r| {
                let starts: Option<i64> = r.get(1)?;
                let period_ms: Option<i64> = r.get(2)?;
                let burst: Option<i64> = r.get(3)?;
                let rate = match (starts, period_ms, burst) {
                    (Some(n), Some(p), Some(b)) => {
                        let interval = (p * 1000 / n.max(1)).max(1);
                        Some((interval, (b - 1).max(0) * interval))
                    }
                    _ => None,
                };
                Ok(ScopeRow {
                    running: r.get(0)?,
                    rate,
                })
            },
        )
        .optional()
        .ctx(op)
    }

    /// The scope's GCRA theoretical arrival time (µs), 0 when it has none.
    fn tat(&self, conn: &Connection, op: &str) -> StoreResult<i64> {
        Ok(conn
            .prepare_cached(
                "SELECT tat FROM rate_state WHERE handler = ?1 AND kind = ?2 AND tenant = ?3 AND key = ?4",
            )
            .ctx(op)?
            .query_row(
                params![self.handler, self.kind.code(), self.tenant, self.key],
                |r| r.get(0),
            )
            .optional()
            .ctx(op)?
            .unwrap_or(0))
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

/// A scope's limits: the concurrency limit, and the rate's interval and
/// burst tolerance in µs.
struct ScopeRow {
    running: Option<i64>,
    rate: Option<(i64, i64)>,
}

/// A limited scope as the claim walks it: its room (`None`: no
/// concurrency limit), its rate (interval, tolerance) and theoretical
/// arrival time, and whether this claim moved that.
struct Walk {
    room: Option<i64>,
    rate: Option<(i64, i64)>,
    tat: i64,
    charged: bool,
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
/// in this transaction, in id order: one whose concurrency scope is full
/// has its claim undone (attempt, lease) and is parked, waiting in the
/// first full scope; else one over a rate has its claim undone and is
/// given its turn (`run_at` moves there, the turn booked: `rate_turn`, and
/// each rate scope's time moves one interval past it); any other keeps its
/// claim, takes a slot in each concurrency scope (expiring with its lease)
/// and advances each rate scope. A booked event claimed within an interval
/// of its turn is not charged again. Returns the events kept.
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
    let now_us = now.0.saturating_mul(1000);
    let mut claimed = claimed;
    claimed.sort_by_key(|e| e.id);
    // Each scope's state, looked up once; `None`: no limit counts it.
    let mut walk: HashMap<Scope, Option<Walk>> = HashMap::new();
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
    let mut defer = conn
        .prepare_cached(
            "UPDATE events SET attempt = attempt - 1, lease_token = NULL, \
                 lease_expires_at = NULL, run_at = ?2, notified_at = ?2, rate_turn = ?2 \
             WHERE id = ?1 AND state = 0",
        )
        .ctx(OP)?;
    let mut booked_of = conn
        .prepare_cached("SELECT rate_turn FROM events WHERE id = ?1")
        .ctx(OP)?;
    let mut spent = conn
        .prepare_cached("UPDATE events SET rate_turn = NULL WHERE id = ?1")
        .ctx(OP)?;
    let mut wait = conn
        .prepare_cached(
            "INSERT INTO limit_waits (handler, kind, tenant, key, event_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .ctx(OP)?;
    let mut kept = Vec::with_capacity(claimed.len());
    for e in claimed {
        let mut scopes = Vec::new();
        for s in Scope::of(&e) {
            if !walk.contains_key(&s) {
                let state = match s.row(conn, OP)? {
                    None => None,
                    Some(row) => Some(Walk {
                        room: match row.running {
                            Some(limit) => Some(limit - s.live(conn, OP, now)?),
                            None => None,
                        },
                        rate: row.rate,
                        tat: if row.rate.is_some() {
                            s.tat(conn, OP)?
                        } else {
                            0
                        },
                        charged: false,
                    }),
                };
                walk.insert(s.clone(), state);
            }
            if walk[&s].is_some() {
                scopes.push(s);
            }
        }
        let Some(lease) = e.lease.filter(|_| !scopes.is_empty()) else {
            kept.push(e);
            continue;
        };
        let state = |s: &Scope| walk[s].as_ref().expect("a limited scope");
        if let Some(full) = scopes
            .iter()
            .find(|s| state(s).room.is_some_and(|r| r <= 0))
        {
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
        let booked: Option<i64> = if scopes.iter().any(|s| state(s).rate.is_some()) {
            booked_of.query_row([blob(e.id)], |r| r.get(0)).ctx(OP)?
        } else {
            None
        };
        // Paid: this claim is its booked turn, within one interval of it.
        let paid =
            |interval: i64| booked.is_some_and(|b| now_us < b.saturating_mul(1000) + interval);
        let turn = scopes
            .iter()
            .filter_map(|s| {
                let w = state(s);
                let (interval, tau) = w.rate?;
                (!paid(interval) && w.tat > now_us + tau).then_some(w.tat - tau)
            })
            .max();
        if let Some(turn) = turn {
            for s in &scopes {
                let w = walk
                    .get_mut(s)
                    .and_then(Option::as_mut)
                    .expect("a limited scope");
                if let Some((interval, _)) = w.rate {
                    w.tat = w.tat.max(turn) + interval;
                    w.charged = true;
                }
            }
            defer
                .execute(params![blob(e.id), (turn + 999) / 1000])
                .ctx(OP)?;
            continue;
        }
        for s in &scopes {
            let w = walk
                .get_mut(s)
                .and_then(Option::as_mut)
                .expect("a limited scope");
            if let Some(room) = w.room.as_mut() {
                *room -= 1;
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
            }
            if let Some((interval, _)) = w.rate {
                if !paid(interval) {
                    w.tat = w.tat.max(now_us) + interval;
                    w.charged = true;
                }
            }
        }
        if booked.is_some() {
            spent.execute([blob(e.id)]).ctx(OP)?;
        }
        kept.push(e);
    }
    let mut save = conn
        .prepare_cached(
            "INSERT INTO rate_state (handler, kind, tenant, key, tat) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (handler, kind, tenant, key) DO UPDATE SET tat = excluded.tat",
        )
        .ctx(OP)?;
    for (s, w) in &walk {
        if let Some(w) = w.as_ref().filter(|w| w.charged) {
            save.execute(params![s.handler, s.kind.code(), s.tenant, s.key, w.tat])
                .ctx(OP)?;
        }
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
        "INSERT INTO limits (handler, kind, tenant, key, running, source, created_at, \
             starts, period_ms, burst) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (handler, kind, tenant, key) DO UPDATE \
           SET running = excluded.running, source = excluded.source, starts = excluded.starts, \
               period_ms = excluded.period_ms, burst = excluded.burst \
           WHERE running IS NOT excluded.running OR source IS NOT excluded.source \
              OR starts IS NOT excluded.starts OR period_ms IS NOT excluded.period_ms \
              OR burst IS NOT excluded.burst",
    )
    .ctx(OP)?
    .execute(params![
        limit.handler,
        limit.scope.kind().code(),
        tenant,
        key,
        limit.running.map(i64::from),
        source.as_str(),
        now.0,
        limit.rate.map(|r| i64::from(r.starts)),
        limit.rate.map(|r| r.period.as_millis() as i64),
        limit.rate.map(|r| i64::from(r.burst)),
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
            "SELECT handler, kind, tenant, key, running, source, starts, period_ms, burst \
             FROM limits WHERE ?1 IS NULL OR handler = ?1 ORDER BY handler, kind, tenant, key",
        )
        .ctx(OP)?;
    let rows = stmt
        .query_map([handler], |r| {
            let rate = match (
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<i64>>(8)?,
            ) {
                (Some(starts), Some(period), Some(burst)) => Some(Rate {
                    starts: u32::try_from(starts).unwrap_or(0),
                    period: std::time::Duration::from_millis(u64::try_from(period).unwrap_or(0)),
                    burst: u32::try_from(burst).unwrap_or(1),
                }),
                _ => None,
            };
            Ok(Row {
                handler: r.get(0)?,
                kind: r.get(1)?,
                tenant: r.get(2)?,
                key: r.get(3)?,
                running: r.get(4)?,
                source: r.get(5)?,
                rate,
            })
        })
        .ctx(OP)?;
    struct Row {
        handler: String,
        kind: i64,
        tenant: String,
        key: String,
        running: Option<i64>,
        source: String,
        rate: Option<Rate>,
    }
    let mut out = Vec::new();
    for row in rows {
        let row = row.ctx(OP)?;
        let (Some(kind), Some(source)) = (
            LimitKind::from_code(row.kind),
            LimitSource::parse(&row.source),
        ) else {
            return Err(herald::StoreError::backend(
                OP,
                format!(
                    "a limit row of kind {} and source {:?} is not herald's",
                    row.kind, row.source
                ),
            ));
        };
        out.push(StoredLimit {
            limit: Limit {
                scope: LimitScope::from_names(kind, &row.tenant, &row.key),
                handler: row.handler,
                running: row.running.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                rate: row.rate,
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
        let loosens = prior.is_some_and(|p| match (p.limit.running, l.running) {
            (Some(_), None) => true,
            (Some(old), Some(new)) => new > old,
            _ => false,
        });
        if set(conn, now, l, LimitSource::Config)? && loosens {
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
