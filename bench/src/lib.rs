//! What herald's benchmark binaries share: CPU accounting ([`cpu`]) and a
//! fleet of real `herald serve` worker processes on PostgreSQL + NATS
//! JetStream ([`fleet`]).

pub mod cpu;
pub mod fleet;

/// Logs to stderr at `warn`, or as `HERALD_LOG` says (`HERALD_LOG=info`).
pub fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
}
