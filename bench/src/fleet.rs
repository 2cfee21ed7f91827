//! A fleet of real `herald serve` worker processes on PostgreSQL + NATS
//! JetStream or Google Pub/Sub (the emulator), for the benchmarks of the
//! distributed deployment (`fleet-drain`, `rescue`).
//!
//! [`Scratch`] makes a fresh PostgreSQL schema (migrated by `herald migrate
//! --store … --schema …`, as an operator would) and names a fresh NATS
//! stream, or Pub/Sub topic and subscription ([`Broker`]); both are removed
//! when it is dropped, also when the benchmark panics. [`Scratch::herald_toml`] writes the configuration the workers
//! share; [`WorkerSpec::spawn`] starts one `herald serve` and
//! [`Launch::listening`] waits for its "listening on" line.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::{MessageLimits, Queue};
use herald_nats::{NatsConfig, NatsQueue};
use herald_postgres::PgStore;
use herald_pubsub::{PubsubConfig, PubsubQueue};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// The PostgreSQL database the benchmarks use by default.
pub const DEFAULT_STORE: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The NATS server the benchmarks use by default.
pub const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";
/// The Pub/Sub emulator the benchmarks use by default.
pub const DEFAULT_PUBSUB: &str = "127.0.0.1:8085";
/// The project of the benchmarks' Pub/Sub topics.
pub const PUBSUB_PROJECT: &str = "herald-bench";

/// The queue a fleet runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broker {
    /// NATS JetStream at this URL.
    Nats(String),
    /// The Pub/Sub emulator at this `HOST:PORT`.
    Pubsub(String),
}

impl Broker {
    /// From `--queue` (`nats` or `pubsub`) and the two addresses.
    pub fn choose(queue: &str, nats: &str, pubsub: &str) -> Broker {
        match queue {
            "nats" => Broker::Nats(nats.to_string()),
            "pubsub" => Broker::Pubsub(pubsub.to_string()),
            other => panic!("--queue {other:?}: write nats or pubsub"),
        }
    }

    /// `nats` or `pubsub`, for reports.
    pub fn label(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::Pubsub(_) => "pubsub",
        }
    }
}

/// A queue on the scratch stream or topic, with what a benchmark may ask
/// its broker besides the [`Queue`] trait.
#[derive(Clone)]
pub enum BenchQueue {
    /// NATS.
    Nats(Arc<NatsQueue>),
    /// Pub/Sub.
    Pubsub(Arc<PubsubQueue>),
}

impl BenchQueue {
    /// The queue.
    pub fn queue(&self) -> Arc<dyn Queue> {
        match self {
            BenchQueue::Nats(q) => q.clone(),
            BenchQueue::Pubsub(q) => q.clone(),
        }
    }

    /// Messages waiting in the stream; `None` where the broker can't say
    /// (the Pub/Sub emulator has no backlog metric).
    pub async fn waiting(&self) -> Option<u64> {
        match self {
            BenchQueue::Nats(q) => {
                let mut stream = q.jetstream().get_stream(&q.config().stream).await.ok()?;
                Some(stream.info().await.ok()?.state.messages)
            }
            BenchQueue::Pubsub(_) => None,
        }
    }

    /// Deliveries not yet acked, over all workers; `None` where the broker
    /// can't say.
    pub async fn unacked(&self) -> Option<usize> {
        match self {
            BenchQueue::Nats(q) => {
                let stream = q.jetstream().get_stream(&q.config().stream).await.ok()?;
                let info = stream.consumer_info(&q.config().consumer).await.ok()?;
                Some(info.num_ack_pending)
            }
            BenchQueue::Pubsub(_) => None,
        }
    }
}

/// The `herald` binary of a release build: `$CARGO_TARGET_DIR/release/herald`
/// (`target/release/herald` without the variable). Build it with
/// `cargo build --release -p herald-server`.
pub fn default_herald() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("release").join("herald")
}

/// The `herald` binary to run: `flag` (`--herald`), or [`default_herald`].
/// Panics, saying how to build it, if it is not there.
pub fn herald_binary(flag: Option<PathBuf>) -> PathBuf {
    let herald = flag.unwrap_or_else(default_herald);
    assert!(
        herald.exists(),
        "{} does not exist: build it with `cargo build --release -p herald-server`, or pass --herald",
        herald.display()
    );
    herald
}

/// A TOML basic string holding `s`.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A fresh PostgreSQL schema and NATS stream (or Pub/Sub topic) of one
/// benchmark run, and a directory for its config files and worker logs.
/// Dropping it drops the schema and deletes the stream or topic; the
/// directory is kept (and its path printed) when dropped during a panic or
/// with `keep_dir`.
pub struct Scratch {
    /// The PostgreSQL URL.
    pub store_url: String,
    /// The queue.
    pub broker: Broker,
    /// The schema's name, which is also the stream's (or topic's).
    pub name: String,
    /// Top-level `herald.toml` keys for the queue, with their TOML values
    /// (`pubsub_max_outstanding`, `notify_max_ids`); `pubsub_…` keys are
    /// written only on Pub/Sub.
    pub queue_keys: Vec<(String, String)>,
    /// Keep the directory (config files, worker logs) after the run.
    pub keep_dir: bool,
    dir: Option<tempfile::TempDir>,
}

impl Scratch {
    /// Names a fresh schema and stream (`herald_bench_LABEL_…`) and migrates
    /// the schema with `herald migrate`. The stream is created by the first
    /// [`NatsQueue`] on it ([`Scratch::queue`], or a worker).
    pub async fn create(herald: &Path, store_url: &str, broker: &Broker, label: &str) -> Scratch {
        let name = format!(
            "herald_bench_{label}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir()
            .expect("a temporary directory");
        let scratch = Scratch {
            store_url: store_url.to_string(),
            broker: broker.clone(),
            name,
            queue_keys: Vec::new(),
            keep_dir: false,
            dir: Some(dir),
        };
        let out = clean_command(herald)
            .args(["migrate", "--store", store_url, "--schema", &scratch.name])
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", herald.display()));
        assert!(
            out.status.success(),
            "herald migrate --schema {} failed ({}): {}",
            scratch.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        scratch
    }

    /// The directory for config files and logs.
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .expect("the directory lives as long as self")
            .path()
    }

    /// A store on the schema, with a pool of `connections`.
    pub async fn store(&self, connections: u32) -> PgStore {
        let options: PgConnectOptions = self.store_url.parse().expect("a PostgreSQL URL");
        PgStore::connect_with(
            PgPoolOptions::new()
                .max_connections(connections)
                .acquire_timeout(Duration::from_secs(10)),
            options,
            &self.name,
        )
        .await
        .expect("connect to the scratch schema")
    }

    /// A queue on the stream, with `AckWait` = `lease` (the workers refuse
    /// a consumer whose `AckWait` is not their lease); or on the topic and
    /// subscription, whose ack deadline follows from the lease.
    pub async fn queue(&self, lease: Duration) -> BenchQueue {
        self.queue_with(lease, MessageLimits::default()).await
    }

    /// [`Scratch::queue`] whose publishers make notifications of at most
    /// `limits` (`ids: 1` is one event per message, as before ADR 0010).
    pub async fn queue_with(&self, lease: Duration, limits: MessageLimits) -> BenchQueue {
        match &self.broker {
            Broker::Nats(url) => BenchQueue::Nats(Arc::new(
                NatsQueue::connect(NatsConfig {
                    message_limits: limits,
                    ..NatsConfig::new(url.clone(), &self.name, lease)
                })
                .await
                .expect("connect to NATS and create the scratch stream"),
            )),
            Broker::Pubsub(host) => BenchQueue::Pubsub(Arc::new(
                PubsubQueue::connect(PubsubConfig {
                    message_limits: limits,
                    ..self.pubsub_config(host, lease)
                })
                .await
                .expect("connect to the Pub/Sub emulator and create the scratch topic"),
            )),
        }
    }

    fn pubsub_config(&self, host: &str, lease: Duration) -> PubsubConfig {
        PubsubConfig {
            emulator: Some(host.to_string()),
            ..PubsubConfig::new(
                PUBSUB_PROJECT,
                &self.name,
                format!("{}-workers", self.name),
                lease,
            )
        }
    }

    /// The `queue` lines of `herald.toml`.
    fn queue_toml(&self) -> String {
        let mut text = match &self.broker {
            Broker::Nats(url) => format!(
                "queue = {}\nnats_stream = {}\n",
                toml_string(url),
                toml_string(&self.name)
            ),
            Broker::Pubsub(_) => format!(
                "queue = {}\n",
                toml_string(&format!(
                    "pubsub://{PUBSUB_PROJECT}/{}?subscription={}-workers",
                    self.name, self.name
                ))
            ),
        };
        // Pub/Sub's keys only go with Pub/Sub: a configuration on another
        // queue refuses them.
        let pubsub = matches!(self.broker, Broker::Pubsub(_));
        for (k, v) in &self.queue_keys {
            if pubsub || !k.starts_with("pubsub_") {
                text.push_str(&format!("{k} = {v}\n"));
            }
        }
        text
    }

    /// A `herald.toml` for a worker on the scratch schema and stream,
    /// listening on a free loopback port without tokens: `worker` holds
    /// `[worker]` keys with their TOML values, `rest` is appended as is
    /// (handler tables).
    pub fn herald_toml(&self, worker: &[(&str, String)], rest: &str) -> String {
        let mut text = format!(
            "store = {}\npg_schema = {}\n{}listen = \"127.0.0.1:0\"\n\n[worker]\n",
            toml_string(&self.store_url),
            toml_string(&self.name),
            self.queue_toml(),
        );
        for (key, value) in worker {
            text.push_str(&format!("{key} = {value}\n"));
        }
        text.push('\n');
        text.push_str(rest);
        text
    }

    /// Writes `text` to `file` in the scratch directory; returns its path.
    pub fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.dir().join(file);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// A worker `name` running `herald serve --config CONFIG ARGS…`, logging
    /// to `NAME.log` in the scratch directory.
    pub fn worker(&self, herald: &Path, name: &str, config: &Path, args: &[&str]) -> WorkerSpec {
        WorkerSpec {
            name: name.to_string(),
            herald: herald.to_path_buf(),
            config: config.to_path_buf(),
            args: args.iter().map(|a| a.to_string()).collect(),
            log: self.dir().join(format!("{name}.log")),
            log_level: None,
            env: match &self.broker {
                Broker::Nats(_) => Vec::new(),
                Broker::Pubsub(host) => vec![("PUBSUB_EMULATOR_HOST".into(), host.clone())],
            },
        }
    }

    async fn remove(store_url: String, broker: Broker, name: String) -> Result<(), String> {
        let mut problems = Vec::new();
        match PgConnection::connect(&store_url).await {
            Ok(mut c) => {
                // The workers' connections close when they die; wait for their locks.
                let sql =
                    format!("SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                if let Err(e) = sqlx::raw_sql(&sql).execute(&mut c).await {
                    problems.push(format!("drop schema {name}: {e}"));
                }
                let _ = c.close().await;
            }
            Err(e) => problems.push(format!("connect to PostgreSQL: {e}")),
        }
        match &broker {
            Broker::Nats(nats_url) => match async_nats::connect(nats_url).await {
                Ok(client) => {
                    let js = async_nats::jetstream::new(client);
                    if let Err(e) = js.delete_stream(&name).await {
                        // No stream is fine: nothing created it.
                        if !e.to_string().contains("not found") {
                            problems.push(format!("delete stream {name}: {e}"));
                        }
                    }
                }
                Err(e) => problems.push(format!("connect to NATS: {e}")),
            },
            Broker::Pubsub(host) => {
                if let Err(e) = herald_pubsub::testing::delete(
                    host,
                    PUBSUB_PROJECT,
                    &name,
                    &format!("{name}-workers"),
                )
                .await
                {
                    problems.push(format!("delete topic {name}: {e}"));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() || self.keep_dir {
            if let Some(dir) = self.dir.take() {
                eprintln!(
                    "config files and worker logs kept in {}",
                    dir.keep().display()
                );
            }
        }
        // Drop may run inside a tokio runtime: do the async work on a thread
        // with a runtime of its own.
        let (store_url, broker, name) = (
            self.store_url.clone(),
            self.broker.clone(),
            self.name.clone(),
        );
        let removed = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(Scratch::remove(store_url, broker, name))
        })
        .join();
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup of {}: {e}", self.name),
            Err(_) => eprintln!("cleanup of {}: the thread panicked", self.name),
        }
    }
}

/// The `herald` command without any `HERALD_…` variable of ours.
fn clean_command(herald: &Path) -> Command {
    let mut c = Command::new(herald);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HERALD_") {
            c.env_remove(k);
        }
    }
    c
}

/// How to start one `herald serve` worker (again, after a kill).
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Its name in reports and its log file's name.
    pub name: String,
    herald: PathBuf,
    config: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// `HERALD_LOG` for the worker (its default is `info`).
    pub log_level: Option<String>,
    /// More environment variables (`PUBSUB_EMULATOR_HOST`).
    pub env: Vec<(String, String)>,
}

impl WorkerSpec {
    /// A worker `name` running `herald serve --config CONFIG`, logging to
    /// `log` (for a deployment without a [`Scratch`], such as SQLite).
    pub fn new(name: &str, herald: &Path, config: &Path, log: &Path) -> WorkerSpec {
        WorkerSpec {
            name: name.to_string(),
            herald: herald.to_path_buf(),
            config: config.to_path_buf(),
            args: Vec::new(),
            log: log.to_path_buf(),
            log_level: None,
            env: Vec::new(),
        }
    }

    /// Starts the process; its stderr is appended to the log file.
    pub fn spawn(&self) -> Launch {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log.display()));
        let mut cmd = clean_command(&self.herald);
        cmd.arg("serve")
            .arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        if let Some(level) = &self.log_level {
            cmd.env("HERALD_LOG", level);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let spawned = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.herald.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line
                    .split("listening on ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send((Instant::now(), addr.to_string()));
                    }
                }
            }
        });
        Launch {
            spec: self.clone(),
            child,
            spawned,
            listening: rx,
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// A started `herald serve` that has not said where it listens yet.
pub struct Launch {
    spec: WorkerSpec,
    child: Child,
    spawned: Instant,
    listening: oneshot::Receiver<(Instant, String)>,
}

impl Launch {
    /// Waits for the "listening on" line; panics, with the log's end, if
    /// the process exits first or `limit` passes.
    pub async fn listening(mut self, limit: Duration) -> Worker {
        let got = tokio::time::timeout(limit, &mut self.listening).await;
        let (at, base) = match got {
            Ok(Ok(line)) => line,
            Ok(Err(_)) => {
                let status = self.child.wait().await;
                panic!(
                    "worker {} exited before listening ({status:?}); its log ends:\n{}",
                    self.spec.name,
                    self.spec.log_tail(30)
                );
            }
            Err(_) => panic!(
                "worker {} did not say it listens within {limit:?}; its log ends:\n{}",
                self.spec.name,
                self.spec.log_tail(30)
            ),
        };
        Worker {
            started_in: at - self.spawned,
            listening_at: at,
            base,
            child: self.child,
            spec: self.spec,
        }
    }
}

/// A running `herald serve` worker process, killed (SIGKILL) when dropped.
pub struct Worker {
    /// How to start it again.
    pub spec: WorkerSpec,
    /// `http://ADDR`, from its "listening on" line.
    pub base: String,
    /// From spawning the process to its "listening on" line.
    pub started_in: Duration,
    /// When its "listening on" line arrived.
    pub listening_at: Instant,
    child: Child,
}

impl Worker {
    /// Starts every spec at once, then waits for each to listen.
    pub async fn start_all(specs: &[WorkerSpec], limit: Duration) -> Vec<Worker> {
        let launches: Vec<Launch> = specs.iter().map(WorkerSpec::spawn).collect();
        let mut workers = Vec::with_capacity(launches.len());
        for l in launches {
            workers.push(l.listening(limit).await);
        }
        workers
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its CPU time so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Option<u64> {
        crate::cpu::process_ticks(&self.pid()?.to_string())
    }

    /// Sends SIGKILL and reaps the process. Returns the instant just
    /// before the signal was sent.
    pub async fn kill(&mut self) -> Instant {
        let at = Instant::now();
        self.child.start_kill().expect("SIGKILL the worker");
        self.child.wait().await.expect("reap the worker");
        at
    }

    /// Its exit status if it has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Panics with `what` and the end of its log if it has exited.
    pub fn check_alive(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{what}: worker {} exited ({status}); its log ends:\n{}",
                self.spec.name,
                self.spec.log_tail(30)
            );
        }
    }

    /// `herald_events_done_total` from its `/metrics`, over all handlers:
    /// runs that ended done and were settled (deleted) in the store.
    pub async fn done(&self, http: &reqwest::Client) -> Result<u64, String> {
        self.metric(http, "herald_events_done_total").await
    }

    /// The sum of a counter or gauge of its `/metrics` over all labels.
    pub async fn metric(&self, http: &reqwest::Client, name: &str) -> Result<u64, String> {
        let text = http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        Ok(text
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(['{', ' ']))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }
}

/// The `q`-quantile (0 to 1) of sorted values, by nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
