//! The dashboard in a real browser: the real `herald serve` on a random
//! port with a temporary SQLite store, driven by `browser/dashboard.mjs`
//! (playwright-core and headless Chromium). Pauses, unpauses and retries
//! through the page, checks the API agrees, and saves a screenshot to
//! `<target>/artifacts/dashboard.png`.
//!
//! Needs `/usr/bin/chromium`, `node`, and `npm ci` in `tests/browser`;
//! `./test.sh` installs them. Without them the test says SKIPPED, and fails
//! when `CI=true`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{sha256_hex, Server};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const OP_TOKEN: &str = "op-token-for-the-dashboard";

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Why the browser test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !Path::new(CHROMIUM).exists() {
        return Some(format!(
            "chromium not installed ({CHROMIUM} is missing; ./test.sh installs it with apt-get)"
        ));
    }
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("node not installed (needed to run playwright-core)".into());
    }
    if !browser_dir().join("node_modules/playwright-core").exists() {
        return Some(format!(
            "playwright-core not installed (run `npm ci` in {}; ./test.sh does)",
            browser_dir().display()
        ));
    }
    None
}

fn skip(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("SKIPPED {test}: {why}");
    let bar = "=".repeat(line.len().min(100));
    // Straight to the process's stderr: the test harness captures eprintln!.
    let _ = writeln!(std::io::stderr(), "\n{bar}\n{line}\n{bar}\n");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{line} (CI=true: the browser test must run)");
    }
}

/// `herald serve` with `config`, a no-op handler `work`, and logs at info.
fn start_server(dir: &Path, config: &Path) -> Server {
    let mut cmd = common::herald(dir);
    cmd.env("HERALD_LOG", "info")
        .args(["serve", "--config"])
        .arg(config)
        .args(["--noop-handler", "work"]);
    Server::start(cmd)
}

async fn call(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(OP_TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("request to herald serve");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn dashboard_in_headless_chromium() {
    if let Some(why) = missing() {
        skip("dashboard_in_headless_chromium", &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "sqlite://{}"
listen = "127.0.0.1:0"
[worker]
concurrency = 4
lease = "5s"
shutdown_grace = "2s"
done_retention = "1h"
[auth]
operator_token_sha256 = "{}"
[handlers.flaky]
kind = "command"
program = "/bin/sh"
args = ["-c", "echo 'smtp.example.com:25: connection refused' >&2; exit 3"]
fail_exit_code = 3
[[subscriptions]]
topic = "user.signup"
handler = "flaky"
"#,
            db.display(),
            sha256_hex(OP_TOKEN),
        ),
    )
    .unwrap();
    let s = start_server(dir.path(), &config);

    // The page and its assets need no token.
    for (path, kind) in [
        ("/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let r = reqwest::get(format!("{}{path}", s.base)).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "GET {path}: {ct}");
    }

    // Dead events for acme/flaky, done ones for acme/work.
    let mut events = Vec::new();
    for i in 0..3 {
        events.push(json!({"tenant": "acme", "handler": "flaky", "payload": {"to": format!("user{i}@example.com")}}));
    }
    for i in 0..5 {
        events.push(json!({"tenant": "acme", "handler": "work", "payload": i}));
    }
    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/v1/events/batch",
        Some(json!({ "events": events })),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let start = Instant::now();
    loop {
        let (status, v) = call(&s, reqwest::Method::GET, "/v1/events?state=dead", None).await;
        assert_eq!(status, 200, "{v}");
        if v["events"].as_array().unwrap().len() == 3 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the flaky events did not go dead: {v}; stderr:\n{}",
            s.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // <target>/tmp is CARGO_TARGET_TMPDIR: the artifacts go next to it.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf();
    let artifacts = target.join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);

    let mut node = Command::new("node")
        .current_dir(browser_dir())
        .arg("dashboard.mjs")
        .arg(&s.base)
        .arg(OP_TOKEN)
        .arg(&shot)
        .spawn()
        .expect("run node");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = node.kill();
            let _ = node.wait();
            panic!(
                "dashboard.mjs did not finish within 180 s; herald's stderr:\n{}",
                s.stderr()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "dashboard.mjs failed ({status}); its output is above; herald's stderr:\n{}",
        s.stderr()
    );
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    eprintln!("dashboard screenshot: {}", shot.display());
}
