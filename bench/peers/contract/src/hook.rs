//! The phase hook: `sh -c "CMD PHASE"`, waited for, or in the background
//! for `mid-drain` (the workers go on meanwhile).

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

fn command(hook: &str, phase: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{hook} {phase}"))
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs the hook for `phase` and waits for it; a failing hook fails the run.
pub(crate) async fn run(hook: Option<&str>, phase: &str) -> Result<()> {
    let Some(hook) = hook else { return Ok(()) };
    let status = command(hook, phase)
        .status()
        .await
        .with_context(|| format!("running the hook for phase {phase}"))?;
    if !status.success() {
        bail!("the hook for phase {phase} exited with {status}");
    }
    Ok(())
}

/// Starts the hook for `phase` without waiting for it.
pub(crate) fn start(
    hook: Option<&str>,
    phase: &'static str,
) -> Result<Option<(Child, &'static str)>> {
    let Some(hook) = hook else { return Ok(None) };
    let child = command(hook, phase)
        .spawn()
        .with_context(|| format!("starting the hook for phase {phase}"))?;
    Ok(Some((child, phase)))
}

/// Waits for a hook started by [`start`].
pub(crate) async fn finish(started: Option<(Child, &'static str)>) -> Result<()> {
    let Some((mut child, phase)) = started else {
        return Ok(());
    };
    let status = child
        .wait()
        .await
        .with_context(|| format!("waiting for the hook for phase {phase}"))?;
    if !status.success() {
        bail!("the hook for phase {phase} exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_phase_is_the_hooks_last_argument_and_failure_is_reported() {
        let dir = std::env::temp_dir().join(format!("peer-contract-hook-{}", std::process::id()));
        let file = dir.with_extension("log");
        let hook = format!("echo >>{}", file.display());
        run(Some(&hook), "drain-start").await.unwrap();
        finish(start(Some(&hook), "mid-drain").unwrap())
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "drain-start\nmid-drain\n"
        );
        std::fs::remove_file(&file).unwrap();
        let err = run(Some("false"), "drain-end").await.unwrap_err();
        assert!(err.to_string().contains("phase drain-end"), "{err}");
        run(None, "drain-end").await.unwrap();
    }
}
