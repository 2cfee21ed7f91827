//! `herald demo`, run as a user would: the real binary.

use std::process::Command;

fn herald() -> Command {
    Command::new(env!("CARGO_BIN_EXE_herald"))
}

/// The number printed on the summary line that starts with `label`.
fn figure(output: &str, label: &str) -> u64 {
    let line = output
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{output}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number on {line:?}"))
}

#[test]
fn demo_runs_the_mix_and_accounts_for_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let out = herald()
        .args(["demo", "--events", "2000", "--db"])
        .arg(&db)
        .output()
        .expect("run herald demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2000 send_email + 200 sync_crm + 100 reminder + 300 report succeed;
    // 20 charge_card go dead after 3 attempts each.
    assert_eq!(figure(&stdout, "done"), 2600, "{stdout}");
    assert_eq!(figure(&stdout, "dead"), 20, "{stdout}");
    assert_eq!(figure(&stdout, "pending"), 0, "{stdout}");
    // sync_crm fails twice each; charge_card fails twice before its last attempt.
    assert_eq!(figure(&stdout, "retried"), 200 * 2 + 20 * 2, "{stdout}");
    assert!(
        stdout.contains("unpaused report: 300 events re-notified"),
        "{stdout}"
    );
    assert!(db.exists(), "--db keeps the database");
}

#[test]
fn demo_on_a_file_that_is_not_a_herald_database_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.txt");
    std::fs::write(&db, "shopping: eggs, milk\n".repeat(100)).unwrap();
    let out = herald()
        .args(["demo", "--events", "10", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a herald database"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&db).unwrap(),
        "shopping: eggs, milk\n".repeat(100),
        "the file is left untouched"
    );
}

#[test]
fn demo_in_a_missing_directory_says_it_cannot_open_the_store() {
    let out = herald()
        .args(["demo", "--db", "/nonexistent-herald-dir/x.db"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot open the store at /nonexistent-herald-dir/x.db"),
        "{stderr}"
    );
}
