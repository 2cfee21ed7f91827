//! The phase hook: `sh -c "CMD PHASE"` at each phase of a scenario, so that
//! a driver can take its readings (PostgreSQL's CPU, statements) at the
//! same moments for herald and for every peer.

use super::BenchError;

/// The `--hook` command, if any.
#[derive(Clone, Debug, Default)]
pub(super) struct Hook(pub(super) Option<String>);

impl Hook {
    fn command(&self, phase: &str) -> Option<tokio::process::Command> {
        let cmd = self.0.as_ref()?;
        let mut c = tokio::process::Command::new("sh");
        c.arg("-c").arg(format!("{cmd} {phase}"));
        Some(c)
    }

    /// Runs the hook for `phase` and waits for it; a failing hook fails
    /// the benchmark (its readings would be missing).
    pub(super) async fn call(&self, phase: &str) -> Result<(), BenchError> {
        let Some(mut c) = self.command(phase) else {
            return Ok(());
        };
        let failed = |reason: String| BenchError::Hook {
            phase: phase.to_string(),
            reason,
        };
        let status = c.status().await.map_err(|e| failed(e.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!("exited with {status}")))
        }
    }

    /// Starts the hook for `phase` without waiting (the workers go on);
    /// [`Hook::finish`] waits for it. A failure fails the benchmark there.
    pub(super) fn spawn(
        &self,
        phase: &str,
    ) -> Option<tokio::task::JoinHandle<Result<(), BenchError>>> {
        self.0.as_ref()?;
        let hook = self.clone();
        let phase = phase.to_string();
        Some(tokio::spawn(async move { hook.call(&phase).await }))
    }

    /// Waits for a hook started by [`Hook::spawn`].
    pub(super) async fn finish(
        started: Option<tokio::task::JoinHandle<Result<(), BenchError>>>,
        phase: &str,
    ) -> Result<(), BenchError> {
        let Some(task) = started else {
            return Ok(());
        };
        task.await.map_err(|e| BenchError::Hook {
            phase: phase.to_string(),
            reason: e.to_string(),
        })?
    }
}
