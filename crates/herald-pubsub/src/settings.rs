//! The functional core of the Pub/Sub queue: its configuration, the
//! `pubsub://` location, the arithmetic of deadlines and delays, and the
//! check of an existing subscription. No I/O here.

use std::path::PathBuf;
use std::time::Duration;

use gcloud_pubsub::subscription::SubscriptionConfig;
use herald::queue::{MessageLimits, QueueError};

/// The shortest ack deadline Pub/Sub accepts on a subscription or a stream.
pub const MIN_ACK_DEADLINE: Duration = Duration::from_secs(10);

/// The longest ack deadline Pub/Sub accepts, and so the longest a message
/// can be held back ([`herald::Queue::max_delay`]).
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(600);

/// Outstanding messages per worker by default: see [`PubsubConfig::max_outstanding`].
pub const DEFAULT_MAX_OUTSTANDING: usize = 1_000;

/// The attribute that holds a delayed message's delay, in ms: a duration,
/// counted from the service's publish time, so that the publisher's clock
/// plays no part.
pub const DELAY: &str = "herald-delay";

/// The most messages in one Publish request (the service's limit).
pub const PUBLISH_BATCH: usize = 1_000;

/// The most ack ids in one Acknowledge or ModifyAckDeadline request. The
/// service limits a request to 512 KiB; an ack id is a few hundred bytes.
pub const ACK_BATCH: usize = 1_000;

/// How a [`crate::PubsubQueue`] finds and configures its topic and subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubsubConfig {
    /// The Google Cloud project of the topic and subscription.
    pub project: String,
    /// The topic notifications are published on (its id, not its full name).
    pub topic: String,
    /// The pull subscription every worker shares (its id).
    pub subscription: String,
    /// How long a delivery is the receiver's before it comes back, unless
    /// answered or extended: give it the worker's lease. Any length up to
    /// [`MAX_ACK_DEADLINE`]; the subscription's own ack deadline is
    /// [`PubsubConfig::ack_deadline`], at least [`MIN_ACK_DEADLINE`] (see
    /// the crate docs: the deadline and the lease are separate).
    pub ack_wait: Duration,
    /// The most messages one worker holds unanswered: received and not yet
    /// acked, nacked or terminated. Set on the streaming pull
    /// (`max_outstanding_messages`), so the service stops sending past it.
    /// A run holds its message until its end is settled and acked; a
    /// message held back by a nack with a delay counts until it comes back.
    pub max_outstanding: usize,
    /// A service-account key file; `None` for Application Default
    /// Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's, or the
    /// metadata server). Not used with an emulator.
    pub credentials: Option<PathBuf>,
    /// The emulator's `HOST:PORT`; `None` for `PUBSUB_EMULATOR_HOST`, and
    /// the real service when that is unset too.
    pub emulator: Option<String>,
    /// How messages are received: a streaming pull (the default), or unary
    /// Pull requests, one per batch.
    pub pull: PullMode,
    /// How large a notification publishers make: events per message and
    /// bytes (Pub/Sub takes up to 10 MB a message, and bills at least
    /// 1,000 bytes a request).
    pub message_limits: MessageLimits,
}

/// How a worker receives messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PullMode {
    /// One streaming pull per worker, with `max_outstanding_messages`:
    /// the service pushes messages as the worker has room. What Google
    /// recommends, and herald's default.
    #[default]
    Streaming,
    /// A unary Pull (waiting for messages) per batch, for exactly the room
    /// the worker has. Nothing is pushed to a process that does not ask:
    /// for the emulator, which keeps sending to the stream of a killed
    /// worker (docs/pubsub.md).
    Unary,
}

impl PullMode {
    /// Its name in configuration: `streaming` or `unary`.
    pub fn name(self) -> &'static str {
        match self {
            PullMode::Streaming => "streaming",
            PullMode::Unary => "unary",
        }
    }
}

impl std::str::FromStr for PullMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "streaming" => Ok(PullMode::Streaming),
            "unary" => Ok(PullMode::Unary),
            other => Err(format!(
                "{other:?} is not a way to pull: write \"streaming\" (the default) or \"unary\""
            )),
        }
    }
}

impl PubsubConfig {
    /// A topic and a subscription in `project`, with
    /// [`DEFAULT_MAX_OUTSTANDING`], Application Default Credentials, and
    /// the emulator if `PUBSUB_EMULATOR_HOST` names one.
    pub fn new(
        project: impl Into<String>,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        ack_wait: Duration,
    ) -> Self {
        PubsubConfig {
            project: project.into(),
            topic: topic.into(),
            subscription: subscription.into(),
            ack_wait,
            max_outstanding: DEFAULT_MAX_OUTSTANDING,
            credentials: None,
            emulator: None,
            pull: PullMode::Streaming,
            message_limits: MessageLimits::default(),
        }
    }

    /// Reads `pubsub://PROJECT/TOPIC?subscription=NAME`; the subscription
    /// defaults to `TOPIC-workers`.
    ///
    /// # Errors
    ///
    /// [`QueueError::Config`] saying what is wrong with the location.
    pub fn from_url(url: &str, ack_wait: Duration) -> Result<Self, QueueError> {
        let bad = |why: &str| {
            QueueError::Config(format!(
                "{url:?} {why}; write pubsub://PROJECT/TOPIC?subscription=NAME"
            ))
        };
        let rest = url
            .strip_prefix("pubsub://")
            .ok_or_else(|| bad("is not a pubsub:// location"))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (project, topic) = path.split_once('/').ok_or_else(|| bad("names no topic"))?;
        let mut subscription = None;
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("subscription", name)) => subscription = Some(name.to_string()),
                _ => return Err(bad(&format!("has an unknown parameter {pair:?}"))),
            }
        }
        let subscription = subscription.unwrap_or_else(|| format!("{topic}-workers"));
        let config = PubsubConfig::new(project, topic, subscription, ack_wait);
        config.check()?;
        Ok(config)
    }

    /// The subscription's ack deadline: the ack wait rounded up to whole
    /// seconds, within Pub/Sub's 10–600 s. This is how long the service
    /// keeps a delivery from everyone else when its receiver says nothing
    /// (it died); the ack wait itself is kept by the receiver.
    pub fn ack_deadline(&self) -> Duration {
        whole_seconds(self.ack_wait).clamp(MIN_ACK_DEADLINE, MAX_ACK_DEADLINE)
    }

    /// The topic's full name, `projects/P/topics/T`.
    pub fn topic_name(&self) -> String {
        format!("projects/{}/topics/{}", self.project, self.topic)
    }

    /// The subscription's full name, `projects/P/subscriptions/S`.
    pub fn subscription_name(&self) -> String {
        format!(
            "projects/{}/subscriptions/{}",
            self.project, self.subscription
        )
    }

    /// Refuses settings the service would refuse later, or that break herald.
    pub fn check(&self) -> Result<(), QueueError> {
        let bad = |m: String| Err(QueueError::Config(m));
        if !valid_project(&self.project) {
            return bad(format!(
                "{:?} is not a Google Cloud project id (6–30 lowercase letters, digits and '-', starting with a letter)",
                self.project
            ));
        }
        for (what, name) in [("topic", &self.topic), ("subscription", &self.subscription)] {
            if !valid_resource(name) {
                return bad(format!(
                    "{name:?} is not a usable {what} id (3–255 letters, digits and - _ . ~ + %, starting with a letter, not with \"goog\")"
                ));
            }
        }
        if self.ack_wait.is_zero() || self.ack_wait > MAX_ACK_DEADLINE {
            return bad(format!(
                "the ack wait (the lease) is {:?}: Pub/Sub holds a delivery for at most {MAX_ACK_DEADLINE:?}, so use a lease from 1ms to 600s",
                self.ack_wait
            ));
        }
        if self.max_outstanding == 0 || self.max_outstanding > i64::MAX as usize {
            return bad(format!(
                "max_outstanding is {}: it must be at least 1",
                self.max_outstanding
            ));
        }
        Ok(())
    }
}

fn valid_project(p: &str) -> bool {
    (6..=30).contains(&p.len())
        && p.starts_with(|c: char| c.is_ascii_lowercase())
        && !p.ends_with('-')
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn valid_resource(n: &str) -> bool {
    (3..=255).contains(&n.len())
        && n.starts_with(|c: char| c.is_ascii_alphabetic())
        && !n.starts_with("goog")
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c))
}

/// `d` rounded up to whole seconds (Pub/Sub's deadlines are in seconds).
pub fn whole_seconds(d: Duration) -> Duration {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(s)
}

/// The ack deadline, in seconds, that holds a message back for `delay`:
/// rounded up, so it never comes back early, and at most
/// [`MAX_ACK_DEADLINE`] (a longer delay bounces until due). 0 for none:
/// deliver again at once.
pub fn hold_back_seconds(delay: Duration) -> i32 {
    whole_seconds(delay).min(MAX_ACK_DEADLINE).as_secs() as i32
}

/// The time left before a message with the `herald-delay` attribute
/// `delay` (ms), published at `published_ms` by the service's clock, is
/// due at `now_ms` by this process's: the delay less the message's age,
/// never counted below zero. `None` when due (or when the attribute is not
/// a number, or the publish time is missing: deliver it, the worker
/// decides). A clock ahead of the service's can only deliver early, and
/// the store puts an event that is not due back for the time left by its
/// own clock.
pub fn time_left(delay: Option<&str>, published_ms: Option<u64>, now_ms: u64) -> Option<Duration> {
    let delay: u64 = delay?.parse().ok()?;
    let age = now_ms.saturating_sub(published_ms?);
    let left = delay.saturating_sub(age);
    (left > 0).then(|| Duration::from_millis(left))
}

/// What herald sets on a subscription it creates, and needs on one it finds.
pub fn wanted_subscription(config: &PubsubConfig) -> SubscriptionConfig {
    SubscriptionConfig {
        ack_deadline_seconds: config.ack_deadline().as_secs() as i32,
        // Never deleted for inactivity (the default is after 31 days).
        expiration_policy: Some(gcloud_googleapis::pubsub::v1::ExpirationPolicy { ttl: None }),
        ..SubscriptionConfig::default()
    }
}

/// Refuses an existing subscription herald can't work with, naming the
/// setting and the command that fixes it; returns what it accepts but
/// would have set otherwise (warnings).
pub fn check_subscription(
    config: &PubsubConfig,
    topic: &str,
    got: &SubscriptionConfig,
) -> Result<Vec<String>, QueueError> {
    let sub = &config.subscription;
    let project = &config.project;
    let what = format!("subscription {sub} (project {project})");
    let recreate = format!(
        "delete it with `gcloud pubsub subscriptions delete {sub} --project {project}` and herald creates it again"
    );
    let refuse = |m: String| Err(QueueError::Config(format!("{what}: {m}")));
    if topic != config.topic_name() {
        return refuse(format!(
            "it is on topic {topic}, herald publishes on {}: {recreate}, or configure herald for that topic",
            config.topic_name()
        ));
    }
    if got
        .push_config
        .as_ref()
        .is_some_and(|p| !p.push_endpoint.is_empty())
    {
        return refuse(format!(
            "it is a push subscription, herald pulls: `gcloud pubsub subscriptions modify-push-config {sub} --project {project} --push-endpoint=\"\"` makes it a pull subscription"
        ));
    }
    if got.bigquery_config.is_some() || got.cloud_storage_config.is_some() {
        return refuse(format!(
            "it writes to BigQuery or Cloud Storage, herald pulls: {recreate}"
        ));
    }
    if got.detached {
        return refuse(format!("it is detached from its topic: {recreate}"));
    }
    let want = config.ack_deadline().as_secs() as i32;
    if got.ack_deadline_seconds != want {
        return refuse(format!(
            "its ack deadline is {} s, herald needs {want} s for a lease of {:?}: `gcloud pubsub subscriptions update {sub} --project {project} --ack-deadline={want}`",
            got.ack_deadline_seconds, config.ack_wait
        ));
    }
    if !got.filter.is_empty() {
        return refuse(format!(
            "it has the filter {:?}, which would drop notifications (a filter cannot be changed): {recreate}",
            got.filter
        ));
    }
    if got.enable_message_ordering {
        return refuse(format!(
            "it orders messages, which holds every notification behind the one before it (ordering cannot be changed): {recreate}"
        ));
    }
    if got.enable_exactly_once_delivery {
        return refuse(format!(
            "it has exactly-once delivery, which herald does not need (the store fences every run) and which slows acks: `gcloud pubsub subscriptions update {sub} --project {project} --no-enable-exactly-once-delivery`"
        ));
    }
    if got.dead_letter_policy.is_some() {
        return refuse(format!(
            "it has a dead-letter policy, which would move notifications of long-delayed or often-retried events away (the store keeps dead events itself): `gcloud pubsub subscriptions update {sub} --project {project} --clear-dead-letter-policy`"
        ));
    }
    if got.retry_policy.is_some() {
        return refuse(format!(
            "it has a retry policy, which would delay redeliveries that herald times itself: `gcloud pubsub subscriptions update {sub} --project {project} --clear-retry-policy`"
        ));
    }
    let mut warnings = Vec::new();
    if let Some(ttl) = got.expiration_policy.as_ref().and_then(|e| e.ttl.as_ref()) {
        warnings.push(format!(
            "{what}: it is deleted after {} s without subscribers; herald creates its subscriptions to never expire (`gcloud pubsub subscriptions update {sub} --project {project} --expiration-period=never`)",
            ttl.seconds
        ));
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gcloud_googleapis::pubsub::v1::{DeadLetterPolicy, PushConfig, RetryPolicy};

    fn config() -> PubsubConfig {
        PubsubConfig::new(
            "my-project",
            "herald",
            "herald-workers",
            Duration::from_secs(9),
        )
    }

    fn refused(got: SubscriptionConfig) -> String {
        let c = config();
        match check_subscription(&c, &c.topic_name(), &got) {
            Err(QueueError::Config(m)) => m,
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn the_location_names_project_topic_and_subscription() {
        let c = PubsubConfig::from_url(
            "pubsub://my-project/herald?subscription=workers",
            Duration::from_secs(9),
        )
        .unwrap();
        assert_eq!(
            (
                c.project.as_str(),
                c.topic.as_str(),
                c.subscription.as_str()
            ),
            ("my-project", "herald", "workers")
        );
        assert_eq!(c.topic_name(), "projects/my-project/topics/herald");
        assert_eq!(
            c.subscription_name(),
            "projects/my-project/subscriptions/workers"
        );
        let c =
            PubsubConfig::from_url("pubsub://my-project/herald", Duration::from_secs(9)).unwrap();
        assert_eq!(c.subscription, "herald-workers");
        for (url, says) in [
            ("pubsub://my-project", "names no topic"),
            (
                "pubsub://my-project/herald?sub=x",
                "unknown parameter \"sub=x\"",
            ),
            (
                "pubsub://My_Project/herald",
                "is not a Google Cloud project id",
            ),
            ("pubsub://my-project/goog-x", "is not a usable topic id"),
            ("nats://x", "is not a pubsub:// location"),
        ] {
            match PubsubConfig::from_url(url, Duration::from_secs(9)) {
                Err(QueueError::Config(m)) => assert!(m.contains(says), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_ack_deadline_covers_the_lease_within_pubsubs_range() {
        let with = |ms| {
            PubsubConfig {
                ack_wait: Duration::from_millis(ms),
                ..config()
            }
            .ack_deadline()
        };
        assert_eq!(with(2_000), Duration::from_secs(10));
        assert_eq!(with(9_000), Duration::from_secs(10));
        assert_eq!(with(30_001), Duration::from_secs(31));
        assert_eq!(with(600_000), Duration::from_secs(600));
        let long = PubsubConfig {
            ack_wait: Duration::from_secs(601),
            ..config()
        };
        assert!(matches!(long.check(), Err(QueueError::Config(m)) if m.contains("at most 600s")));
        let none = PubsubConfig {
            max_outstanding: 0,
            ..config()
        };
        assert!(
            matches!(none.check(), Err(QueueError::Config(m)) if m.contains("max_outstanding is 0"))
        );
    }

    #[test]
    fn a_delay_holds_a_message_back_rounded_up_and_at_most_600_s() {
        assert_eq!(hold_back_seconds(Duration::ZERO), 0);
        assert_eq!(hold_back_seconds(Duration::from_millis(1)), 1);
        assert_eq!(hold_back_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(hold_back_seconds(Duration::from_secs(60)), 60);
        assert_eq!(hold_back_seconds(Duration::from_secs(3600)), 600);
        let at = Some(1_000_000);
        assert_eq!(time_left(None, at, 1_000_000), None);
        assert_eq!(time_left(Some("x"), at, 1_000_000), None);
        assert_eq!(time_left(Some("1000"), None, 1_000_000), None);
        assert_eq!(time_left(Some("1000"), at, 1_001_000), None);
        assert_eq!(
            time_left(Some("1000"), at, 1_000_000),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            time_left(Some("3000"), at, 1_001_000),
            Some(Duration::from_secs(2))
        );
        // This process's clock 5 minutes behind the service's: not held
        // longer than the delay; ahead: delivered (early, and put back by
        // the store for the time left by its clock).
        assert_eq!(
            time_left(Some("3000"), at, 1_000_000 - 300_000),
            Some(Duration::from_secs(3))
        );
        assert_eq!(time_left(Some("3000"), at, 1_000_000 + 300_000), None);
    }

    #[test]
    fn the_subscription_herald_creates_passes_its_own_check() {
        let c = config();
        let want = wanted_subscription(&c);
        assert_eq!(want.ack_deadline_seconds, 10);
        assert!(check_subscription(&c, &c.topic_name(), &want)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_mismatched_subscription_is_refused_with_the_command_that_fixes_it() {
        let ok = wanted_subscription(&config());
        let m = refused(SubscriptionConfig {
            ack_deadline_seconds: 60,
            ..ok.clone()
        });
        assert!(m.contains("ack deadline is 60 s, herald needs 10 s"), "{m}");
        assert!(m.contains("--ack-deadline=10"), "{m}");
        let m = refused(SubscriptionConfig {
            filter: "attributes.x = \"1\"".into(),
            ..ok.clone()
        });
        assert!(
            m.contains("filter") && m.contains("subscriptions delete herald-workers"),
            "{m}"
        );
        let m = refused(SubscriptionConfig {
            enable_exactly_once_delivery: true,
            ..ok.clone()
        });
        assert!(m.contains("--no-enable-exactly-once-delivery"), "{m}");
        let m = refused(SubscriptionConfig {
            enable_message_ordering: true,
            ..ok.clone()
        });
        assert!(m.contains("orders messages"), "{m}");
        let m = refused(SubscriptionConfig {
            retry_policy: Some(RetryPolicy::default()),
            ..ok.clone()
        });
        assert!(m.contains("--clear-retry-policy"), "{m}");
        let m = refused(SubscriptionConfig {
            dead_letter_policy: Some(DeadLetterPolicy::default()),
            ..ok.clone()
        });
        assert!(m.contains("--clear-dead-letter-policy"), "{m}");
        let m = refused(SubscriptionConfig {
            push_config: Some(PushConfig {
                push_endpoint: "https://example.invalid/push".into(),
                ..PushConfig::default()
            }),
            ..ok.clone()
        });
        assert!(m.contains("modify-push-config"), "{m}");
        let c = config();
        let m = match check_subscription(&c, "projects/my-project/topics/other", &ok) {
            Err(QueueError::Config(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            m.contains("on topic projects/my-project/topics/other"),
            "{m}"
        );
    }

    #[test]
    fn a_subscription_that_expires_is_kept_with_a_warning() {
        let c = config();
        let got = SubscriptionConfig {
            expiration_policy: Some(gcloud_googleapis::pubsub::v1::ExpirationPolicy {
                ttl: Some(prost_types::Duration {
                    seconds: 31 * 24 * 3600,
                    nanos: 0,
                }),
            }),
            ..wanted_subscription(&c)
        };
        let w = check_subscription(&c, &c.topic_name(), &got).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("--expiration-period=never"), "{}", w[0]);
    }
}
