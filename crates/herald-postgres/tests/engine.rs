//! herald's engine conformance suite, end to end through the real worker
//! runtime, on a fresh PostgreSQL schema per test.

use herald_postgres::testing::fresh_pg_store;

herald::engine_suite!(fresh_pg_store);
