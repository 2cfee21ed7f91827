//! The runners of `herald serve`: the webhook and command handlers it runs
//! for an event, per handler name, as configured in `herald.toml`.
//!
//! ```toml
//! [handlers.send_email]
//! kind = "webhook"
//! url = "https://mailer.internal/hooks/herald"
//! secret_env = "MAILER_HOOK_SECRET"   # the HMAC key, read from this variable (or `secret = "..."`)
//! timeout = "30s"
//!
//! [handlers.resize]
//! kind = "command"
//! program = "/usr/local/bin/resize"
//! args = ["--quality", "80"]
//! timeout = "5m"
//! snooze_exit_code = 75     # the default (EX_TEMPFAIL)
//! snooze_for = "30s"
//! ```
//!
//! - [`webhook`]: POST the event as signed JSON; the status code says what
//!   happened.
//! - [`command`]: run a program with the payload on stdin; the exit status
//!   says what happened.
//!
//! `parse_handlers` (tests) reads the `[handlers]` section of a config document and
//! [`HandlerConfig::build`] turns one entry into a [`herald::Handler`] for
//! [`herald::WorkerBuilder::raw_handler`]. Every error names the key it is
//! about, e.g. `handlers.send_email.url: relative URL without a base`.
//! The operator's guide is `docs/handlers.md`.

pub mod command;
pub mod gate;
pub mod leftovers;
#[cfg(test)]
mod log_tests;
pub mod watchdog;
pub mod webhook;

#[cfg(test)]
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub use command::{CommandConfig, CommandHandler};
pub use watchdog::RunWatch;
pub use webhook::{WebhookConfig, WebhookHandler};

/// One `[handlers.NAME]` section of `herald.toml`: which kind of handler runs
/// the events of handler `NAME`, and its settings.
///
/// Deserializing this type directly works (e.g. as a field of a larger config
/// struct), but serde loses track of where an error was inside a tagged enum;
/// `parse_handlers` (tests) and [`HandlerConfig::from_toml`] report the key.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HandlerConfig {
    /// `kind = "webhook"`: POST each event to a URL.
    Webhook(WebhookConfig),
    /// `kind = "command"`: run a program for each event.
    Command(CommandConfig),
}

/// A config that cannot be used. The message starts with the key it is
/// about (`handlers.send_email.url: ...`), so an operator can find it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The document is not TOML at all.
    #[cfg(test)]
    #[error("not valid TOML: {0}")]
    Toml(String),
    /// A key is missing, unknown, or has a value that cannot be used.
    #[error("{key}: {message}")]
    Key {
        /// The dotted path of the key, e.g. `handlers.send_email.url`.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// An error about key `key` (a field name, or empty for the handler's
    /// own section) of handler `name`.
    pub(crate) fn key(name: &str, key: &str, message: impl fmt::Display) -> Self {
        let mut path = format!("handlers.{}", key_segment(name));
        if !key.is_empty() {
            path.push('.');
            path.push_str(key);
        }
        ConfigError::Key {
            key: path,
            message: message.to_string(),
        }
    }
}

/// A handler name as one segment of a dotted key: bare when TOML would
/// accept it bare, quoted otherwise (`handlers."billing.charge".url`).
fn key_segment(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

/// Reads the `[handlers.*]` sections of a `herald.toml` document. Other
/// sections are left alone (they belong to other parts of the config); a
/// document without handlers gives an empty map.
#[cfg(test)]
pub(crate) fn parse_handlers(
    document: &str,
) -> Result<BTreeMap<String, HandlerConfig>, ConfigError> {
    let mut doc: toml::Table = document
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Toml(e.to_string()))?;
    let Some(section) = doc.remove("handlers") else {
        return Ok(BTreeMap::new());
    };
    let toml::Value::Table(section) = section else {
        return Err(ConfigError::Key {
            key: "handlers".into(),
            message: format!(
                "expected a table of handlers ([handlers.NAME]), found {}",
                section.type_str()
            ),
        });
    };
    section
        .into_iter()
        .map(|(name, value)| {
            let config = HandlerConfig::from_toml(&name, value)?;
            Ok((name, config))
        })
        .collect()
}

impl HandlerConfig {
    /// Reads the section of handler `name` from a TOML value, reporting the
    /// key of any error.
    pub fn from_toml(name: &str, value: toml::Value) -> Result<Self, ConfigError> {
        herald::client::check_name("handler", name).map_err(|e| ConfigError::key(name, "", e))?;
        let toml::Value::Table(mut table) = value else {
            return Err(ConfigError::key(
                name,
                "",
                format!("expected a table, found {}", value.type_str()),
            ));
        };
        const KINDS: &str = r#"expected "webhook" or "command""#;
        let kind = match table.remove("kind") {
            None => return Err(ConfigError::key(name, "kind", format!("missing; {KINDS}"))),
            Some(toml::Value::String(kind)) => kind,
            Some(other) => {
                return Err(ConfigError::key(
                    name,
                    "kind",
                    format!("{KINDS}, found {}", other.type_str()),
                ))
            }
        };
        let rest = toml::Value::Table(table);
        match kind.as_str() {
            "webhook" => section(name, rest).map(HandlerConfig::Webhook),
            "command" => section(name, rest).map(HandlerConfig::Command),
            other => Err(ConfigError::key(
                name,
                "kind",
                format!("unknown kind {other:?}; {KINDS}"),
            )),
        }
    }

    /// Checks the settings and makes the handler. Fails, naming the key, on
    /// a URL that does not parse, a secret variable that is not set, a
    /// program that does not exist, and the like: mistakes are caught when
    /// the server starts, not event by event. Command runs are reported
    /// to `watch`.
    pub fn build(
        &self,
        name: &str,
        watch: &RunWatch,
    ) -> Result<Arc<dyn herald::Handler>, ConfigError> {
        Ok(match self {
            HandlerConfig::Webhook(c) => Arc::new(WebhookHandler::new(name, c)?),
            HandlerConfig::Command(c) => {
                Arc::new(CommandHandler::new(name, c)?.watched_by(watch.clone()))
            }
        })
    }
}

/// Deserializes one kind's settings, with the path of the failing key.
fn section<T: serde::de::DeserializeOwned>(
    name: &str,
    value: toml::Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let message = e.into_inner().message().to_string();
        // serde reports a missing key at its parent: name the key itself.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'));
        match missing {
            Some(field) if path.is_empty() => ConfigError::key(name, field, "missing"),
            Some(field) => ConfigError::key(name, &format!("{path}.{field}"), "missing"),
            None => ConfigError::key(name, &path, message),
        }
    })
}

/// What a handler knows about the event it runs, taken from
/// [`herald::Context`] (kept apart from it so the handlers can be driven
/// directly, with any cancellation future, in tests).
#[derive(Clone, Debug)]
pub(crate) struct EventMeta {
    pub event_id: String,
    pub tenant: String,
    pub handler: String,
    pub attempt: u32,
    pub max_attempts: u32,
    pub lease_token: String,
}

impl From<&herald::Context> for EventMeta {
    fn from(cx: &herald::Context) -> Self {
        EventMeta {
            event_id: cx.event_id.to_string(),
            tenant: cx.tenant.clone(),
            handler: cx.handler.clone(),
            attempt: cx.attempt,
            max_attempts: cx.max_attempts,
            lease_token: cx.lease_token.0.to_string(),
        }
    }
}

/// A duration as a human would write it: `"30s"`, `"5m"`, `"1h 30m"`,
/// `"250ms"`.
pub(crate) fn human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {text:?} ({e}); write e.g. \"30s\", \"5m\" or \"1h 30m\""
        ))
    })
}

/// A duration as herald writes it in messages: `30s`, `5m`, `1s 500ms`.
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};
    use std::time::Instant;

    use herald::{Client, EmitOptions, EmitRequest, MemoryQueue, Worker};
    use herald_sqlite::SqliteStore;

    use super::webhook::tests::{serve, unix_now, verify, SECRET};
    use super::webhook::Secret;
    use super::*;

    const GOOD: &str = r#"
        [store]
        url = "sqlite://herald.db"   # not ours: left alone

        [handlers.send_email]
        kind = "webhook"
        url = "https://mailer.internal/hooks/herald"
        secret_env = "MAILER_HOOK_SECRET"   # HMAC key read from this env var (or `secret = "..."`)
        timeout = "30s"

        [handlers.resize]
        kind = "command"
        program = "/usr/local/bin/resize"
        args = ["--quality", "80"]
        timeout = "5m"
        snooze_exit_code = 75     # default 75 (EX_TEMPFAIL)
        snooze_for = "30s"

        [handlers.minimal]
        kind = "command"
        program = "true"
    "#;

    fn error(doc: &str) -> String {
        parse_handlers(doc).unwrap_err().to_string()
    }

    #[test]
    fn a_good_config_parses_with_defaults_filled_in() {
        let handlers = parse_handlers(GOOD).unwrap();
        assert_eq!(
            handlers.keys().collect::<Vec<_>>(),
            ["minimal", "resize", "send_email"]
        );
        assert_eq!(
            handlers["send_email"],
            HandlerConfig::Webhook(WebhookConfig {
                url: "https://mailer.internal/hooks/herald".into(),
                secret: None,
                secret_env: Some("MAILER_HOOK_SECRET".into()),
                timeout: Duration::from_secs(30),
            })
        );
        assert_eq!(
            handlers["resize"],
            HandlerConfig::Command(CommandConfig {
                program: "/usr/local/bin/resize".into(),
                args: vec!["--quality".into(), "80".into()],
                timeout: Duration::from_secs(300),
                snooze_exit_code: 75,
                snooze_for: Duration::from_secs(30),
                fail_exit_code: None,
            })
        );
        assert_eq!(
            handlers["minimal"],
            HandlerConfig::Command(CommandConfig {
                program: "true".into(),
                args: vec![],
                timeout: Duration::from_secs(300),
                snooze_exit_code: 75,
                snooze_for: Duration::from_secs(30),
                fail_exit_code: None,
            })
        );
        // The derived Deserialize (for embedding in a larger config) agrees.
        #[derive(Deserialize)]
        struct File {
            handlers: BTreeMap<String, HandlerConfig>,
        }
        let doc = GOOD.replace(
            "[store]\n        url = \"sqlite://herald.db\"   # not ours: left alone",
            "",
        );
        let file: File = toml::from_str(&doc).unwrap();
        assert_eq!(file.handlers, handlers);
        // No handlers at all is fine.
        assert!(parse_handlers("[store]\nx = 1\n").unwrap().is_empty());
    }

    #[test]
    fn an_unknown_key_is_named() {
        let e = error("[handlers.send_email]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"k\"\ntimout = \"3s\"\n");
        assert_eq!(
            e,
            "handlers.send_email.timout: unknown field `timout`, expected one of `url`, `secret`, \
             `secret_env`, `timeout`"
        );
        let e =
            error("[handlers.resize]\nkind = \"command\"\nprogram = \"true\"\nsnooze_exit = 3\n");
        assert!(
            e.starts_with("handlers.resize.snooze_exit: unknown field `snooze_exit`"),
            "{e}"
        );
        // The derived Deserialize refuses unknown keys too.
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct File {
            handlers: BTreeMap<String, HandlerConfig>,
        }
        let derived = toml::from_str::<File>(
            "[handlers.a]\nkind = \"command\"\nprogram = \"true\"\nprogramme = \"x\"\n",
        );
        assert!(derived
            .unwrap_err()
            .to_string()
            .contains("unknown field `programme`"));
    }

    #[test]
    fn a_missing_key_is_named() {
        assert_eq!(
            error("[handlers.send_email]\nkind = \"webhook\"\nsecret = \"k\"\n"),
            "handlers.send_email.url: missing"
        );
        assert_eq!(
            error("[handlers.resize]\nkind = \"command\"\n"),
            "handlers.resize.program: missing"
        );
        assert_eq!(
            error("[handlers.resize]\nprogram = \"true\"\n"),
            r#"handlers.resize.kind: missing; expected "webhook" or "command""#
        );
    }

    #[test]
    fn a_bad_value_is_named() {
        assert_eq!(
            error("[handlers.resize]\nkind = \"command\"\nprogram = \"true\"\ntimeout = \"5 parsecs\"\n"),
            "handlers.resize.timeout: invalid duration \"5 parsecs\" (unknown time unit \"parsecs\", \
             supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few \
             variations)); write e.g. \"30s\", \"5m\" or \"1h 30m\""
        );
        let e = error("[handlers.send_email]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"k\"\ntimeout = 30\n");
        assert!(
            e.starts_with("handlers.send_email.timeout: invalid type: integer `30`"),
            "{e}"
        );
        let e = error(
            "[handlers.resize]\nkind = \"command\"\nprogram = \"true\"\nsnooze_exit_code = 300\n",
        );
        assert!(
            e.starts_with("handlers.resize.snooze_exit_code: invalid value: integer `300`"),
            "{e}"
        );
        let e = error(
            "[handlers.resize]\nkind = \"command\"\nprogram = \"true\"\nargs = [\"-v\", 3]\n",
        );
        assert!(
            e.starts_with("handlers.resize.args[1]: invalid type: integer `3`"),
            "{e}"
        );
        assert_eq!(
            error("[handlers.resize]\nkind = \"ftp\"\n"),
            r#"handlers.resize.kind: unknown kind "ftp"; expected "webhook" or "command""#
        );
        assert_eq!(
            error("[handlers]\nresize = \"/bin/resize\"\n"),
            "handlers.resize: expected a table, found string"
        );
        assert_eq!(
            error("handlers = 3\n"),
            "handlers: expected a table of handlers ([handlers.NAME]), found integer"
        );
        assert!(error("[handlers.resize\n").starts_with("not valid TOML: "));
        assert_eq!(
            error("[handlers.\"bad\\u0007name\"]\nkind = \"command\"\nprogram = \"true\"\n"),
            "handlers.\"bad\\u{7}name\": handler \"bad\\u{7}name\" is invalid: it contains a control character"
        );
    }

    /// The first error of building the handlers of `doc`.
    fn build_error(doc: &str) -> String {
        parse_handlers(doc)
            .unwrap()
            .iter()
            .find_map(|(name, config)| config.build(name, &RunWatch::none()).err())
            .expect("an error")
            .to_string()
    }

    #[test]
    fn build_checks_the_values_and_names_the_key() {
        assert_eq!(
            build_error("[handlers.send_email]\nkind = \"webhook\"\nurl = \"/hooks/herald\"\nsecret = \"k\"\n"),
            "handlers.send_email.url: relative URL without a base"
        );
        assert_eq!(
            build_error("[handlers.\"billing.charge\"]\nkind = \"webhook\"\nurl = \"ftp://x/\"\nsecret = \"k\"\n"),
            "handlers.\"billing.charge\".url: expected an http or https URL, not ftp:"
        );
        assert_eq!(
            build_error("[handlers.h]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret_env = \"HERALD_TEST_NO_SUCH_VAR\"\n"),
            "handlers.h.secret_env: environment variable HERALD_TEST_NO_SUCH_VAR: environment variable not found"
        );
        assert!(
            build_error("[handlers.h]\nkind = \"webhook\"\nurl = \"http://x/\"\n")
                .starts_with("handlers.h.secret_env: missing: set `secret_env`")
        );
        assert_eq!(
            build_error("[handlers.h]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"k\"\nsecret_env = \"K\"\n"),
            "handlers.h.secret: set either `secret` or `secret_env`, not both"
        );
        assert_eq!(
            build_error("[handlers.h]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"\"\n"),
            "handlers.h.secret: the secret is empty"
        );
        assert_eq!(
            build_error("[handlers.h]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"k\"\ntimeout = \"0s\"\n"),
            "handlers.h.timeout: must be more than zero"
        );
        assert_eq!(
            build_error(GOOD),
            "handlers.resize.program: /usr/local/bin/resize: No such file or directory (os error 2)"
        );
        // The good parts build. (A variable that is surely set: tests do not
        // set_var, as other tests spawn processes meanwhile.)
        let doc = "[handlers.w]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"PATH\"\n\
                   [handlers.c]\nkind = \"command\"\nprogram = \"sh\"\nargs = [\"-c\", \"exit 0\"]\n";
        for (name, config) in parse_handlers(doc).unwrap() {
            config.build(&name, &RunWatch::none()).unwrap();
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let config = HandlerConfig::Webhook(WebhookConfig {
            url: "http://x/".into(),
            secret: Some(Secret("hunter2".into())),
            secret_env: None,
            timeout: Duration::from_secs(1),
        });
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    /// The whole path: config → handler → a real worker on SQLite and the
    /// in-process queue → a real HTTP receiver.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_delivers_every_event_to_a_webhook_from_config_exactly_once() {
        let server = serve(|| async {
            axum::response::IntoResponse::into_response(axum::http::StatusCode::OK)
        })
        .await;
        let doc = format!(
            "[handlers.send_email]\nkind = \"webhook\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\ntimeout = \"5s\"\n",
            server.url
        );
        let handlers = parse_handlers(&doc).unwrap();
        let handler = handlers["send_email"]
            .build("send_email", &RunWatch::none())
            .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(dir.path().join("herald.db")).unwrap());
        let queue = Arc::new(MemoryQueue::default());
        let worker = Worker::builder(store.clone(), queue.clone())
            .raw_handler("send_email", handler)
            .start();
        let client = Client::new(store, queue);

        const N: usize = 20;
        let batch = (0..N)
            .map(|n| EmitRequest {
                tenant: "acme".into(),
                handler: "send_email".into(),
                payload: format!(r#"{{"n":{n}}}"#),
                options: EmitOptions::default(),
            })
            .collect();
        let emitted: HashSet<String> = client
            .emit_batch(batch)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id().to_string())
            .collect();
        assert_eq!(emitted.len(), N);

        let deadline = Instant::now() + Duration::from_secs(30);
        while worker.stats().done < N as u64 {
            assert!(Instant::now() < deadline, "stuck: {:?}", worker.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Time for a duplicate to show up, if there were one.
        tokio::time::sleep(Duration::from_millis(500)).await;
        worker.shutdown(Duration::from_secs(5)).await;

        let got = server.received();
        assert_eq!(got.len(), N, "each event arrives exactly once");
        let mut ids = HashSet::new();
        let mut ns = BTreeSet::new();
        for r in &got {
            let ts = r.header("herald-timestamp");
            assert!(verify(
                SECRET.as_bytes(),
                ts,
                &r.body,
                r.header("herald-signature"),
                unix_now()
            ));
            let body = r.json();
            assert_eq!(r.header("herald-event-id"), body["id"].as_str().unwrap());
            assert_eq!(body["tenant"], "acme");
            assert_eq!(body["attempt"], 1);
            ids.insert(body["id"].as_str().unwrap().to_string());
            ns.insert(body["payload"]["n"].as_u64().unwrap());
        }
        assert_eq!(ids, emitted);
        assert_eq!(ns, (0..N as u64).collect());

        let stored: u64 = client
            .handler_counts(&herald::CountsQuery::totals())
            .await
            .unwrap()
            .iter()
            .map(|c| c.total())
            .sum();
        assert_eq!(stored, 0, "done events are deleted");
    }
    /// A store, a queue and a client on a fresh SQLite file.
    fn embedded(dir: &std::path::Path) -> (Arc<SqliteStore>, Arc<MemoryQueue>, Client) {
        let store = Arc::new(SqliteStore::open(dir.join("herald.db")).unwrap());
        let queue = Arc::new(MemoryQueue::default());
        let client = Client::new(store.clone(), queue.clone());
        (store, queue, client)
    }

    /// A command handler from config, run by a real worker: payload on
    /// stdin, metadata in the environment, every event once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_runs_a_command_from_config_for_every_event() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let doc = format!(
            "[handlers.resize]\nkind = \"command\"\nprogram = \"/bin/sh\"\n\
             args = [\"-c\", 'printf \"%s %s\\n\" \"$HERALD_EVENT_ID\" \"$(cat)\" >> \"$1\"', \"sh\", {log:?}]\n"
        );
        let handler = parse_handlers(&doc).unwrap()["resize"]
            .build("resize", &RunWatch::none())
            .unwrap();
        let (store, queue, client) = embedded(dir.path());
        let worker = Worker::builder(store, queue)
            .raw_handler("resize", handler)
            .start();
        const N: usize = 10;
        let mut emitted = HashSet::new();
        for n in 0..N {
            let e = client
                .emit_json(
                    "acme",
                    "resize",
                    &format!(r#"{{"n":{n}}}"#),
                    EmitOptions::default(),
                )
                .await
                .unwrap();
            emitted.insert(e.id().to_string());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while worker.stats().done < N as u64 {
            assert!(Instant::now() < deadline, "stuck: {:?}", worker.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        worker.shutdown(Duration::from_secs(5)).await;
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), N, "{text}");
        let ids: HashSet<String> = lines
            .iter()
            .map(|l| l.split_once(' ').unwrap().0.to_string())
            .collect();
        assert_eq!(ids, emitted);
        let payloads: BTreeSet<&str> = lines.iter().map(|l| l.split_once(' ').unwrap().1).collect();
        assert!(payloads.contains(r#"{"n":7}"#), "{text}");
        let stored: u64 = client
            .handler_counts(&herald::CountsQuery::totals())
            .await
            .unwrap()
            .iter()
            .map(|c| c.total())
            .sum();
        assert_eq!(stored, 0);
    }

    /// Shutdown past its grace period cancels the run: the worker drops the
    /// handler, the command's whole group dies, and the event is kept with
    /// its attempt given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_shutdown_past_its_grace_kills_the_commands_group_and_keeps_the_event() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let config = HandlerConfig::Command(CommandConfig {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                r#"echo $$ > "$1"; sleep 1000 & echo $! >> "$1"; sleep 1000"#.into(),
                "sh".into(),
                pids.display().to_string(),
            ],
            timeout: Duration::from_secs(600),
            snooze_exit_code: 75,
            snooze_for: Duration::from_secs(30),
            fail_exit_code: None,
        });
        let (store, queue, client) = embedded(dir.path());
        let worker = Worker::builder(store, queue)
            .raw_handler("resize", config.build("resize", &RunWatch::none()).unwrap())
            .start();
        let id = client
            .emit_json("acme", "resize", "{}", EmitOptions::default())
            .await
            .unwrap()
            .id();
        let deadline = Instant::now() + Duration::from_secs(30);
        let running: Vec<i32> = loop {
            let text = std::fs::read_to_string(&pids).unwrap_or_default();
            let found: Vec<i32> = text
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
            if found.len() == 2 {
                break found;
            }
            assert!(Instant::now() < deadline, "the command never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let report = worker.shutdown(Duration::from_millis(200)).await;
        assert_eq!(report.cancelled, 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while running.iter().any(|&p| super::command::tests::alive(p)) {
            assert!(
                Instant::now() < deadline,
                "the command's processes outlived the run"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let event = client.get(id).await.unwrap().expect("the event is kept");
        assert_eq!(event.state, herald::EventState::Pending);
        assert_eq!(event.attempt, 0, "the attempt is given back");
    }
}
