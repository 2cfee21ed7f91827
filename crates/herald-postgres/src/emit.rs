//! Storing new events: one insert per batch, look-ups for the idempotency
//! keys (their stored rows first, then the live events of those that
//! conflicted), and the tries again after a lost connection.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald::backend::StoreResult;
use herald::escape::escaped;
use herald::{Emitted, EventId, Keep, NewEvent, RunAt, StoreError};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::retry::rand_millis;
use crate::rows::{limit_i64, max_attempts, ms, Ctx, DbResult};
use crate::PgStore;

/// Tries of an emit whose connection was lost, and the pause before the
/// second: it doubles after each try (100, 200, 400, 800, 1600 ms, each
/// ±25%), about 3.1 s in all before [`StoreError::Unavailable`].
/// docs/postgres.md documents it.
pub const EMIT_TRIES: u32 = 6;
/// The pause after an emit's first lost connection; see [`EMIT_TRIES`].
pub const EMIT_FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The pause before try `tries + 1` of an emit (`tries` from 1), with
/// `jitter` in `[0, 1)` spreading it over ±25%.
fn emit_pause(tries: u32, jitter: f64) -> Duration {
    let base = EMIT_FIRST_PAUSE * 2u32.pow(tries.saturating_sub(1).min(16));
    base.mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// What a retried emit returns: an event found under its own id was
/// stored by an earlier try of this same call (its ids are fresh), so it
/// counts as created, and its notification is published. A repeat of an
/// older emit would be notified twice, which is harmless.
fn after_retry(events: &[NewEvent], emitted: Vec<Emitted>) -> Vec<Emitted> {
    events
        .iter()
        .zip(emitted)
        .map(|(e, out)| match out {
            Emitted::Existing(id) if id == e.id => Emitted::Created(id),
            other => other,
        })
        .collect()
}

/// An event's `run_at` as the emit statement takes it: the absolute time
/// of [`RunAt::At`], or the delay in ms of [`RunAt::After`], which the
/// statement adds to the database's now.
fn run_at(e: &NewEvent) -> (Option<i64>, Option<i64>) {
    match e.run_at {
        RunAt::At(at) => (Some(at.0), None),
        RunAt::After(d) => (None, Some(d.as_millis().min(i64::MAX as u128) as i64)),
    }
}

/// Takes a singleton key's lock for the transaction: `$1` tenant, `$2`
/// handler, `$3` key.
const SINGLETON_LOCK: &str = "SELECT pg_advisory_xact_lock(1751478882, \
     hashtext($1 || '/' || $2 || '/' || $3))";

/// The oldest waiting event of a singleton key: pending, not under a live
/// lease (by the database's clock).
const SINGLETON_WAITING: &str = "SELECT e.id FROM {s}.events AS e \
     WHERE e.tenant = $1 AND e.handler = $2 AND e.singleton_key = $3 AND e.state = 0 \
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= {now}) \
     ORDER BY e.id_key LIMIT 1";

/// Deletes a singleton key's waiting events.
const SINGLETON_REPLACE: &str = "DELETE FROM {s}.events AS e \
     WHERE e.tenant = $1 AND e.handler = $2 AND e.singleton_key = $3 AND e.state = 0 \
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= {now})";

impl PgStore {
    /// Inserts a batch on one connection: one statement, plus look-ups for
    /// the keyed events that conflicted.
    pub(crate) async fn emit_on(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> DbResult<Vec<Emitted>> {
        const OP: &str = "emit";
        let mut out: Vec<Option<Emitted>> = vec![None; events.len()];
        // Repeats within the batch take the first one's result.
        let mut first_of_id: HashMap<EventId, usize> = HashMap::new();
        let mut first_of_key: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut todo: Vec<usize> = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            if let Some(&j) = first_of_id.get(&e.id) {
                repeats.push((i, j));
                continue;
            }
            if let Some(key) = &e.idempotency_key {
                match first_of_key.entry((&e.tenant, &e.handler, key)) {
                    Entry::Occupied(o) => {
                        repeats.push((i, *o.get()));
                        continue;
                    }
                    Entry::Vacant(v) => {
                        v.insert(i);
                    }
                }
            }
            first_of_id.insert(e.id, i);
            todo.push(i);
        }
        // A key stored by an earlier emit names its event, finished or not
        // (ADR 0013): one look-up for the batch's keys.
        let keyed: Vec<usize> = todo
            .iter()
            .copied()
            .filter(|&i| events[i].idempotency_key.is_some())
            .collect();
        if !keyed.is_empty() {
            let rows = self
                .key_rows(conn, &self.sql.stored_keys, events, &keyed)
                .await?;
            for (i, id) in rows {
                out[i as usize] = Some(Emitted::Existing(EventId(id)));
            }
            todo.retain(|&i| out[i].is_none());
        }
        // An idempotent hit can race with the live event's end (deleted
        // between our conflict and our look-up): try again, a few times.
        for _round in 0..5 {
            if todo.is_empty() {
                break;
            }
            let batch: Vec<&NewEvent> = todo.iter().map(|&i| &events[i]).collect();
            let insert = if batch.iter().any(|e| e.idempotency_key.is_some()) {
                &self.sql.emit_keyed
            } else {
                &self.sql.emit
            };
            let inserted: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(insert)
                .bind(batch.iter().map(|e| e.id.0).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.tenant.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.handler.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.payload.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| run_at(e).0).collect::<Vec<_>>())
                .bind(
                    batch
                        .iter()
                        .map(|e| max_attempts(e.max_attempts))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    batch
                        .iter()
                        .map(|e| e.idempotency_key.as_deref())
                        .collect::<Vec<_>>(),
                )
                .bind(batch.iter().map(|e| e.topic.as_deref()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| run_at(e).1).collect::<Vec<_>>())
                .bind(
                    batch
                        .iter()
                        .map(|e| e.concurrency_key.as_deref())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    batch
                        .iter()
                        .map(|e| e.singleton.as_ref().map(|s| s.key.as_str()))
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *conn)
                .await
                .ctx(OP)?
                .into_iter()
                .collect();
            let mut keyed = Vec::new();
            for &i in &todo {
                let e = &events[i];
                if inserted.contains(&e.id.0) {
                    out[i] = Some(Emitted::Created(e.id));
                } else if e.idempotency_key.is_some() {
                    keyed.push(i);
                } else {
                    // Only the primary key can conflict: a retried emit
                    // whose first try committed.
                    out[i] = Some(Emitted::Existing(e.id));
                }
            }
            todo.clear();
            if keyed.is_empty() {
                break;
            }
            let rows = self
                .key_rows(conn, &self.sql.existing_keys, events, &keyed)
                .await?;
            for (i, id) in rows {
                out[i as usize] = Some(Emitted::Existing(EventId(id)));
            }
            let unresolved: Vec<usize> = keyed.into_iter().filter(|&i| out[i].is_none()).collect();
            if unresolved.is_empty() {
                break;
            }
            // No live event holds the key: the conflict was on the id (the
            // same event emitted again), or the live one just ended.
            let ids: Vec<Uuid> = unresolved.iter().map(|&i| events[i].id.0).collect();
            let stored: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(&self.sql.existing_ids)
                .bind(&ids)
                .fetch_all(&mut *conn)
                .await
                .ctx(OP)?
                .into_iter()
                .collect();
            for i in unresolved {
                if stored.contains(&events[i].id.0) {
                    out[i] = Some(Emitted::Existing(events[i].id));
                } else {
                    todo.push(i);
                }
            }
        }
        if !todo.is_empty() {
            return Err(StoreError::backend(
                OP,
                format!(
                    "{} event(s) kept conflicting on their idempotency keys; try again",
                    todo.len()
                ),
            )
            .into());
        }
        for (i, j) in repeats {
            let first = out[j].expect("the first of a repeat is resolved");
            out[i] = Some(Emitted::Existing(first.id()));
        }
        Ok(out
            .into_iter()
            .map(|e| e.expect("every event is resolved"))
            .collect())
    }

    /// The events that hold the keys of `events[i]` for each `i` of `keyed`,
    /// by `statement` ([`crate::sql::Sql::stored_keys`] or
    /// [`crate::sql::Sql::existing_keys`]): `(i, id)` for those held.
    async fn key_rows(
        &self,
        conn: &mut PgConnection,
        statement: &str,
        events: &[NewEvent],
        keyed: &[usize],
    ) -> DbResult<Vec<(i32, Uuid)>> {
        sqlx::query_as(statement)
            .bind(
                keyed
                    .iter()
                    .map(|&i| events[i].tenant.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                keyed
                    .iter()
                    .map(|&i| events[i].handler.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                keyed
                    .iter()
                    .map(|&i| events[i].idempotency_key.as_deref().unwrap_or_default())
                    .collect::<Vec<_>>(),
            )
            .bind(keyed.iter().map(|&i| i as i32).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await
            .ctx("emit")
    }

    /// One try of [`herald::backend::Reconciliation::purge_keys`].
    pub(crate) async fn purge_keys_once(&self, window: Duration, limit: usize) -> DbResult<u64> {
        let gone: i64 = sqlx::query_scalar(&self.sql.purge_keys)
            .bind(ms(window))
            .bind(limit_i64(limit))
            .fetch_one(&self.pool)
            .await
            .ctx("purge_keys")?;
        Ok(gone.max(0) as u64)
    }

    /// [`herald::backend::EventStore::emit`] once: a single statement when no event has a key,
    /// otherwise a transaction (the look-ups follow the insert, and a
    /// failure must store nothing).
    pub(crate) async fn emit_once(&self, events: &[NewEvent]) -> DbResult<Vec<Emitted>> {
        if events.iter().any(|e| e.singleton.is_some()) {
            let mut tx = self.pool.begin().await.ctx("emit")?;
            let out = self.emit_singletons(&mut tx, events).await?;
            tx.commit().await.ctx("emit")?;
            return Ok(out);
        }
        if events.iter().all(|e| e.idempotency_key.is_none()) {
            let mut conn = self.pool.acquire().await.ctx("emit")?;
            return self.emit_on(&mut conn, events).await;
        }
        let mut tx = self.pool.begin().await.ctx("emit")?;
        let out = self.emit_on(&mut tx, events).await?;
        tx.commit().await.ctx("emit")?;
        Ok(out)
    }

    /// A batch with singleton keys, in one transaction: the others in one
    /// insert, then each singleton event in order, under its key's
    /// transaction-scoped advisory lock, so that two emits of one key take
    /// turns: [`Keep::Oldest`] finds a waiting event of its key (pending,
    /// not under a live lease) and stores nothing, or inserts;
    /// [`Keep::Newest`] deletes the waiting ones, then inserts.
    async fn emit_singletons(
        &self,
        tx: &mut PgConnection,
        events: &[NewEvent],
    ) -> DbResult<Vec<Emitted>> {
        const OP: &str = "emit";
        let (singles, rest): (Vec<usize>, Vec<usize>) =
            (0..events.len()).partition(|&i| events[i].singleton.is_some());
        let mut out: Vec<Option<Emitted>> = vec![None; events.len()];
        if !rest.is_empty() {
            let batch: Vec<NewEvent> = rest.iter().map(|&i| events[i].clone()).collect();
            for (&i, e) in rest.iter().zip(self.emit_on(tx, &batch).await?) {
                out[i] = Some(e);
            }
        }
        for i in singles {
            let e = &events[i];
            let Some(single) = &e.singleton else { continue };
            sqlx::query(&self.sql.fill(SINGLETON_LOCK))
                .bind(&e.tenant)
                .bind(&e.handler)
                .bind(&single.key)
                .execute(&mut *tx)
                .await
                .ctx(OP)?;
            if single.keep == Keep::Oldest {
                let waiting: Option<Uuid> = sqlx::query_scalar(&self.sql.fill(SINGLETON_WAITING))
                    .bind(&e.tenant)
                    .bind(&e.handler)
                    .bind(&single.key)
                    .fetch_optional(&mut *tx)
                    .await
                    .ctx(OP)?;
                if let Some(id) = waiting {
                    out[i] = Some(Emitted::Existing(EventId(id)));
                    continue;
                }
            } else {
                sqlx::query(&self.sql.fill(SINGLETON_REPLACE))
                    .bind(&e.tenant)
                    .bind(&e.handler)
                    .bind(&single.key)
                    .execute(&mut *tx)
                    .await
                    .ctx(OP)?;
            }
            let one = self.emit_on(tx, std::slice::from_ref(e)).await?;
            out[i] = one.into_iter().next();
        }
        out.into_iter()
            .map(|o| {
                o.ok_or_else(|| {
                    StoreError::backend(OP, "an event of the batch got no result").into()
                })
            })
            .collect()
    }

    /// [`herald::backend::EventStore::emit`]: tries again on a transient failure (as [`crate::retry::retry`])
    /// and on a lost connection ([`EMIT_TRIES`], with growing pauses), which
    /// is safe because the insert does nothing for ids that exist.
    pub(crate) async fn emit_retrying(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        let mut transient = 1;
        let mut lost = 1;
        loop {
            match self.emit_once(events).await {
                Ok(out) if lost > 1 => return Ok(after_retry(events, out)),
                Ok(out) => return Ok(out),
                Err(e) if e.transient() && transient < 4 => {
                    tracing::debug!(error = %escaped(&e), tries = transient, "herald-postgres: transient failure, trying again");
                    transient += 1;
                    tokio::time::sleep(Duration::from_millis(rand_millis(5 * transient as u64)))
                        .await;
                }
                Err(e) if e.connection_lost() && lost < EMIT_TRIES => {
                    let pause = emit_pause(lost, rand_millis(1000) as f64 / 1000.0);
                    tracing::warn!(error = %escaped(&e), tries = lost, ?pause, events = events.len(), "herald-postgres: emit lost its connection, trying again");
                    lost += 1;
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn emit_pauses_double_from_100_ms_to_1600_ms_within_a_quarter() {
        let mids: Vec<u128> = (1..EMIT_TRIES)
            .map(|t| emit_pause(t, 0.5).as_millis())
            .collect();
        assert_eq!(mids, [100, 200, 400, 800, 1600]);
        assert_eq!(emit_pause(1, 0.0), Duration::from_millis(75));
        assert_eq!(emit_pause(5, 1.0), Duration::from_millis(2000));
    }

    #[test]
    fn after_a_retry_an_event_found_under_its_own_id_counts_as_created() {
        let e = |key: Option<&str>| NewEvent {
            singleton: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: "t".into(),
            handler: "h".into(),
            payload: "1".into(),
            run_at: RunAt::NOW,
            max_attempts: 1,
            idempotency_key: key.map(str::to_string),
            topic: None,
        };
        let events = [e(None), e(Some("k")), e(None)];
        let other = EventId::new();
        let out = after_retry(
            &events,
            vec![
                Emitted::Existing(events[0].id),
                Emitted::Existing(other),
                Emitted::Created(events[2].id),
            ],
        );
        assert_eq!(
            out,
            [
                Emitted::Created(events[0].id),
                Emitted::Existing(other),
                Emitted::Created(events[2].id)
            ]
        );
    }
}
