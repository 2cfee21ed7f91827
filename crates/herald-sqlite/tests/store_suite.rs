//! herald's store conformance suite, through the `Store` trait alone, on a
//! fresh SQLite file per test.

use std::sync::Arc;

use herald::testkit::TestStore;
use herald_sqlite::SqliteStore;

async fn fresh_store() -> TestStore {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("herald.db")).expect("open the store");
    TestStore {
        store: Arc::new(store),
        keep: Box::new(dir),
    }
}

herald::store_suite!(fresh_store);
