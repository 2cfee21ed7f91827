//! The operator's CLI through the real binary: a `herald serve` on a
//! temporary SQLite store with tokens, driven by `herald emit`, `events`,
//! `pause`/`unpause`/`block`/`unblock` and `stats`, exit statuses included.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;

use common::{sha256_hex, Server};
use serde_json::Value;

const OP_TOKEN: &str = "op-token";
const ACME_TOKEN: &str = "acme-token";

use common::herald;

/// Starts `herald serve` on a random port with an operator token, a tenant token
/// for `acme`, a no-op handler `work` and a command handler `fail`
/// that fails for good. Handler `held` is not run here: its events stay.
fn start_server(dir: &Path) -> Server {
    start_server_with(dir, "")
}

/// [`start_server`] with `extra` appended to its herald.toml.
fn start_server_with(dir: &Path, extra: &str) -> Server {
    let config = dir.join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "sqlite://{}"
listen = "127.0.0.1:0"
[worker]
lease = "5s"
shutdown_grace = "2s"
[auth]
operator_token_sha256 = "{}"
[auth.tenants]
acme = "{}"
[handlers.fail]
kind = "command"
program = "/bin/sh"
args = ["-c", "echo broken >&2; exit 3"]
fail_exit_code = 3
{}
"#,
            dir.join("events.db").display(),
            sha256_hex(OP_TOKEN),
            sha256_hex(ACME_TOKEN),
            extra
        ),
    )
    .unwrap();
    let mut cmd = herald(dir);
    cmd.args(["serve", "--config"])
        .arg(&config)
        .args(["--noop-handler", "work"])
        .env("HERALD_LOG", "info");
    Server::start(cmd)
}

/// What one CLI run did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.stdout))
    }

    /// Asserts success and returns stdout.
    fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "stderr: {}\nstdout: {}",
            self.stderr, self.stdout
        );
        &self.stdout
    }
}

/// Runs `herald ARGS` against `url` with `token` (HERALD_URL, HERALD_TOKEN),
/// feeding `stdin`.
fn run_with(dir: &Path, url: &str, token: Option<&str>, args: &[&str], stdin: Option<&str>) -> Run {
    let mut cmd = herald(dir);
    cmd.args(args).env("HERALD_URL", url);
    if let Some(t) = token {
        cmd.env("HERALD_TOKEN", t);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run herald");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

struct Cli<'a> {
    dir: &'a Path,
    server: &'a Server,
}

impl Cli<'_> {
    /// As the operator.
    fn run(&self, args: &[&str]) -> Run {
        run_with(self.dir, &self.server.base, Some(OP_TOKEN), args, None)
    }

    fn stdin(&self, args: &[&str], stdin: &str) -> Run {
        run_with(
            self.dir,
            &self.server.base,
            Some(OP_TOKEN),
            args,
            Some(stdin),
        )
    }

    fn token(&self, token: &str, args: &[&str]) -> Run {
        run_with(self.dir, &self.server.base, Some(token), args, None)
    }

    /// Emits and returns the id.
    fn emit(&self, args: &[&str]) -> String {
        let mut all = vec!["emit"];
        all.extend_from_slice(args);
        let id = self.run(&all).ok().trim().to_string();
        assert_eq!(id.len(), 36, "an id: {id:?}");
        id
    }

    fn show(&self, id: &str) -> Value {
        self.run(&["events", "show", id, "--json"]).json()
    }

    /// Waits until the event is in `state`.
    fn wait_state(&self, id: &str, state: &str) -> Value {
        let start = Instant::now();
        loop {
            let e = self.show(id);
            if e["state"] == state && e["running"] == false {
                return e;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "event {id} not {state}: {e}\nserver stderr:\n{}",
                self.server.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn data_rows(table: &str) -> Vec<&str> {
    let mut lines = table.lines();
    let header = lines.next().expect("a header");
    assert!(header.starts_with("ID "), "{table}");
    lines.collect()
}

#[test]
fn every_command_against_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path());
    let cli = Cli {
        dir: dir.path(),
        server: &server,
    };

    // ---- emit: argument, stdin, idempotency, options ------------------
    let first = cli.emit(&["acme", "held", r#"{"n": 0}"#]);
    let piped = cli
        .stdin(
            &[
                "emit",
                "acme",
                "held",
                "-",
                "--key",
                "k1",
                "--max-attempts",
                "3",
            ],
            "{\"n\": 1, \"s\": \"é\\n\"}\n",
        )
        .ok()
        .trim()
        .to_string();
    assert_eq!(piped.len(), 36, "{piped:?}");
    let again = cli.run(&["emit", "acme", "held", "{}", "--key", "k1"]);
    assert_eq!(again.ok().trim(), format!("{piped} existing"));
    let again = cli.run(&["emit", "acme", "held", "{}", "--key", "k1", "--json"]);
    assert_eq!(again.json()["created"], false);
    assert_eq!(again.json()["id"], piped.as_str());
    let delayed = cli.emit(&["acme", "held", "[1,2]", "--delay", "1h"]);
    let mut held = vec![first.clone(), piped.clone(), delayed.clone()];
    for n in 3..6 {
        held.push(cli.emit(&["acme", "held", &format!("{{\"n\": {n}}}")]));
    }
    let defaulted = cli.emit(&["acme", "held"]);
    held.push(defaulted.clone());
    assert_eq!(cli.show(&defaulted)["payload"], serde_json::json!({}));

    // ---- show ----------------------------------------------------------
    let e = cli.show(&piped);
    assert_eq!(e["payload"], serde_json::json!({"n": 1, "s": "é\n"}));
    assert_eq!(e["max_attempts"], 3);
    assert_eq!(e["idempotency_key"], "k1");
    assert_eq!(e["state"], "pending");
    let shown = cli.run(&["events", "show", &piped]).ok().to_string();
    for needle in [
        format!("id                {piped}"),
        "tenant            acme".to_string(),
        "state             pending".to_string(),
        "attempt           0 of 3".to_string(),
        "idempotency_key   k1".to_string(),
        r#"payload           {"n":1,"s":"é\n"}"#.to_string(),
    ] {
        assert!(shown.contains(&needle), "{needle:?} not in\n{shown}");
    }
    assert!(cli.show(&delayed)["run_at"].as_str().unwrap() > e["run_at"].as_str().unwrap());

    // ---- ls: table, --json, paging --------------------------------------
    let out = cli.run(&["events", "ls", "--handler", "held"]);
    let table = out.ok();
    let rows = data_rows(table);
    assert_eq!(rows.len(), held.len(), "{table}");
    for (row, id) in rows.iter().zip(&held) {
        assert!(row.starts_with(id.as_str()), "{row} is not {id}");
        assert!(row.contains("acme"), "{row}");
        assert!(row.contains("pending"), "{row}");
    }
    // Columns line up: every row's state starts under STATE.
    let col = table.lines().next().unwrap().find("STATE").unwrap();
    for row in &rows {
        assert_eq!(&row[col..col + 7], "pending", "{table}");
    }
    assert!(out.stderr.is_empty(), "one page: {}", out.stderr);

    let v = cli
        .run(&["events", "ls", "--handler", "held", "--json"])
        .json();
    assert_eq!(v["events"].as_array().unwrap().len(), held.len());
    assert_eq!(v["next"], Value::Null);

    let page = cli.run(&["events", "ls", "--handler", "held", "--limit", "2"]);
    assert_eq!(data_rows(page.ok()).len(), 2);
    assert!(
        page.stderr.contains(&format!("--after {piped}")),
        "{}",
        page.stderr
    );
    let page2 = cli.run(&[
        "events",
        "ls",
        "--handler",
        "held",
        "--limit",
        "2",
        "--after",
        &piped,
        "--json",
    ]);
    let ids: Vec<String> = page2.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, held[2..4]);

    let all = cli
        .run(&[
            "events",
            "ls",
            "--handler",
            "held",
            "--limit",
            "2",
            "--all",
            "--json",
        ])
        .json();
    let ids: Vec<String> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, held, "--all follows the cursor over 4 pages");
    assert_eq!(all["next"], Value::Null);
    let all = cli.run(&[
        "events",
        "ls",
        "--tenant",
        "acme",
        "--handler",
        "held",
        "--limit",
        "3",
        "--all",
    ]);
    assert_eq!(data_rows(all.ok()).len(), held.len());
    assert!(all.stderr.is_empty(), "{}", all.stderr);
    let none = cli
        .run(&["events", "ls", "--state", "dead", "--json"])
        .json();
    assert_eq!(none["events"], serde_json::json!([]));

    // ---- pause, unpause, block, unblock -----------------------------------
    let v = cli.run(&["pause", "acme", "held", "--json"]).json();
    assert_eq!(v, serde_json::json!({"added": true}));
    assert_eq!(
        cli.run(&["pause", "acme", "held"]).ok().trim(),
        "acme/held: already paused"
    );
    assert_eq!(
        cli.run(&["block", "acme", "held"]).ok().trim(),
        "acme/held: blocked"
    );
    let v = cli.run(&["unpause", "acme", "held", "--json"]).json();
    assert_eq!(v["removed"], true);
    assert_eq!(
        v["still_held"],
        serde_json::json!({"paused": false, "blocked": true})
    );
    assert_eq!(v["notified"], 0, "still blocked: nothing to notify");
    let out = cli.run(&["pause", "acme", "held"]);
    assert_eq!(out.ok().trim(), "acme/held: paused");
    let out = cli.run(&["unblock", "acme", "held"]);
    assert_eq!(
        out.ok(),
        "acme/held: unblocked\nstill held: paused\nre-notified: 0 events\n"
    );
    let v = cli.run(&["unpause", "acme", "held", "--json"]).json();
    assert_eq!(
        v["still_held"],
        serde_json::json!({"paused": false, "blocked": false})
    );
    let notified = v["notified"].as_u64().unwrap();
    assert!(notified >= 1, "released events are re-notified: {v}");
    let out = cli.run(&["unpause", "acme", "held"]);
    assert!(
        out.ok()
            .starts_with("acme/held: was not paused\nstill held: no\nre-notified: "),
        "{}",
        out.stdout
    );

    // ---- a dead event: retry, conflict, rm --------------------------------
    let dead = cli.emit(&["acme", "fail", r#"{"x": 1}"#]);
    let e = cli.wait_state(&dead, "dead");
    assert!(e["last_error"].as_str().unwrap().contains("broken"), "{e}");
    let out = cli.run(&["events", "ls", "--state", "dead"]);
    let rows = data_rows(out.ok());
    assert_eq!(rows.len(), 1, "{}", out.stdout);
    assert!(
        rows[0].starts_with(&dead) && rows[0].contains("failed for good"),
        "{}",
        rows[0]
    );
    // Keep it pending after the retry.
    cli.run(&["pause", "acme", "fail"]).ok();
    assert_eq!(
        cli.run(&["events", "retry", &dead]).ok().trim(),
        format!("{dead}: pending again")
    );
    let e = cli.show(&dead);
    assert_eq!(
        (e["state"].as_str(), e["attempt"].as_u64()),
        (Some("pending"), Some(0))
    );
    let conflict = cli.run(&["events", "retry", &dead]);
    assert_eq!(conflict.code, 4, "{}", conflict.stderr);
    assert!(
        conflict.stderr.contains("is pending, not dead")
            && conflict.stderr.contains("409")
            && conflict.stderr.contains("not_dead"),
        "{}",
        conflict.stderr
    );
    let v = cli.run(&["unpause", "acme", "fail", "--json"]).json();
    assert_eq!(v["notified"], 1, "{v}");
    cli.wait_state(&dead, "dead");
    let v = cli.run(&["events", "retry", &dead, "--json"]).json();
    assert_eq!(v["state"], "pending");
    cli.wait_state(&dead, "dead");
    // ---- show: the error history, one line per failed attempt ---------------
    let errors = cli.show(&dead)["errors"].as_array().unwrap().clone();
    assert_eq!(errors.len(), 3, "{errors:?}");
    let shown = cli.run(&["events", "show", &dead]).ok().to_string();
    let lines: Vec<&str> = shown
        .lines()
        .skip_while(|l| !l.starts_with("errors "))
        .take(3)
        .collect();
    assert_eq!(lines.len(), 3, "{shown}");
    for (n, (line, e)) in lines.iter().zip(&errors).enumerate() {
        let error = e["error"].as_str().unwrap();
        assert!(
            error.ends_with("command exited with status 3: broken"),
            "{error}"
        );
        let want = format!(
            "attempt {} at {}: {error}",
            e["attempt"],
            e["at"].as_str().unwrap()
        );
        let want = if n == 0 {
            format!("errors            {want}")
        } else {
            format!("                  {want}")
        };
        assert_eq!(*line, want, "{shown}");
    }
    assert!(
        cli.run(&["events", "show", &piped])
            .ok()
            .contains("\nerrors            none\n"),
        "an event that never failed"
    );
    assert_eq!(
        cli.run(&["events", "rm", &dead]).ok().trim(),
        format!("{dead}: deleted")
    );
    for args in [
        ["events", "show", &dead],
        ["events", "rm", &dead],
        ["events", "retry", &dead],
    ] {
        let gone = cli.run(&args);
        assert_eq!(gone.code, 3, "{args:?}: {}", gone.stderr);
        assert!(
            gone.stderr.contains("no event") && gone.stderr.contains("404"),
            "{}",
            gone.stderr
        );
    }
    let v = cli.run(&["events", "rm", &first, "--json"]).json();
    assert_eq!(v, serde_json::json!({"id": first, "deleted": true}));

    // ---- a handler that runs, and stats ------------------------------------
    let done = cli.emit(&["acme", "work", "{}"]);
    let start = Instant::now();
    while cli.run(&["events", "show", &done]).code != 3 {
        assert!(start.elapsed() < Duration::from_secs(30), "work never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = cli.run(&["stats", "--json"]).json();
    let counts = v["by_handler"].as_array().unwrap();
    let pending = |c: &serde_json::Value| {
        ["waiting", "running", "delayed", "held"]
            .iter()
            .map(|k| c[*k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(
        counts.iter().any(|c| c["tenant"] == "acme"
            && c["handler"] == "held"
            && pending(c) == held.len() as u64 - 1),
        "{v}"
    );
    assert_eq!(v["handlers"], serde_json::json!(["fail", "work"]));
    assert!(
        v["recent"]["started_per_second"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let out = cli.run(&["stats"]);
    let text = out.ok();
    let line = text
        .lines()
        .find(|l| l.contains("held"))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    // TENANT HANDLER WAITING RUNNING DELAYED HELD DEAD DONE (no rule).
    assert_eq!(words.len(), 8, "{text}");
    assert_eq!(words[..2], ["acme", "held"], "{text}");
    let n = |i: usize| words[i].parse::<usize>().unwrap();
    assert_eq!(n(4), 1, "the one emitted with --delay 1h: {text}");
    assert_eq!(n(2) + n(4), held.len() - 1, "{text}");
    assert_eq!(
        words[3..8].iter().filter(|w| **w == "0").count(),
        4,
        "{text}"
    );
    let v = cli.run(&["stats", "--tenant", "nobody", "--json"]).json();
    assert_eq!(v["by_handler"], serde_json::json!([]), "{v}");
    let only = cli.run(&["stats", "--tenant", "acme"]);
    assert!(only.ok().contains("acme "), "{}", only.stdout);
    assert!(
        text.contains("handlers run by this server: fail, work"),
        "{text}"
    );
    assert!(
        text.contains("STARTED") && text.contains("\nwork "),
        "{text}"
    );

    // ---- exit statuses -------------------------------------------------------
    let missing = cli.run(&["events", "show", "01a22755-26ad-71cc-976b-d91ce3bba1f6"]);
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    let bad_id = cli.run(&["events", "show", "not-an-id"]);
    assert_eq!(bad_id.code, 2, "{}", bad_id.stderr);
    assert!(bad_id.stderr.contains("400"), "{}", bad_id.stderr);

    let bad = cli.token("wrong", &["stats"]);
    assert_eq!(bad.code, 5, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("401") && bad.stderr.contains("invalid_token"),
        "{}",
        bad.stderr
    );
    let none = run_with(dir.path(), &server.base, None, &["events", "ls"], None);
    assert_eq!(none.code, 5, "{}", none.stderr);
    assert!(none.stderr.contains("missing_token"), "{}", none.stderr);
    let tenant = cli.token(ACME_TOKEN, &["block", "acme", "held"]);
    assert_eq!(tenant.code, 5, "{}", tenant.stderr);
    assert!(tenant.stderr.contains("403"), "{}", tenant.stderr);
    let other = cli.token(ACME_TOKEN, &["events", "ls", "--tenant", "beta"]);
    assert_eq!(other.code, 5, "{}", other.stderr);
    // The tenant token works on its own tenant, the flag overriding the variable.
    let own = run_with(
        dir.path(),
        &server.base,
        Some("wrong"),
        &["events", "ls", "--token", ACME_TOKEN, "--json"],
        None,
    );
    assert_eq!(
        own.json()["events"].as_array().unwrap().len(),
        held.len() - 1
    );

    let malformed = cli.run(&["emit", "acme", "held", "{bad"]);
    assert_eq!(malformed.code, 2, "{}", malformed.stderr);
    assert!(
        malformed.stderr.contains("not valid JSON"),
        "{}",
        malformed.stderr
    );
    let malformed = cli.stdin(&["emit", "acme", "held", "-"], "{\"a\": 1} trailing");
    assert_eq!(malformed.code, 2, "{}", malformed.stderr);
    let empty = cli.stdin(&["emit", "acme", "held", "-"], "");
    assert_eq!(empty.code, 2, "{}", empty.stderr);
    let delay = cli.run(&["emit", "acme", "held", "{}", "--delay", "soon"]);
    assert_eq!(delay.code, 2, "{}", delay.stderr);
    assert!(
        delay.stderr.contains("is not a duration") && delay.stderr.contains("422"),
        "{}",
        delay.stderr
    );
    let run_at = cli.run(&["emit", "acme", "held", "{}", "--run-at", "tomorrow"]);
    assert_eq!(run_at.code, 2, "{}", run_at.stderr);
    assert!(
        run_at.stderr.contains("RFC 3339") && run_at.stderr.contains("422"),
        "{}",
        run_at.stderr
    );
    let both = cli.run(&[
        "emit",
        "acme",
        "held",
        "{}",
        "--run-at",
        "2099-01-01T00:00:00Z",
        "--delay",
        "1h",
    ]);
    assert_eq!(both.code, 2, "{}", both.stderr);
    let attempts = cli.run(&["emit", "acme", "held", "{}", "--max-attempts", "0"]);
    assert_eq!(attempts.code, 2, "{}", attempts.stderr);
    let usage = cli.run(&["events", "ls", "--state", "asleep"]);
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    let limit = cli.run(&["events", "ls", "--limit", "5000"]);
    assert_eq!(limit.code, 2, "{}", limit.stderr);
    assert!(limit.stderr.contains("limit"), "{}", limit.stderr);
    let url = cli.run(&["stats", "--url", "not a url"]);
    assert_eq!(url.code, 2, "{}", url.stderr);
    // Nothing was emitted by the failures.
    let v = cli.run(&["events", "ls", "--json"]).json();
    assert_eq!(v["events"].as_array().unwrap().len(), held.len() - 1);
}

#[test]
fn a_server_that_is_down_exits_6_naming_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    for args in [
        vec!["stats"],
        vec!["emit", "acme", "work", "{}"],
        vec!["events", "ls"],
        vec!["pause", "acme", "work"],
    ] {
        let out = run_with(dir.path(), &url, Some(OP_TOKEN), &args, None);
        assert_eq!(out.code, 6, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!("cannot connect to {url}"))
                && out.stderr.contains("herald serve"),
            "{}",
            out.stderr
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn help_documents_the_exit_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let out = herald(dir.path()).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for line in [
        "0  success",
        "2  usage error or bad input",
        "3  not found",
        "4  conflict",
        "5  auth",
        "6  server unreachable",
    ] {
        assert!(help.contains(line), "{line:?} not in\n{help}");
    }
    for command in [
        "emit", "events", "pause", "unpause", "block", "unblock", "stats",
    ] {
        assert!(
            help.contains(&format!("  {command} ")),
            "{command} not in\n{help}"
        );
    }
}

#[test]
fn topics_from_the_file_and_the_cli_fan_out_and_the_file_s_go_when_it_drops_them() {
    let dir = tempfile::tempdir().unwrap();
    let declared = "[[subscriptions]]\ntopic = \"user.signup\"\nhandler = \"work\"\n";
    let server = start_server_with(dir.path(), declared);
    let cli = Cli {
        dir: dir.path(),
        server: &server,
    };
    let list = cli.run(&["topics", "list"]);
    assert!(
        list.ok().contains("user.signup") && list.stdout.contains("work"),
        "{}",
        list.stdout
    );
    // A tenant subscribes its own handler; every tenant's is the operator's.
    let own = cli.token(
        ACME_TOKEN,
        &[
            "topics",
            "subscribe",
            "user.signup",
            "held",
            "--tenant",
            "acme",
        ],
    );
    assert!(own.ok().contains("subscribed"), "{}", own.stdout);
    let all = cli.token(ACME_TOKEN, &["topics", "subscribe", "user.signup", "held"]);
    assert_eq!(all.code, 5, "{}", all.stderr);
    let subs = cli.run(&["topics", "subscribers", "acme", "user.signup"]);
    assert_eq!(subs.ok().lines().collect::<Vec<_>>(), ["held", "work"]);
    // The emit: one event per subscriber; the held one stays, with its topic.
    let out = cli.token(
        ACME_TOKEN,
        &[
            "topics",
            "emit",
            "acme",
            "user.signup",
            r#"{"user":7}"#,
            "--json",
        ],
    );
    let v = out.json();
    let copies = v["events"].as_array().unwrap();
    assert_eq!(copies.len(), 2, "{v}");
    let held = copies.iter().find(|c| c["handler"] == "held").unwrap();
    let e = cli.show(held["id"].as_str().unwrap());
    assert_eq!(e["topic"], "user.signup", "{e}");
    let shown = cli.run(&["events", "show", held["id"].as_str().unwrap()]);
    assert!(
        shown
            .ok()
            .lines()
            .any(|l| l.starts_with("topic") && l.ends_with("user.signup")),
        "{}",
        shown.stdout
    );
    assert_eq!(e["payload"], serde_json::json!({"user": 7}));
    let table = cli.run(&["topics", "emit", "acme", "user.signup"]);
    assert!(table.ok().starts_with("HANDLER"), "{}", table.stdout);
    // No subscriber: exit 2, the server's message, nothing stored.
    let none = cli.run(&["topics", "emit", "acme", "nobody.listens"]);
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(
        none.stderr.contains("no_subscribers") || none.stderr.contains("no handler is subscribed"),
        "{}",
        none.stderr
    );
    // Restarted without the file's subscription: it goes, the CLI's stays.
    drop(server);
    let server = start_server(dir.path());
    let cli = Cli {
        dir: dir.path(),
        server: &server,
    };
    let v = cli.run(&["topics", "list", "--json"]).json();
    assert_eq!(
        v["subscriptions"],
        serde_json::json!([{"tenant": "acme", "topic": "user.signup", "handler": "held"}])
    );
    let gone = cli.run(&[
        "topics",
        "unsubscribe",
        "user.signup",
        "held",
        "--tenant",
        "acme",
    ]);
    assert!(gone.ok().contains("unsubscribed"), "{}", gone.stdout);
}

#[test]
fn schedules_are_added_listed_paused_resumed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path());
    let cli = Cli {
        dir: dir.path(),
        server: &server,
    };
    assert_eq!(cli.run(&["schedules", "ls"]).ok().trim(), "no schedules");
    let added = cli.run(&[
        "schedules",
        "add",
        "acme",
        "nightly",
        "--handler",
        "work",
        "--cron",
        "0 30 2 * * *",
        "--timezone",
        "Europe/Paris",
        "--payload",
        r#"{"kind":"daily"}"#,
    ]);
    let out = added.ok();
    assert!(out.contains("cron 0 30 2 * * *"), "{out}");
    assert!(
        out.contains("T02:30:00+0"),
        "the next occurrence in Paris: {out}"
    );
    cli.run(&[
        "schedules",
        "add",
        "acme",
        "tick",
        "--handler",
        "work",
        "--every",
        "1h",
    ])
    .ok();
    let ls = cli.run(&["schedules", "ls"]);
    let rows = schedule_rows(ls.ok());
    assert_eq!(rows.len(), 2, "{}", ls.stdout);
    assert!(
        rows[0].contains("nightly") && rows[0].contains("active"),
        "{rows:?}"
    );
    assert!(rows[1].contains("every 1h"), "{rows:?}");
    let paused = cli.run(&["schedules", "pause", "acme", "nightly"]);
    assert!(paused.ok().contains("paused"), "{}", paused.stdout);
    let json = cli
        .run(&["schedules", "ls", "--tenant", "acme", "--json"])
        .json();
    assert_eq!(json["schedules"][0]["paused"], true);
    cli.run(&["schedules", "resume", "acme", "nightly"]).ok();
    // A tenant's token sees its own.
    let own = cli.token(ACME_TOKEN, &["schedules", "ls", "--json"]).json();
    assert_eq!(own["schedules"].as_array().unwrap().len(), 2);
    // Bad input: exit 2 with the field named; a missing one: 3.
    let bad = cli.run(&[
        "schedules",
        "add",
        "acme",
        "x",
        "--handler",
        "work",
        "--cron",
        "61 * * * *",
    ]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("cron:"), "{}", bad.stderr);
    let zone = cli.run(&[
        "schedules",
        "add",
        "acme",
        "x",
        "--handler",
        "work",
        "--every",
        "1m",
        "--timezone",
        "Nowhere",
    ]);
    assert_eq!(zone.code, 2, "{}", zone.stderr);
    assert!(zone.stderr.contains("timezone:"), "{}", zone.stderr);
    assert!(cli
        .run(&["schedules", "rm", "acme", "nightly"])
        .ok()
        .contains("deleted"));
    let gone = cli.run(&["schedules", "rm", "acme", "nightly"]);
    assert_eq!(gone.code, 3, "{}", gone.stderr);
    assert_eq!(schedule_rows(cli.run(&["schedules", "ls"]).ok()).len(), 1);
}

fn schedule_rows(table: &str) -> Vec<&str> {
    let mut lines = table.lines();
    let header = lines.next().expect("a header");
    assert!(header.starts_with("TENANT "), "{table}");
    lines.collect()
}
