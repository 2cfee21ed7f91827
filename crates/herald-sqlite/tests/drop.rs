//! Dropping the last handle ends the writer thread. (Its own test binary, so
//! that no other test's store is counted.)
#![cfg(target_os = "linux")]

use herald::backend::Rules;
use std::time::{Duration, Instant};

use herald_sqlite::SqliteStore;

fn writer_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "herald-sqlite")
        .count()
}

#[tokio::test]
async fn dropping_the_last_handle_ends_the_writer_thread() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(writer_threads(), 0);
    let store = SqliteStore::open(dir.path().join("drop.db")).unwrap();
    let clone = store.clone();
    // The thread names itself once it runs; a served call proves it does.
    assert!(store.rules().await.unwrap().is_empty());
    assert_eq!(writer_threads(), 1);
    drop(store);
    // The clone still works.
    assert!(clone.rules().await.unwrap().is_empty());
    assert_eq!(writer_threads(), 1);
    drop(clone);
    let start = Instant::now();
    while writer_threads() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the writer thread is still running"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
