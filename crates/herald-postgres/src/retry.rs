//! Trying a call again when PostgreSQL cancelled it transiently (a
//! deadlock victim, a serialization failure).

use std::time::Duration;

use herald::backend::StoreResult;
use herald::escape::escaped;
use herald::StoreError;

use crate::rows::DbResult;

/// Runs `attempt` again when it failed transiently (a deadlock victim or a
/// serialization failure: the statement or transaction wrote nothing), up
/// to four times in all. Concurrent batches that write overlapping rows
/// (an unpause re-notifying events that workers are claiming) may lock
/// them in different orders; PostgreSQL then cancels one statement.
pub(crate) async fn retry<T, F, Fut>(op: &'static str, mut attempt: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = DbResult<T>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e) if e.transient() && tries < 4 => {
                tracing::debug!(op, error = %escaped(&e), tries, "herald-postgres: transient failure, trying again");
                tries += 1;
                let pause = Duration::from_millis(rand_millis(5 * tries));
                tokio::time::sleep(pause).await;
            }
            other => return other.map_err(StoreError::from),
        }
    }
}

/// A small pseudo-random pause in `[0, max)` ms (no need for a real RNG).
pub(crate) fn rand_millis(max: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as u64;
    nanos % max.max(1)
}
