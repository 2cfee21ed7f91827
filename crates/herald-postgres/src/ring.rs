//! The ring of leaves (ADR 0009, `sql/ring.sql`): what a turn does, decided
//! from the ring's rows and the database's clock; `PgStore::upkeep` carries
//! it out (`store.rs`).
//!
//! New events due within seconds go into the filling leaf (the others into
//! `events_cold`). A turn tries to retire every leaf that has drained for
//! `drain`: one that holds at most `move_at_most` events (its stragglers)
//! has them moved to `events_cold` and is TRUNCATEd; one that holds more (a
//! backlog not yet run) waits, unless it has drained for `drain_at_most`,
//! then `move_at_most` of its events move per turn. Then the turn makes the
//! filling leaf draining and the next in ring order filling, if that one is
//! empty (or retired in the same turn) and the filling leaf has filled for
//! `turn_every`. A ring that cannot turn (a backlog) leaves the filling
//! leaf to grow, with vacuum to clean it, as a table without a ring.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::rows::{Ctx, DbResult};
use crate::PgStore;

/// How fast the ring turns. Dead rows and storage are bounded by the events
/// emitted in about `turn_every` + `drain` + one reconciler pass, since a
/// leaf's dead rows go with its TRUNCATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingTimes {
    /// How long a leaf takes new events before the next one does.
    pub turn_every: Duration,
    /// How long a leaf drains (its events run and finish) before it is
    /// retired; what is still in it then is copied to `events_cold`.
    pub drain: Duration,
    /// The most events a retire moves under the leaf's exclusive lock (every
    /// statement on events waits meanwhile: about 30 µs per event).
    pub move_at_most: u32,
    /// How long a leaf that still holds more than `move_at_most` events may
    /// drain before its events are moved anyway, `move_at_most` per turn.
    pub drain_at_most: Duration,
}

impl Default for RingTimes {
    /// A turn on every pass of the reconciler (every 3 s by default), a
    /// leaf retired on the pass after it stopped filling: each leaf holds
    /// about two passes of events.
    fn default() -> Self {
        RingTimes {
            turn_every: Duration::from_secs(2),
            drain: Duration::from_secs(1),
            move_at_most: 2_000,
            drain_at_most: Duration::from_secs(60),
        }
    }
}

/// A ring leaf's phase (the `ring` table's `phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Takes new events.
    Filling,
    /// Takes none; its events run and finish.
    Draining,
    /// TRUNCATEd; the next to fill.
    Empty,
}

impl Phase {
    pub(crate) fn parse(s: &str) -> Option<Phase> {
        match s {
            "filling" => Some(Phase::Filling),
            "draining" => Some(Phase::Draining),
            "empty" => Some(Phase::Empty),
            _ => None,
        }
    }
}

/// One row of `ring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leaf {
    pub(crate) leaf: i16,
    pub(crate) phase: Phase,
    /// Since when (ms, the database's clock).
    pub(crate) since: i64,
}

/// What a turn does, in order: the retires, then the flip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Turn {
    /// Draining leaves to retire, each with whether it has drained for
    /// `drain_at_most` (move its events even if it holds many).
    pub(crate) retire: Vec<(i16, bool)>,
    /// The filling leaf and the one to fill next.
    pub(crate) flip: Option<(i16, i16)>,
    /// The filling leaf has filled for this long (ms) and cannot hand over:
    /// the next leaf is neither empty nor retired in this turn. Set once it
    /// has filled for `drain_at_most`, for a warning.
    pub(crate) stalled: Option<(i16, i64)>,
}

/// The turn for `leaves` (sorted by leaf) at `now`.
pub(crate) fn turn(leaves: &[Leaf], now: i64, times: RingTimes) -> Turn {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let retire: Vec<(i16, bool)> = leaves
        .iter()
        .filter(|l| l.phase == Phase::Draining && now.saturating_sub(l.since) >= ms(times.drain))
        .map(|l| {
            (
                l.leaf,
                now.saturating_sub(l.since) >= ms(times.drain_at_most),
            )
        })
        .collect();
    let mut out = Turn {
        retire,
        ..Turn::default()
    };
    let Some(pos) = leaves.iter().position(|l| l.phase == Phase::Filling) else {
        return out;
    };
    let filling = leaves[pos];
    let filled_for = now.saturating_sub(filling.since);
    if filled_for < ms(times.turn_every) || leaves.len() < 2 {
        return out;
    }
    let next = leaves[(pos + 1) % leaves.len()];
    if next.phase == Phase::Empty || out.retire.iter().any(|&(l, _)| l == next.leaf) {
        out.flip = Some((filling.leaf, next.leaf));
    } else if filled_for >= ms(times.drain_at_most) {
        out.stalled = Some((filling.leaf, filled_for));
    }
    out
}

impl PgStore {
    /// One turn of the ring ([`herald::backend::Reconciliation::upkeep`]): reads the ring,
    /// then retires and flips as [`turn`] says. A leaf or the ring held by
    /// another transaction (lock_timeout, 55P03) waits for a later pass.
    pub(crate) async fn turn_ring(&self) -> DbResult<()> {
        const OP: &str = "turn the ring";
        let rows: Vec<(i16, String, i64, i64)> = sqlx::query_as(&self.sql.ring)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let now = rows.first().map_or(0, |r| r.3);
        let leaves: Vec<Leaf> = rows
            .iter()
            .filter_map(|(leaf, phase, since, _)| {
                Phase::parse(phase).map(|phase| Leaf {
                    leaf: *leaf,
                    phase,
                    since: *since,
                })
            })
            .collect();
        let plan = turn(&leaves, now, self.ring_times);
        if let Some((leaf, for_ms)) = plan.stalled {
            // Once a minute at most: a backlog can keep the ring still for long.
            let minute = now / 60_000;
            if STALL_WARNED.swap(minute, Ordering::Relaxed) != minute {
                tracing::warn!(
                    leaf,
                    seconds = for_ms / 1000,
                    "herald-postgres: the ring has not turned: the next leaf has not drained \
                     (a backlog not yet run, or a transaction that holds it; see pg_locks), \
                     so new events stay in events_{leaf} and wait for vacuum",
                );
            }
        }
        for (leaf, force) in plan.retire {
            match sqlx::query_as::<_, (i64, i64, bool)>(&self.sql.ring_retire)
                .bind(leaf)
                .bind(i64::from(self.ring_times.move_at_most))
                .bind(force)
                .fetch_optional(&self.pool)
                .await
            {
                Ok(Some((moved, dropped, emptied))) => {
                    tracing::debug!(leaf, moved, emptied, "herald-postgres: leaf retired");
                    if dropped > 0 {
                        tracing::warn!(
                            leaf,
                            dropped,
                            "herald-postgres: events stored twice under one id (an emit inside \
                             a REPEATABLE READ or SERIALIZABLE transaction that began before a \
                             turn of the ring); kept the copy in events_cold",
                        );
                    }
                }
                Ok(None) => tracing::debug!(leaf, "herald-postgres: leaf still draining"),
                Err(e) if lock_timeout(&e) => {
                    tracing::debug!(leaf, "herald-postgres: leaf busy, retired on a later pass")
                }
                Err(e) => return Err(e).ctx(OP),
            }
        }
        if let Some((from, to)) = plan.flip {
            match sqlx::query_scalar::<_, bool>(&self.sql.ring_flip)
                .bind(from)
                .bind(to)
                .fetch_one(&self.pool)
                .await
            {
                Ok(flipped) => tracing::debug!(from, to, flipped, "herald-postgres: ring turned"),
                Err(e) if lock_timeout(&e) => {
                    tracing::debug!(
                        from,
                        to,
                        "herald-postgres: emits hold the ring, turned on a later pass"
                    )
                }
                Err(e) => return Err(e).ctx(OP),
            }
        }
        Ok(())
    }
}

/// The minute (of the database's clock) of the last warning that the ring
/// stands still.
static STALL_WARNED: AtomicI64 = AtomicI64::new(0);

/// `lock_not_available`: lock_timeout ran out.
fn lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("55P03"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(phases: [(Phase, i64); 3]) -> Vec<Leaf> {
        phases
            .iter()
            .zip(1..)
            .map(|(&(phase, since), leaf)| Leaf { leaf, phase, since })
            .collect()
    }

    const TIMES: RingTimes = RingTimes {
        turn_every: Duration::from_secs(2),
        drain: Duration::from_secs(1),
        move_at_most: 2_000,
        drain_at_most: Duration::from_secs(60),
    };

    use Phase::{Draining as D, Empty as E, Filling as F};

    #[test]
    fn a_new_ring_turns_once_the_first_leaf_has_filled() {
        let leaves = ring([(F, 0), (E, 0), (E, 0)]);
        assert_eq!(turn(&leaves, 1_999, TIMES), Turn::default());
        assert_eq!(
            turn(&leaves, 2_000, TIMES),
            Turn {
                flip: Some((1, 2)),
                ..Turn::default()
            }
        );
    }

    #[test]
    fn a_drained_leaf_is_retired_and_the_ring_turns_past_it() {
        // 3 filling, 1 draining since 3 s, 2 empty.
        let leaves = ring([(D, 0), (E, 0), (F, 0)]);
        let t = turn(&leaves, 3_000, TIMES);
        assert_eq!(t.retire, vec![(1, false)]);
        assert_eq!(t.flip, Some((3, 1)), "the next after 3 is 1, retired now");
        // Drained for a minute: its events move even if it holds many.
        let t = turn(&leaves, 60_000, TIMES);
        assert_eq!(t.retire, vec![(1, true)]);
    }

    #[test]
    fn a_leaf_still_draining_is_kept() {
        let leaves = ring([(F, 0), (E, 0), (D, 2_500)]);
        let t = turn(&leaves, 3_000, TIMES);
        assert!(t.retire.is_empty());
        assert_eq!(t.flip, Some((1, 2)));
    }

    #[test]
    fn the_ring_waits_for_a_next_leaf_that_is_not_empty() {
        // 1 filling, 2 draining but not long enough: no flip into it.
        let leaves = ring([(F, 0), (D, 2_900), (E, 0)]);
        let t = turn(&leaves, 3_000, TIMES);
        assert_eq!(t, Turn::default());
        // Long overdue: say so.
        let t = turn(&ring([(F, 0), (D, 59_500), (E, 0)]), 60_000, TIMES);
        assert_eq!(t.stalled, Some((1, 60_000)));
        assert_eq!(t.flip, None);
    }

    #[test]
    fn no_filling_leaf_means_no_flip() {
        let leaves = ring([(E, 0), (E, 0), (D, 0)]);
        let t = turn(&leaves, 10_000, TIMES);
        assert_eq!(t.retire, vec![(3, false)]);
        assert_eq!(t.flip, None);
    }

    #[test]
    fn phases_parse_as_the_table_spells_them() {
        assert_eq!(Phase::parse("filling"), Some(F));
        assert_eq!(Phase::parse("draining"), Some(D));
        assert_eq!(Phase::parse("empty"), Some(E));
        assert_eq!(Phase::parse("full"), None);
    }
}
