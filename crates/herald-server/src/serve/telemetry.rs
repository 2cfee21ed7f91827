//! `/metrics`: the process-wide Prometheus recorder for the `metrics` facade
//! that herald's runtime and client report through.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Histogram buckets for the `_seconds` metrics: 1 ms to 10 min.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
/// Serializes installs: only the first may set the global recorder.
static INSTALLING: Mutex<()> = Mutex::new(());

/// Errors installing the recorder.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics recorder: {0}")]
pub struct TelemetryError(String);

/// Installs the Prometheus recorder for this process (once; later calls
/// return the same handle) and describes herald's metrics. Call it before
/// starting a worker: the worker registers its handles when it starts.
pub fn install() -> Result<PrometheusHandle, TelemetryError> {
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .map_err(|e| TelemetryError(e.to_string()))?
        .install_recorder()
        .map_err(|e| TelemetryError(e.to_string()))?;
    describe();
    let _ = HANDLE.set(handle);
    Ok(HANDLE.get().expect("just set").clone())
}

/// Drains histograms into their buckets every few seconds (rendering does
/// it too; this bounds memory between scrapes).
pub fn spawn_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.run_upkeep();
        }
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "herald_events_emitted_total",
        "Events stored as new (idempotency hits are not counted), by handler."
    );
    describe_counter!(
        "herald_events_done_total",
        "Runs that finished done and were settled, by handler."
    );
    describe_counter!(
        "herald_events_failed_total",
        "Failed attempts (retried, or moved to dead), by handler."
    );
    describe_counter!(
        "herald_events_dead_total",
        "Runs that moved their event to dead, by handler."
    );
    describe_gauge!("herald_runs_in_flight", "Handlers running now, by handler.");
    describe_counter!(
        "herald_lease_renewals_total",
        "Lease renewals that succeeded, by handler."
    );
    describe_counter!(
        "herald_lease_losses_total",
        "Leases lost while their handler ran (the run was cancelled), by handler."
    );
    describe_histogram!(
        "herald_emit_to_start_seconds",
        Unit::Seconds,
        "Run start minus the event's run_at, by handler."
    );
    describe_histogram!(
        "herald_handler_duration_seconds",
        Unit::Seconds,
        "How long handlers ran, by handler."
    );
}
