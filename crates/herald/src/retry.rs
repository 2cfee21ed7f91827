//! Retry policy: exponential backoff with jitter. Pure: the caller supplies
//! the random sample, so the decision stays testable.

use std::time::Duration;

/// How long to wait before the next attempt after a failure.
///
/// The delay after attempt `n` (1-based) is `base * factor^(n-1)`, capped at
/// `max`, then spread by up to `±jitter` of itself so that a burst of failures
/// does not come back as a burst.
///
/// Defaults: `base` 1 s, `factor` 2, `max` 1 h, `jitter` 0.2. With the default
/// `max_attempts` of 10, the nine waits are about 1 s, 2 s, 4 s, … 256 s:
/// about 8.5 minutes from the first failure to the tenth attempt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// Upper bound before jitter.
    pub max: Duration,
    /// Fraction of the delay to spread by, in `[0, 1]`.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            factor: 2.0,
            max: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

/// The default number of attempts before an event goes dead.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

impl RetryPolicy {
    /// The delay after failed attempt `attempt` (1-based), given a uniform
    /// sample `unit` in `[0, 1)`.
    pub fn backoff(&self, attempt: u32, unit: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(63) as i32;
        let raw = self.base.as_secs_f64() * self.factor.powi(exp);
        let capped = raw.min(self.max.as_secs_f64());
        let spread = self.jitter.clamp(0.0, 1.0) * capped;
        let jittered = capped - spread + 2.0 * spread * unit.clamp(0.0, 1.0);
        Duration::from_secs_f64(jittered.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_and_is_capped() {
        let p = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff(1, 0.5), Duration::from_secs(1));
        assert_eq!(p.backoff(2, 0.5), Duration::from_secs(2));
        assert_eq!(p.backoff(5, 0.5), Duration::from_secs(16));
        assert_eq!(p.backoff(40, 0.5), Duration::from_secs(3600));
        assert_eq!(p.backoff(u32::MAX, 0.5), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_spreads_within_bounds() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff(3, 0.0), Duration::from_secs_f64(3.2));
        assert_eq!(p.backoff(3, 0.5), Duration::from_secs(4));
        assert!(p.backoff(3, 0.999_999) <= Duration::from_secs_f64(4.8));
    }
}
