//! The pool settings herald opens its connections with, and why.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::Connection;

/// A pooled connection idle at least this long is pinged (one round trip)
/// before it is handed out, so a connection that died while idle (a server
/// restart, a proxy's idle timeout) is replaced instead of failing a call.
/// One used more recently is handed out as it is.
pub const IDLE_PING: Duration = Duration::from_secs(1);

/// How long a call waits for a connection from a full pool before it fails
/// with [`herald::StoreError::Unavailable`].
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pool options [`crate::PgStore::connect`] and `herald serve` use:
/// sqlx's defaults (10 connections) except an acquire timeout of
/// [`ACQUIRE_TIMEOUT`] and a ping only for connections idle
/// [`IDLE_PING`] or longer.
///
/// sqlx pings every connection at every acquire by default: a round trip
/// before each of herald's statements, which are one round trip each. Under
/// load a connection comes back to the pool and goes out again within
/// milliseconds, and the ping was about a quarter of a single emit's or claim's time
/// (`docs/postgres.md`, "The pool"). Start from these options to set the
/// size: `pool_options().max_connections(20)`.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_PING {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}
