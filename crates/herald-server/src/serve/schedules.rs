//! herald.toml's `[[schedules]]` in the store: applied on start and on
//! SIGHUP (docs/schedules.md). A file's schedule is created or its
//! definition replaced (a changed cadence or zone starts its cursor again
//! from now; otherwise the cursor stays); a schedule that came from the
//! file and is no longer in it is deleted; schedules made through the API
//! are left alone.

use std::collections::HashSet;

use herald::backend::Schedules;
use herald::schedule::{ScheduleDef, ScheduleError, ScheduleSource};
use herald::StoreError;

/// What applying the file's schedules did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Applied {
    /// Schedules created.
    pub created: usize,
    /// Schedules whose definition was written again (changed or not).
    pub updated: usize,
    /// The file's schedules that are gone from it, deleted.
    pub deleted: usize,
}

/// Why the file's schedules could not be applied.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApplyError {
    /// A definition is refused (the configuration checks them first, so
    /// only a caller that skipped them sees this).
    #[error("schedule {tenant}/{name}: {source}")]
    Invalid {
        /// Its tenant.
        tenant: String,
        /// Its name.
        name: String,
        /// What is wrong.
        #[source]
        source: ScheduleError,
    },
    /// The store failed; what was applied before stays.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Writes `defs` (the file's schedules) to the store and deletes the file's
/// schedules that are not among them.
pub(super) async fn apply(
    store: &dyn Schedules,
    defs: &[ScheduleDef],
    max_payload: usize,
) -> Result<Applied, ApplyError> {
    // The store's clock judges the occurrences: a new schedule's first is
    // the first after the store's now, however this process's clock is off.
    let now = store.clock().await?;
    let mut built = Vec::with_capacity(defs.len());
    for d in defs {
        let s = d
            .build(now, max_payload)
            .map_err(|source| ApplyError::Invalid {
                tenant: d.tenant.clone(),
                name: d.name.clone(),
                source,
            })?;
        built.push(s);
    }
    let mut applied = Applied::default();
    for s in &built {
        if store.put_schedule(s).await? {
            applied.created += 1;
        } else {
            applied.updated += 1;
        }
    }
    let keep: HashSet<(&str, &str)> = defs
        .iter()
        .map(|d| (d.tenant.as_str(), d.name.as_str()))
        .collect();
    for s in store.schedules(None).await? {
        if s.source == ScheduleSource::Config
            && !keep.contains(&(s.tenant.as_str(), s.name.as_str()))
            && store.delete_schedule(&s.tenant, &s.name).await?
        {
            applied.deleted += 1;
        }
    }
    Ok(applied)
}
