//! herald's embedded store: one SQLite file in WAL mode.
//!
//! [`SqliteStore`] implements [`herald::Store`]. One dedicated OS thread owns
//! the connection; every call is sent to it as a job, and the thread
//! group-commits whatever is queued (up to 256 jobs) in one
//! `BEGIN IMMEDIATE … COMMIT`; a failing job rolls back only itself (the
//! group is then run again with a savepoint per job). The thread's
//! clock, read once per transaction, is "the database's clock" that judges
//! leases and `run_at`.
//!
//! Several processes may open the same file: writers wait for each other up
//! to a 5 s busy timeout, then fail with [`StoreError::Backend`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), herald::StoreError> {
//! use herald::backend::Operator;
//! let store = herald_sqlite::SqliteStore::open("herald.db")?;
//! let counts = store.counts(&herald::CountsQuery::all()).await?;
//! # Ok(()) }
//! ```

// The backend role traits are in `store`, each carried to the writer thread and
// delegated to the module of its role.
mod admin;
mod claim;
mod emit;
mod leaders;
mod limits;
mod reads;
mod rows;
mod rules;
mod schedules;
mod schema;
mod settle;
mod store;
mod sweep;
mod topics;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use herald::backend::StoreResult;
use herald::{Millis, StoreError};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::writer::{Call, Job};

pub use crate::schema::SCHEMA_VERSION;

/// herald's store on an SQLite file. Cheap to clone: clones share the
/// connection's thread, which ends when the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Box<dyn Job>>,
    path: Arc<PathBuf>,
    /// How long an idempotency key names its event at least
    /// ([`SqliteStore::with_idempotency_window`]).
    idempotency_window: Duration,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the database at `path`, creating the file if it is missing and
    /// applying pending migrations.
    ///
    /// Blocks while it opens and migrates (milliseconds; up to the 5 s busy
    /// timeout if another process holds the write lock).
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] if the file can't be opened or created (missing
    /// directory, permissions), [`StoreError::NotHerald`] if it is not an
    /// SQLite file or is another application's database,
    /// [`StoreError::TooNew`] if a newer herald migrated it.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = schema::open(&path)?;
        let (jobs, queue) = mpsc::channel::<Box<dyn Job>>();
        std::thread::Builder::new()
            .name("herald-sqlite".into())
            .spawn(move || writer::run(conn, queue))
            .map_err(|e| StoreError::Open {
                location: path.display().to_string(),
                reason: format!("cannot start the writer thread: {e}"),
            })?;
        tracing::debug!(path = %path.display(), "herald-sqlite: store opened");
        Ok(SqliteStore {
            jobs,
            path: Arc::new(path),
            idempotency_window: herald::DEFAULT_IDEMPOTENCY_WINDOW,
        })
    }

    /// Sets how long an idempotency key keeps naming its event, at least,
    /// after the emit that stored it and after the event finished (default
    /// [`herald::DEFAULT_IDEMPOTENCY_WINDOW`], 24 h): an emit with the key
    /// within it returns that event, even if it has finished.
    /// [`herald::backend::Reconciliation::upkeep`] (the elected reconciler's pass) purges the
    /// keys past it ([`herald::backend::Reconciliation::purge_keys`]).
    pub fn with_idempotency_window(mut self, window: Duration) -> SqliteStore {
        self.idempotency_window = window;
        self
    }

    /// The idempotency window ([`SqliteStore::with_idempotency_window`]).
    pub fn idempotency_window(&self) -> Duration {
        self.idempotency_window
    }

    /// The database file's path, as given to [`SqliteStore::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the writer thread, inside a group-committed
    /// transaction, and waits for the commit.
    ///
    /// `work` may run twice (see the writer module): it must act on the
    /// database only. If the returned future is dropped, the work still runs
    /// and commits.
    async fn call<T, F>(&self, op: &'static str, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection, Millis) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Box::new(Call::new(op, work, reply)))
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
mod plan_tests;

#[cfg(test)]
mod group_tests;
