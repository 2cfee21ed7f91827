//! The writer thread: the one owner of the connection, with group commit.
//!
//! Async callers send a [`Job`] (a closure plus a oneshot for the reply). The
//! thread blocks for one job, drains what else is already queued (up to
//! [`MAX_GROUP`]), and runs the group in one `BEGIN IMMEDIATE … COMMIT`.
//! Replies are sent only after `COMMIT` succeeded; if it fails, every job of
//! the group gets [`StoreError::Backend`].
//!
//! A failing job rolls back only itself. The thread first runs the group
//! optimistically, without savepoints (a savepoint costs two statements and
//! copies every page it first touches to the sub-journal: about 20% of the
//! cost of a small claim). If a job fails, it rolls the transaction back and
//! runs the whole group again, each job inside its own savepoint. Jobs are
//! therefore `Fn`, and must have no effect outside the database: running one
//! again after a rollback, with the same clock, gives the same result as
//! running it once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use herald::backend::{StoreError, StoreResult};
use herald::escape::escaped;
use herald::Millis;
use rusqlite::Connection;
use tokio::sync::oneshot;

/// The most jobs one transaction carries.
pub(crate) const MAX_GROUP: usize = 256;

/// One unit of work for the writer thread.
pub(crate) trait Job: Send {
    /// Runs (or, after a rollback, runs again) the work against the
    /// connection inside the group's transaction, keeping the result.
    /// Returns whether it succeeded.
    fn run(&mut self, conn: &Connection, now: Millis) -> bool;

    /// Sends the reply. `failure` is set when the group's transaction did
    /// not commit: then a successful result is replaced by that error.
    fn reply(self: Box<Self>, failure: Option<&Failure>);
}

/// Why a group's transaction did not commit: the step that failed, and
/// SQLite's error when there is one (shared by every job of the group).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    step: &'static str,
    error: Option<Arc<rusqlite::Error>>,
}

impl Failure {
    fn new(step: &'static str, error: rusqlite::Error) -> Self {
        Failure {
            step,
            error: Some(Arc::new(error)),
        }
    }

    /// The error one job of the group gets.
    fn for_job(&self, op: &str) -> StoreError {
        match &self.error {
            Some(e) => StoreError::backend(format!("{op}: {}", self.step), Arc::clone(e)),
            None => StoreError::backend(op, self.step),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error {
            Some(e) => write!(f, "{}: {e}", self.step),
            None => f.write_str(self.step),
        }
    }
}

/// A typed job: the closure, its result once run, and where to reply.
pub(crate) struct Call<T, F> {
    op: &'static str,
    work: F,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Call<T, F> {
    pub(crate) fn new(op: &'static str, work: F, reply: oneshot::Sender<StoreResult<T>>) -> Self {
        Call {
            op,
            work,
            result: None,
            reply,
        }
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: Fn(&Connection, Millis) -> StoreResult<T> + Send,
{
    fn run(&mut self, conn: &Connection, now: Millis) -> bool {
        let op = self.op;
        let work = &self.work;
        let result = catch_unwind(AssertUnwindSafe(|| work(conn, now))).unwrap_or_else(|_| {
            tracing::error!(op, "herald-sqlite: a store operation panicked");
            Err(StoreError::backend(op, "the operation panicked"))
        });
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn reply(self: Box<Self>, failure: Option<&Failure>) {
        let op = self.op;
        let result = match (self.result, failure) {
            // A job that failed on its own reports its own error.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(_)), Some(why)) | (None, Some(why)) => Err(why.for_job(op)),
            (Some(Ok(v)), None) => Ok(v),
            (None, None) => Err(StoreError::backend(op, "the job did not run")),
        };
        // The caller may have gone away (its future was dropped); the write
        // stands either way.
        let _ = self.reply.send(result);
    }
}

/// The writer thread's loop: runs until every sender is dropped.
pub(crate) fn run(conn: Connection, jobs: Receiver<Box<dyn Job>>) {
    let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_GROUP);
    while let Ok(first) = jobs.recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        run_group(&conn, &mut group);
    }
    tracing::debug!("herald-sqlite: every store handle was dropped; writer thread ends");
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %escaped(&e), "herald-sqlite: closing the database failed");
    }
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn begin(conn: &Connection) -> Option<Failure> {
    exec(conn, "BEGIN IMMEDIATE")
        .err()
        .map(|e| Failure::new("could not begin a write transaction", e))
}

/// Runs one group in one transaction and replies to every job.
fn run_group(conn: &Connection, group: &mut Vec<Box<dyn Job>>) {
    if let Some(why) = begin(conn) {
        finish(group, Some(why));
        return;
    }
    // The database's clock for this transaction (and its retry), read once
    // the write lock is ours: waiting for another process's lock must not
    // age it.
    let now = Millis::now();
    // Optimistic: no savepoints.
    let all_ok = group.iter_mut().all(|job| job.run(conn, now));
    if all_ok {
        let failure = commit(conn);
        finish(group, failure);
        return;
    }
    rollback(conn);
    if group.len() == 1 {
        // Nothing else to keep: the job reports its own error.
        finish(group, None);
        return;
    }
    tracing::debug!(
        jobs = group.len(),
        "herald-sqlite: a job failed; running the group again with savepoints"
    );
    if let Some(why) = begin(conn) {
        finish(group, Some(why));
        return;
    }
    let mut aborted: Option<Failure> = None;
    for job in group.iter_mut() {
        if let Err(e) = exec(conn, "SAVEPOINT job") {
            aborted = Some(Failure::new("could not open a savepoint", e));
            break;
        }
        let ok = job.run(conn, now);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back on its own (a full
            // disk, an I/O error): nothing of this group was written.
            aborted = Some(Failure {
                step: "the transaction was rolled back by SQLite",
                error: None,
            });
            break;
        }
        let end = if ok {
            exec(conn, "RELEASE job")
        } else {
            exec(conn, "ROLLBACK TO job").and_then(|()| exec(conn, "RELEASE job"))
        };
        if let Err(e) = end {
            aborted = Some(Failure::new("could not end a savepoint", e));
            break;
        }
    }
    let failure = match aborted {
        Some(why) => {
            rollback(conn);
            Some(why)
        }
        None => commit(conn),
    };
    finish(group, failure);
}

/// Commits; on failure rolls back and says why.
fn commit(conn: &Connection) -> Option<Failure> {
    match exec(conn, "COMMIT") {
        Ok(()) => None,
        Err(e) => {
            rollback(conn);
            Some(Failure::new("commit failed", e))
        }
    }
}

/// Rolls back the open transaction, if SQLite has not already.
fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        if let Err(e) = exec(conn, "ROLLBACK") {
            tracing::error!(error = %escaped(&e), "herald-sqlite: ROLLBACK failed");
        }
    }
}

/// Replies to every job of the group.
fn finish(group: &mut Vec<Box<dyn Job>>, failure: Option<Failure>) {
    if let Some(why) = &failure {
        tracing::warn!(jobs = group.len(), reason = %escaped(why), "herald-sqlite: group not committed");
    }
    for job in group.drain(..) {
        job.reply(failure.as_ref());
    }
}
