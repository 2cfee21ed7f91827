//! The reconciler's sweep, decided once for every store: which source to
//! read next, which candidates to notify and which to park, when a call is
//! full, when to un-park the events of a rule that is gone.
//!
//! A store implements [`Reconciliation::sweep`](crate::backend::Reconciliation::sweep) by opening one
//! short transaction, making a [`Sweep`], and carrying out the [`Step`]s it
//! returns with its own primitives (read a page of a source after a cursor,
//! stamp ids notified, park ids, un-park up to n events of a handler, list
//! the orphan parked pairs, forget a pair) until the sweep says
//! [`Step::Done`]. The sweep itself does no I/O.
//!
//! A call walks two sources in index order, sharing one page of at most
//! `limit` notifications:
//!
//! 1. [`Source::Expired`]: dead workers' events, pending and due, whose
//!    lease expired after their last notification. They need no quiet period.
//! 2. [`Source::Quiet`]: pending, due events without a live lease, not
//!    notified since the pass's cutoff (`now - quiet` at the pass's first
//!    call, fixed for the pass, so that a pass ends even when its quiet
//!    period is shorter than the pass takes).
//!
//! Candidates a rule holds are parked (`notified_at` = [`PARKED`]), so the
//! sources skip them until unpause or unblock re-notifies them; at most
//! `limit ×` [`PARK_FACTOR`] per call, so that a call stays short however
//! many events a rule holds. Before the sources, a call un-parks the events
//! of pairs in the `parked` table that no rule holds any more (a crash
//! between removing a rule and re-notifying its events would otherwise leave
//! them parked for good).

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use crate::backend::{Scheduled, SweepPage, SweepPass};
use crate::model::{EventId, Millis};

/// `notified_at` of a parked event: a rule holds it; removing the rule
/// re-notifies it. The sweep's sources skip it.
pub const PARKED: Millis = Millis(i64::MAX);

/// Events parked by one sweep call at most, as a multiple of its `limit`,
/// so that one call stays a short transaction even when a rule holds
/// millions of due events; the next call goes on parking.
pub const PARK_FACTOR: usize = 16;

/// The fewest candidates one read asks for: a call that lacks a few
/// notifications still reads past a run of parked ones in one go.
const MIN_READ: usize = 64;

/// The sweep's two sources, in the order a call walks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Pending, due events whose lease expired after their last
    /// notification (the worker presumably died), without a quiet period.
    Expired,
    /// Pending, due events without a live lease, not notified since the
    /// pass's cutoff.
    Quiet,
}

/// One event a source read returned, in the source's index order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<C> {
    /// The event.
    pub id: EventId,
    /// Its tenant.
    pub tenant: String,
    /// Its handler.
    pub handler: String,
    /// Whether a rule matches its `(tenant, handler)`.
    pub ruled: bool,
    /// The store's keyset cursor just after this candidate.
    pub cursor: C,
}

/// The writes of one read's candidates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writes {
    /// Stamp these notified at `at`.
    pub notified: Vec<EventId>,
    /// Park these: stamp them [`PARKED`].
    pub parked: Vec<EventId>,
    /// The pairs of the parked ones, each once, to note in the `parked`
    /// table.
    pub parked_pairs: Vec<(String, String)>,
    /// The call's clock.
    pub at: Millis,
}

impl Writes {
    fn is_empty(&self) -> bool {
        self.notified.is_empty() && self.parked.is_empty()
    }
}

/// What a sweep call asks its store to do next, within the call's
/// transaction. Each step names the [`Sweep`] method that takes its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<C> {
    /// List the pairs of the `parked` table that no rule matches; answer
    /// with [`Sweep::orphans`].
    ListOrphans,
    /// Un-park up to `limit` parked events of the pair (`notified_at =
    /// run_at`, so that the quiet source returns them); answer with
    /// [`Sweep::unparked`] and how many.
    Unpark {
        /// Tenant.
        tenant: String,
        /// Handler.
        handler: String,
        /// At most this many events.
        limit: usize,
    },
    /// Remove the pair from the `parked` table (none of its events is
    /// parked any more); then [`Sweep::resume`].
    ForgetParked {
        /// Tenant.
        tenant: String,
        /// Handler.
        handler: String,
    },
    /// Read up to `limit` candidates of `source` after `after` (`None`:
    /// from the source's start), in index order; answer with
    /// [`Sweep::read`]. Quiet candidates were notified before `cutoff`;
    /// both sources judge due and expired by `now`.
    Read {
        /// Which source.
        source: Source,
        /// The cursor of the last candidate taken.
        after: Option<C>,
        /// How many to read at most.
        limit: usize,
        /// The call's clock.
        now: Millis,
        /// The pass's cutoff.
        cutoff: Millis,
    },
    /// Carry out the writes; then [`Sweep::resume`].
    Write(Writes),
    /// The call is over: commit and return the page.
    Done(SweepPage),
}

/// Where the call is.
#[derive(Debug)]
enum Phase<C> {
    /// Un-parking orphans: the pairs left, and the one being un-parked.
    Unparking {
        left: VecDeque<(String, String)>,
        current: Option<(String, String)>,
    },
    /// Walking a source: the cursor, how many the last read asked for, and
    /// whether it returned fewer.
    Walking {
        source: Source,
        after: Option<C>,
        asked: usize,
        exhausted: bool,
    },
    Over,
}

/// One sweep call's decisions: a state machine fed with what the store's
/// primitives returned. `C` is the store's keyset cursor.
#[derive(Debug)]
pub struct Sweep<C> {
    now: Millis,
    cutoff: Millis,
    /// See [`SweepPass::expired_done`].
    expired_done: bool,
    limit: usize,
    park_cap: usize,
    due: Vec<Scheduled>,
    parked: usize,
    phase: Phase<C>,
}

impl<C: Clone> Sweep<C> {
    /// A call at `now` (the store's clock for the whole call) of the pass
    /// `pass` (`None` starts a pass whose cutoff is `now - quiet`), for at
    /// most `limit` notifications.
    pub fn new(now: Millis, quiet: Duration, pass: Option<SweepPass>, limit: usize) -> Self {
        Sweep {
            now,
            cutoff: pass.map_or_else(|| now.minus(quiet), |p| p.cutoff),
            expired_done: pass.is_some_and(|p| p.expired_done),
            limit,
            park_cap: limit.saturating_mul(PARK_FACTOR),
            due: Vec::new(),
            parked: 0,
            phase: Phase::Over,
        }
    }

    /// The first step. A call for no notifications does nothing.
    pub fn start(&mut self) -> Step<C> {
        if self.limit == 0 {
            return self.finish();
        }
        self.phase = Phase::Unparking {
            left: VecDeque::new(),
            current: None,
        };
        Step::ListOrphans
    }

    /// The answer to [`Step::ListOrphans`].
    pub fn orphans(&mut self, pairs: Vec<(String, String)>) -> Step<C> {
        self.phase = Phase::Unparking {
            left: pairs.into(),
            current: None,
        };
        self.next_orphan()
    }

    /// The answer to [`Step::Unpark`]: how many events it un-parked. Fewer
    /// than asked means none is left, and the pair is forgotten.
    pub fn unparked(&mut self, n: u64) -> Step<C> {
        let cap = self.park_cap;
        let Phase::Unparking { current, .. } = &mut self.phase else {
            return self.resume();
        };
        let Some((tenant, handler)) = current.take() else {
            return self.resume();
        };
        if n > 0 {
            tracing::info!(
                tenant,
                handler,
                events = n,
                "sweep: unparked events whose rule is gone"
            );
        }
        if n < cap as u64 {
            return Step::ForgetParked { tenant, handler };
        }
        self.next_orphan()
    }

    /// The answer to [`Step::Read`]: the candidates, in index order. Takes
    /// them in order, parking the ruled ones and notifying the others,
    /// until the page is full or the park cap reached.
    pub fn read(&mut self, page: Vec<Candidate<C>>) -> Step<C> {
        let Phase::Walking {
            after,
            asked,
            exhausted,
            ..
        } = &mut self.phase
        else {
            return self.resume();
        };
        *exhausted = page.len() < *asked;
        let mut writes = Writes {
            notified: Vec::new(),
            parked: Vec::new(),
            parked_pairs: Vec::new(),
            at: self.now,
        };
        let mut pairs = BTreeSet::new();
        for c in page {
            if c.ruled {
                *after = Some(c.cursor);
                writes.parked.push(c.id);
                pairs.insert((c.tenant, c.handler));
                self.parked += 1;
                if self.parked >= self.park_cap {
                    break;
                }
            } else if self.due.len() < self.limit {
                *after = Some(c.cursor);
                writes.notified.push(c.id);
                self.due.push(Scheduled::due(c.tenant, c.id));
            } else {
                break;
            }
        }
        writes.parked_pairs = pairs.into_iter().collect();
        if writes.is_empty() {
            return self.walk();
        }
        Step::Write(writes)
    }

    /// The next step after one that has no answer ([`Step::Write`],
    /// [`Step::ForgetParked`]).
    pub fn resume(&mut self) -> Step<C> {
        match self.phase {
            Phase::Unparking { .. } => self.next_orphan(),
            Phase::Walking { .. } => self.walk(),
            Phase::Over => self.finish(),
        }
    }

    fn next_orphan(&mut self) -> Step<C> {
        let limit = self.park_cap;
        if let Phase::Unparking { left, current } = &mut self.phase {
            if let Some((tenant, handler)) = left.pop_front() {
                *current = Some((tenant.clone(), handler.clone()));
                return Step::Unpark {
                    tenant,
                    handler,
                    limit,
                };
            }
        }
        let source = if self.expired_done {
            Source::Quiet
        } else {
            Source::Expired
        };
        self.phase = Phase::Walking {
            source,
            after: None,
            asked: 0,
            exhausted: false,
        };
        self.walk()
    }

    /// Reads on in the current source while the call has room, then moves
    /// to the next source, then ends.
    fn walk(&mut self) -> Step<C> {
        let room = self.due.len() < self.limit && self.parked < self.park_cap;
        let want = self.limit.saturating_sub(self.due.len()).max(MIN_READ);
        let Phase::Walking {
            source,
            after,
            asked,
            exhausted,
        } = &mut self.phase
        else {
            return self.finish();
        };
        if room && !*exhausted {
            *asked = want;
            return Step::Read {
                source: *source,
                after: after.clone(),
                limit: want,
                now: self.now,
                cutoff: self.cutoff,
            };
        }
        match source {
            Source::Expired => {
                // Read to its end with room left: every candidate found
                // was taken, so later pages of the pass need not read it.
                self.expired_done = room && *exhausted;
                self.phase = Phase::Walking {
                    source: Source::Quiet,
                    after: None,
                    asked: 0,
                    exhausted: false,
                };
                self.walk()
            }
            Source::Quiet => self.finish(),
        }
    }

    fn finish(&mut self) -> Step<C> {
        self.phase = Phase::Over;
        if self.parked > 0 {
            tracing::debug!(parked = self.parked, "sweep: parked events held by rules");
        }
        Step::Done(SweepPage {
            complete: self.due.len() < self.limit && self.parked < self.park_cap,
            due: std::mem::take(&mut self.due),
            pass: SweepPass {
                cutoff: self.cutoff,
                expired_done: self.expired_done,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in memory for the machine: candidates per source, in index
    /// order, with their position as the cursor.
    struct Fake {
        expired: Vec<(EventId, bool)>,
        quiet: Vec<(EventId, bool)>,
        orphans: Vec<(String, String)>,
        /// Parked events per orphan pair.
        orphan_events: u64,
        log: Vec<String>,
    }

    impl Fake {
        fn new(expired: &[bool], quiet: &[bool]) -> Self {
            let ids = |flags: &[bool]| {
                flags
                    .iter()
                    .map(|&r| (EventId::new(), r))
                    .collect::<Vec<_>>()
            };
            Fake {
                expired: ids(expired),
                quiet: ids(quiet),
                orphans: Vec::new(),
                orphan_events: 0,
                log: Vec::new(),
            }
        }

        fn run(&mut self, limit: usize) -> SweepPage {
            self.run_pass(limit, None)
        }

        /// One call of the pass `pass`.
        fn run_pass(&mut self, limit: usize, pass: Option<SweepPass>) -> SweepPage {
            let mut sweep = Sweep::<usize>::new(Millis(1_000), Duration::ZERO, pass, limit);
            let mut step = sweep.start();
            loop {
                step = match step {
                    Step::ListOrphans => sweep.orphans(self.orphans.clone()),
                    Step::Unpark { limit, handler, .. } => {
                        let n = self.orphan_events.min(limit as u64);
                        self.orphan_events -= n;
                        self.log.push(format!("unpark {handler} {n}"));
                        sweep.unparked(n)
                    }
                    Step::ForgetParked { handler, .. } => {
                        self.log.push(format!("forget {handler}"));
                        sweep.resume()
                    }
                    Step::Read {
                        source,
                        after,
                        limit,
                        ..
                    } => {
                        let rows = match source {
                            Source::Expired => &self.expired,
                            Source::Quiet => &self.quiet,
                        };
                        let from = after.map_or(0, |a| a + 1);
                        let page = rows
                            .iter()
                            .enumerate()
                            .skip(from)
                            .take(limit)
                            .map(|(i, &(id, ruled))| Candidate {
                                id,
                                tenant: "t".into(),
                                handler: "h".into(),
                                ruled,
                                cursor: i,
                            })
                            .collect();
                        self.log.push(format!("read {source:?} {from} {limit}"));
                        sweep.read(page)
                    }
                    Step::Write(w) => {
                        self.log.push(format!(
                            "write {} {} {}",
                            w.notified.len(),
                            w.parked.len(),
                            w.parked_pairs.len()
                        ));
                        sweep.resume()
                    }
                    Step::Done(page) => return page,
                }
            }
        }
    }

    #[test]
    fn dead_workers_events_come_first_and_the_page_fills_from_the_quiet_source() {
        let mut f = Fake::new(&[false; 3], &[false; 5]);
        let page = f.run(6);
        let want: Vec<EventId> = f.expired.iter().chain(&f.quiet[..3]).map(|e| e.0).collect();
        let got: Vec<EventId> = page.due.iter().map(|s| s.event_id).collect();
        assert_eq!(got, want);
        assert!(!page.complete);
        assert_eq!(page.pass.cutoff, Millis(1_000));
        assert_eq!(
            f.log,
            [
                "read Expired 0 64",
                "write 3 0 0",
                "read Quiet 0 64",
                "write 3 0 0"
            ]
        );
    }

    #[test]
    fn a_call_with_room_left_is_complete() {
        let mut f = Fake::new(&[], &[false, true, false]);
        let page = f.run(5);
        assert_eq!(page.due.len(), 2);
        assert!(page.complete);
        assert_eq!(
            f.log,
            ["read Expired 0 64", "read Quiet 0 64", "write 2 1 1"]
        );
    }

    #[test]
    fn parking_stops_at_the_cap_and_the_call_is_not_complete() {
        // limit 1: at most 16 parked; the runnable one behind them waits.
        let mut ruled = vec![true; 40];
        ruled.push(false);
        let mut f = Fake::new(&[], &ruled);
        let page = f.run(1);
        assert!(page.due.is_empty());
        assert!(!page.complete);
        assert_eq!(
            f.log,
            ["read Expired 0 64", "read Quiet 0 64", "write 0 16 1"]
        );
    }

    #[test]
    fn a_full_read_is_followed_by_another_after_its_last_candidate() {
        // 100 parked in front of one runnable one: two reads of 64.
        let mut ruled = vec![true; 100];
        ruled.push(false);
        let mut f = Fake::new(&[], &ruled);
        let page = f.run(10);
        assert_eq!(page.due.len(), 1);
        assert!(page.complete);
        assert_eq!(
            f.log,
            [
                "read Expired 0 64",
                "read Quiet 0 64",
                "write 0 64 1",
                "read Quiet 64 64",
                "write 1 36 1"
            ]
        );
    }

    #[test]
    fn orphans_are_unparked_first_and_forgotten_once_none_is_left() {
        let mut f = Fake::new(&[], &[]);
        f.orphans = vec![("t".into(), "a".into()), ("t".into(), "b".into())];
        f.orphan_events = 20;
        let page = f.run(1);
        assert!(page.complete);
        assert_eq!(
            f.log,
            [
                "unpark a 16",
                "unpark b 4",
                "forget b",
                "read Expired 0 64",
                "read Quiet 0 64"
            ]
        );
    }

    #[test]
    fn later_pages_of_a_pass_skip_the_dead_workers_source_once_it_was_read_to_its_end() {
        let mut f = Fake::new(&[], &[false; 5]);
        let first = f.run(2);
        assert!(first.pass.expired_done);
        assert!(!first.complete);
        f.log.clear();
        let second = f.run_pass(2, Some(first.pass));
        assert_eq!(f.log, ["read Quiet 0 64", "write 2 0 0"]);
        assert!(second.pass.expired_done);
    }

    #[test]
    fn a_dead_workers_read_cut_short_by_the_page_is_read_again_on_the_next() {
        // Three expired, a page of two: the third is still to notify.
        let mut f = Fake::new(&[false; 3], &[]);
        let first = f.run(2);
        assert!(!first.pass.expired_done);
        f.log.clear();
        f.run_pass(2, Some(first.pass));
        assert_eq!(f.log[0], "read Expired 0 64");
    }

    #[test]
    fn a_call_for_nothing_does_nothing_and_keeps_the_pass() {
        let mut sweep = Sweep::<usize>::new(
            Millis(5_000),
            Duration::from_secs(1),
            Some(SweepPass {
                cutoff: Millis(42),
                expired_done: false,
            }),
            0,
        );
        match sweep.start() {
            Step::Done(page) => {
                assert!(page.due.is_empty());
                assert!(!page.complete);
                assert_eq!(page.pass.cutoff, Millis(42));
            }
            other => panic!("{other:?}"),
        }
        let mut first = Sweep::<usize>::new(Millis(5_000), Duration::from_secs(1), None, 0);
        assert!(matches!(first.start(), Step::Done(p) if p.pass.cutoff == Millis(4_000)));
    }
}
