//! herald's store conformance suite, through the `Store` trait alone, on a
//! fresh PostgreSQL schema per test.

use herald_postgres::testing::fresh_pg_store;

herald::store_suite!(fresh_pg_store);
