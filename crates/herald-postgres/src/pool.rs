//! The pool settings herald opens its connections with, and why.

use std::time::Duration;

use herald::escape::escaped;
use herald::StoreError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};

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

/// The first pause between [`first_connection`]'s attempts; it doubles up
/// to [`FIRST_CONNECTION_MAX_PAUSE`].
const FIRST_CONNECTION_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause between [`first_connection`]'s attempts.
const FIRST_CONNECTION_MAX_PAUSE: Duration = Duration::from_secs(1);

/// Connects once to the server within `wait`, trying again while it is
/// unreachable (refused, reset, starting up), and closes the connection.
///
/// The pool's own wait ends in "pool timed out" without the cause; this
/// one keeps the last one, so that a store that cannot be reached at start
/// fails with it ("Connection refused", or no answer at all for a host or
/// proxy that drops packets). Errors that trying again cannot cure (a
/// refused password, a missing database) fail at once.
pub(crate) async fn first_connection(
    options: &PgConnectOptions,
    wait: Duration,
    location: &str,
) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = FIRST_CONNECTION_PAUSE;
    let mut warned = false;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reason = match tokio::time::timeout(left, PgConnection::connect_with(options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                return Ok(());
            }
            Ok(Err(e)) if !crate::rows::connection_error(&e) => {
                return Err(StoreError::Open {
                    location: location.to_string(),
                    reason: e.to_string(),
                })
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                "the server did not answer (a host or network that drops packets)".to_string()
            }
        };
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(StoreError::Open {
                location: location.to_string(),
                reason: format!("{reason} (tried for {wait:?})"),
            });
        }
        if !warned {
            tracing::warn!(
                "cannot connect to {location} yet: {reason}; trying again for up to {wait:?}",
                reason = escaped(&reason)
            );
            warned = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(FIRST_CONNECTION_MAX_PAUSE);
    }
}
