//! From the table as written to a checked [`ServeConfig`]: defaults applied,
//! and what serde cannot check, checked.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herald::WorkerConfig;
use herald_postgres::RunCommits;

use herald::schedule::{ScheduleDef, ScheduleSource};

use super::file::{AuthSection, Dur, FileConfig, ScheduleSection, WorkerSection};
use super::queue::resolve_queue;
use super::sources::Origins;
use super::{
    AuthConfig, ConfigError, ServeConfig, StoreLocation, DEFAULT_GRACE, DEFAULT_LISTEN,
    DEFAULT_MAX_BATCH, DEFAULT_PG_ACQUIRE_TIMEOUT, DEFAULT_PG_MAX_CONNECTIONS, DEFAULT_STORE,
    MIN_REQUEST_BYTES,
};

/// An error about a key, named as written and with its origin.
type Refuse<'a> = dyn Fn(&str, String) -> ConfigError + 'a;

/// Applies defaults and checks what serde can't.
pub(super) fn resolve(mut raw: FileConfig, origins: &Origins) -> Result<ServeConfig, ConfigError> {
    let err = |key: &str, message: String| origins.invalid(key, message);
    let store =
        parse_store(raw.store.as_deref().unwrap_or(DEFAULT_STORE)).map_err(|m| err("store", m))?;
    let pg_schema = raw
        .pg_schema
        .take()
        .unwrap_or_else(|| herald_postgres::DEFAULT_SCHEMA.to_string());
    let (worker, worker_named, shutdown_grace) =
        resolve_worker(std::mem::take(&mut raw.worker), &err)?;
    let queue = resolve_queue(raw.take_queue(), worker.lease, &err)?;
    let limits = resolve_limits(&raw, &err)?;
    let auth = resolve_auth(std::mem::take(&mut raw.auth), origins)?;
    if auth.is_open() && !limits.listen.ip().is_loopback() {
        return Err(err(
            "listen",
            format!("{} is not a loopback address, and no API token is configured: without a token herald serve only listens on loopback (127.0.0.1 or [::1]). Set auth.operator_token_sha256 (or HERALD_OPERATOR_TOKEN_SHA256) to the SHA-256 of a token, or listen on 127.0.0.1", limits.listen),
        ));
    }
    let schedules = resolve_schedules(
        std::mem::take(&mut raw.schedules),
        limits.max_payload_bytes,
        &err,
    )?;
    for name in raw.handlers.keys() {
        herald::client::check_name("handler", name)
            .map_err(|e| err(&format!("handlers.{name}"), e.to_string()))?;
    }
    let run_limits = resolve_run_limits(&mut raw.handlers, &err)?;
    let pg_run_commits = match raw.pg_run_commits.as_deref() {
        None => RunCommits::default(),
        Some(text) => text.parse().map_err(|m| err("pg_run_commits", m))?,
    };
    let mut subscriptions = Vec::with_capacity(raw.subscriptions.len());
    for (i, s) in std::mem::take(&mut raw.subscriptions)
        .into_iter()
        .enumerate()
    {
        let subscription = herald::Subscription {
            tenant: s.tenant,
            topic: s.topic,
            handler: s.handler,
        };
        herald::client::check_subscription(&subscription)
            .map_err(|e| err(&format!("subscriptions[{i}]"), e.to_string()))?;
        subscriptions.push(subscription);
    }
    Ok(ServeConfig {
        store,
        pg_schema,
        queue,
        pg_max_connections: limits.pg_max_connections,
        pg_acquire_timeout: limits.pg_acquire_timeout,
        pg_run_commits,
        listen: limits.listen,
        max_payload_bytes: limits.max_payload_bytes,
        max_request_bytes: limits.max_request_bytes,
        max_batch: limits.max_batch,
        notify_linger: limits.notify_linger,
        notify_publishes: limits.notify_publishes,
        group_commit_writes: limits.group_commit_writes,
        emit_timeout: limits.emit_timeout,
        notify_wait: limits.notify_wait,
        idempotency_window: limits.idempotency_window,
        worker,
        worker_named,
        shutdown_grace,
        auth,
        handlers: raw.handlers,
        run_limits,
        subscriptions,
        schedules,
        file: None,
    })
}

/// `[handlers.NAME.limit]`, taken out of each handler's table (the rest
/// is the handler's own): `running`, `per_tenant`, `per_key` (runs at
/// once of every run of the handler, of each tenant's, of each
/// concurrency key's) and `rate`, `rate_per_tenant`, `rate_per_key`
/// (starts per period of the same: `"10/1s"` or `{ starts = 10, period =
/// "1s", burst = 5 }`).
fn resolve_run_limits(
    handlers: &mut std::collections::BTreeMap<String, toml::Value>,
    err: &Refuse<'_>,
) -> Result<Vec<herald::Limit>, ConfigError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct LimitSection {
        running: Option<u32>,
        per_tenant: Option<u32>,
        per_key: Option<u32>,
        rate: Option<RateSection>,
        rate_per_tenant: Option<RateSection>,
        rate_per_key: Option<RateSection>,
    }
    let mut out = Vec::new();
    for (name, value) in handlers.iter_mut() {
        let Some(section) = value.as_table_mut().and_then(|t| t.remove("limit")) else {
            continue;
        };
        let key = format!("handlers.{name}.limit");
        let section: LimitSection = section
            .try_into()
            .map_err(|e: toml::de::Error| err(&key, e.message().to_string()))?;
        let scopes = [
            (
                "running",
                "rate",
                section.running,
                section.rate,
                herald::LimitScope::Handler,
            ),
            (
                "per_tenant",
                "rate_per_tenant",
                section.per_tenant,
                section.rate_per_tenant,
                herald::LimitScope::Tenant { tenant: None },
            ),
            (
                "per_key",
                "rate_per_key",
                section.per_key,
                section.rate_per_key,
                herald::LimitScope::Key { key: None },
            ),
        ];
        for (field, rate_field, running, rate, scope) in scopes {
            if running.is_none() && rate.is_none() {
                continue;
            }
            let rate = match rate {
                None => None,
                Some(r) => Some(
                    r.resolve()
                        .map_err(|m| err(&format!("{key}.{rate_field}"), m))?,
                ),
            };
            let limit = herald::Limit {
                handler: name.clone(),
                scope,
                running,
                rate,
            };
            let bad_running = running.is_some_and(|n| n == 0 || n > herald::limit::MAX_RUNNING);
            let named = if bad_running || rate.is_none() {
                field
            } else {
                rate_field
            };
            limit
                .check()
                .map_err(|m| err(&format!("{key}.{named}"), m))?;
            out.push(limit);
        }
    }
    Ok(out)
}

/// A rate as written: `"10/1s"` (starts per period, no burst), or a table.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum RateSection {
    Text(String),
    Table {
        starts: u32,
        period: String,
        #[serde(default)]
        burst: Option<u32>,
    },
}

impl RateSection {
    fn resolve(self) -> Result<herald::limit::Rate, String> {
        match self {
            RateSection::Text(text) => parse_rate(&text, None),
            RateSection::Table {
                starts,
                period,
                burst,
            } => parse_rate(&format!("{starts}/{period}"), burst),
        }
    }
}

/// `"STARTS/PERIOD"` (`"10/1s"`, `"600/1m"`) and a burst (default 1).
pub fn parse_rate(text: &str, burst: Option<u32>) -> Result<herald::limit::Rate, String> {
    let (starts, period) = text
        .split_once('/')
        .ok_or_else(|| format!("rate {text:?}: write STARTS/PERIOD, as \"10/1s\" or \"600/1m\""))?;
    let starts: u32 = starts.trim().parse().map_err(|_| {
        format!(
            "rate {text:?}: {:?} is not a number of starts",
            starts.trim()
        )
    })?;
    let period = super::parse_duration(period.trim()).map_err(|m| format!("rate {text:?}: {m}"))?;
    Ok(herald::limit::Rate {
        starts,
        period,
        burst: burst.unwrap_or(1),
    })
}

/// The pool's, the listener's and the requests' limits.
struct Limits {
    pg_max_connections: u32,
    pg_acquire_timeout: Duration,
    listen: SocketAddr,
    max_payload_bytes: usize,
    max_request_bytes: usize,
    max_batch: usize,
    notify_linger: Duration,
    notify_publishes: usize,
    group_commit_writes: usize,
    emit_timeout: Duration,
    notify_wait: Duration,
    idempotency_window: Duration,
}

fn resolve_limits(raw: &FileConfig, err: &Refuse<'_>) -> Result<Limits, ConfigError> {
    let pg_max_connections = match raw.pg_max_connections {
        None => DEFAULT_PG_MAX_CONNECTIONS,
        Some(n) => match u32::try_from(n) {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(err(
                    "pg_max_connections",
                    format!("{n} is not a pool size: write a whole number from 1 ({DEFAULT_PG_MAX_CONNECTIONS} is the default)"),
                ))
            }
        },
    };
    let pg_acquire_timeout = match raw.pg_acquire_timeout {
        None => DEFAULT_PG_ACQUIRE_TIMEOUT,
        Some(Dur(d)) if d.is_zero() => {
            return Err(err(
                "pg_acquire_timeout",
                "must be more than 0s (10s is the default)".into(),
            ))
        }
        Some(Dur(d)) => d,
    };
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.trim().parse().map_err(|_| {
        err(
            "listen",
            format!("{listen_text:?} is not an IP address and port; write it like \"127.0.0.1:7878\", \"[::1]:7878\" or \"0.0.0.0:7878\""),
        )
    })?;

    let max_payload_bytes = positive(
        raw.max_payload_bytes,
        herald::client::DEFAULT_MAX_PAYLOAD as u64,
    )
    .map_err(|m| err("max_payload_bytes", m))?;
    let max_request_bytes = positive(
        raw.max_request_bytes,
        (max_payload_bytes as u64 + (64 << 10)).max(MIN_REQUEST_BYTES as u64),
    )
    .map_err(|m| err("max_request_bytes", m))?;
    if max_request_bytes <= max_payload_bytes {
        return Err(err(
            "max_request_bytes",
            format!("{max_request_bytes} is not more than max_payload_bytes ({max_payload_bytes}): a request must hold a whole payload and its fields"),
        ));
    }
    let max_batch =
        positive(raw.max_batch, DEFAULT_MAX_BATCH as u64).map_err(|m| err("max_batch", m))?;
    let notify_linger = match raw.notify_linger {
        None => herald::client::DEFAULT_NOTIFY_LINGER,
        Some(Dur(d)) if d <= Duration::from_secs(1) => d,
        Some(Dur(d)) => {
            return Err(err(
                "notify_linger",
                format!("{d:?} is too long: every emit waits this long before its notifications are published; write up to 1s (1ms is the default, 0s publishes at once)"),
            ))
        }
    };
    let notify_publishes = match raw.notify_publishes {
        None => herald::client::DEFAULT_NOTIFY_PUBLISHES,
        Some(n @ 1..=64) => n as usize,
        Some(n) => {
            return Err(err(
                "notify_publishes",
                format!("{n} is out of range: write 1 to 64 publishes in flight before emits' notifications wait to be grouped ({} is the default)", herald::client::DEFAULT_NOTIFY_PUBLISHES),
            ))
        }
    };
    let group_commit_writes = match raw.group_commit_writes {
        None => herald::client::DEFAULT_GROUP_COMMIT_WRITES,
        Some(n) if n <= 256 => n as usize,
        Some(n) => {
            return Err(err(
                "group_commit_writes",
                format!("{n} is too many: each write holds a pool connection; write up to 256 ({} is the default, 0 writes each emit on its own)", herald::client::DEFAULT_GROUP_COMMIT_WRITES),
            ))
        }
    };
    let emit_timeout = match raw.emit_timeout {
        None => herald::client::DEFAULT_EMIT_TIMEOUT,
        Some(Dur(d)) if !d.is_zero() && d <= Duration::from_secs(600) => d,
        Some(Dur(d)) => {
            return Err(err(
                "emit_timeout",
                format!(
                    "{d:?} is out of range: write more than 0s and up to 10m (5s is the default)"
                ),
            ))
        }
    };
    let notify_wait = match raw.notify_wait {
        None => herald::client::DEFAULT_NOTIFY_WAIT,
        Some(Dur(d)) if d <= Duration::from_secs(10) => d,
        Some(Dur(d)) => {
            return Err(err(
                "notify_wait",
                format!("{d:?} is too long: an emit whose event is stored waits this long for a broker that is away; write up to 10s (250ms is the default)"),
            ))
        }
    };
    if notify_wait >= emit_timeout {
        return Err(err(
            "notify_wait",
            format!("{notify_wait:?} is not shorter than emit_timeout ({emit_timeout:?}): an emit's bound holds its wait for the publish"),
        ));
    }
    let idempotency_window = match raw.idempotency_window {
        None => herald::DEFAULT_IDEMPOTENCY_WINDOW,
        Some(Dur(d)) if !d.is_zero() => d,
        Some(Dur(_)) => {
            return Err(err(
                "idempotency_window",
                "must be more than 0s (24h is the default)".into(),
            ))
        }
    };
    Ok(Limits {
        pg_max_connections,
        pg_acquire_timeout,
        listen,
        max_payload_bytes,
        max_request_bytes,
        max_batch,
        notify_linger,
        notify_publishes,
        group_commit_writes,
        emit_timeout,
        notify_wait,
        idempotency_window,
    })
}

/// The worker's settings, whether it was named, and the shutdown grace.
fn resolve_worker(
    w: WorkerSection,
    err: &Refuse<'_>,
) -> Result<(WorkerConfig, bool, Duration), ConfigError> {
    let mut worker = WorkerConfig::default();
    let too_large = |key: &str, n: u64| err(key, format!("{n} is too large"));
    if let Some(n) = w.concurrency {
        worker.concurrency = usize::try_from(n).map_err(|_| too_large("worker.concurrency", n))?;
    }
    if let Some(n) = w.batch {
        worker.batch = usize::try_from(n).map_err(|_| too_large("worker.batch", n))?;
    }
    if let Some(n) = w.claim_ahead {
        worker.claim_ahead =
            Some(usize::try_from(n).map_err(|_| too_large("worker.claim_ahead", n))?);
    }
    if let Some(Dur(d)) = w.lease {
        worker.lease = d;
    }
    if let Some(Dur(d)) = w.sweep_every {
        worker.sweep_every = d;
    }
    if let Some(Dur(d)) = w.sweep_quiet {
        worker.sweep_quiet = d;
    }
    if let Some(Dur(d)) = w.dead_retention {
        worker.dead_retention = d;
    }
    worker.done_retention = w.done_retention.map(|Dur(d)| d);
    if let Some(r) = w.reconcile {
        worker.reconcile = r;
    }
    if let Some(s) = w.schedules {
        worker.schedules = s;
    }
    if let Some(Dur(d)) = w.schedule_every {
        worker.schedule_every = d;
    }
    if let Some(Dur(d)) = w.schedule_grace {
        worker.schedule_grace = d;
    }
    let worker_named = w.name.is_some();
    if let Some(name) = w.name {
        herald::client::check_name("worker.name", &name)
            .map_err(|e| err("worker.name", e.to_string()))?;
        worker.name = name;
    }
    let shutdown_grace = w.shutdown_grace.map(|Dur(d)| d).unwrap_or(DEFAULT_GRACE);
    let retry = &mut worker.policy.retry;
    if let Some(Dur(d)) = w.retry.base {
        retry.base = d;
    }
    if let Some(Dur(d)) = w.retry.max {
        retry.max = d;
    }
    if let Some(f) = w.retry.factor {
        retry.factor = f;
    }
    if let Some(j) = w.retry.jitter {
        retry.jitter = j;
    }
    // The worker's own bounds, with its messages: its `policy.retry.*`
    // fields are `[worker.retry]` here.
    worker.validate().map_err(|e| {
        let key = format!("worker.{}", e.field().trim_start_matches("policy."));
        err(&key, e.reason())
    })?;
    Ok((worker, worker_named, shutdown_grace))
}

/// `[[schedules]]`: each checked as the API checks one (errors name
/// `schedules[i].FIELD`), and no `(tenant, name)` twice.
fn resolve_schedules(
    raw: Vec<ScheduleSection>,
    max_payload: usize,
    err: &Refuse<'_>,
) -> Result<Vec<ScheduleDef>, ConfigError> {
    let mut out: Vec<ScheduleDef> = Vec::with_capacity(raw.len());
    for (i, s) in raw.into_iter().enumerate() {
        let key = |field: &str| format!("schedules[{i}].{field}");
        let payload = match s.payload {
            None => None,
            Some(v) => Some(
                serde_json::to_string(&v)
                    .map_err(|e| err(&key("payload"), format!("cannot be written as JSON: {e}")))?,
            ),
        };
        let max_attempts = match s.max_attempts {
            None => None,
            Some(n) => Some(
                u32::try_from(n)
                    .map_err(|_| err(&key("max_attempts"), format!("{n} is too large")))?,
            ),
        };
        let def = ScheduleDef {
            cron: s.cron,
            every: s.every.map(|Dur(d)| d),
            timezone: s.timezone,
            payload,
            max_attempts,
            missed: s.missed,
            missed_cap: s.missed_cap,
            ..ScheduleDef::new(s.tenant, s.name, s.handler, ScheduleSource::Config)
        };
        def.build(herald::Millis(0), max_payload).map_err(|e| {
            let message = e.to_string();
            let reason = message
                .strip_prefix(&format!("{}: ", e.field()))
                .unwrap_or(&message)
                .to_string();
            err(&key(e.field()), reason)
        })?;
        if let Some(j) = out
            .iter()
            .position(|o| o.tenant == def.tenant && o.name == def.name)
        {
            return Err(err(
                &key("name"),
                format!(
                    "{:?} is also schedules[{j}]'s name for tenant {:?}: a name is unique per tenant",
                    def.name, def.tenant
                ),
            ));
        }
        out.push(def);
    }
    Ok(out)
}

fn positive(value: Option<u64>, default: u64) -> Result<usize, String> {
    match value {
        None => Ok(default as usize),
        Some(0) => Err("must be at least 1".to_string()),
        Some(n) => usize::try_from(n).map_err(|_| format!("{n} is too large")),
    }
}

fn parse_store(text: &str) -> Result<StoreLocation, String> {
    let text = text.trim();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return Ok(StoreLocation::Postgres(text.to_string()));
    }
    if let Some(path) = text.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err("\"sqlite://\" names no file; write it like \"sqlite://herald.db\" or \"sqlite:///var/lib/herald/herald.db\"".into());
        }
        return Ok(StoreLocation::Sqlite(PathBuf::from(path)));
    }
    if let Some((scheme, _)) = text.split_once("://") {
        return Err(format!(
            "{scheme:?} is not a store this build knows; use \"sqlite://PATH\" or \"postgres://USER@HOST/DB\""
        ));
    }
    if text.is_empty() {
        return Err("is empty; use \"sqlite://PATH\" or \"postgres://USER@HOST/DB\"".into());
    }
    Ok(StoreLocation::Sqlite(PathBuf::from(text)))
}

fn resolve_auth(raw: AuthSection, origins: &Origins) -> Result<AuthConfig, ConfigError> {
    let mut auth = AuthConfig::default();
    if let Some(hex) = raw.operator_token_sha256 {
        let key = "auth.operator_token_sha256";
        auth.operator = Some(digest(&hex).map_err(|m| origins.invalid(key, m))?);
    }
    for (tenant, hex) in raw.tenants {
        let key = format!("auth.tenants.{tenant}");
        let bad = |m: String| origins.invalid(&key, m);
        herald::client::check_name("tenant", &tenant).map_err(|e| bad(e.to_string()))?;
        let d = digest(&hex).map_err(bad)?;
        if auth.operator == Some(d) {
            return Err(bad(
                "is the operator token's digest: give the tenant a token of its own".into(),
            ));
        }
        if let Some((other, _)) = auth.tenants.iter().find(|(_, t)| *t == d) {
            return Err(bad(format!(
                "is also tenant {other:?}'s digest: every tenant needs a token of its own"
            )));
        }
        auth.tenants.push((tenant, d));
    }
    Ok(auth)
}

/// Reads a SHA-256 digest written as 64 hex digits.
fn digest(hex_text: &str) -> Result<[u8; 32], String> {
    let t = hex_text.trim();
    let how = "write the token's SHA-256 as 64 hex digits, e.g. the output of `printf %s \"$TOKEN\" | sha256sum`, not the token itself";
    if t.len() != 64 {
        return Err(format!("is {} characters long; {how}", t.len()));
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(t, &mut out).map_err(|_| format!("is not hexadecimal; {how}"))?;
    Ok(out)
}
