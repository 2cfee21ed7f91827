//! herald's engine conformance suite on PostgreSQL and the Pub/Sub
//! emulator together: a fresh schema and a fresh topic and subscription
//! per rig, through the real worker runtime.

use herald_postgres::testing::fresh_pg_store;
use herald_pubsub::testing::fresh_rig_queue;

herald::engine_suite!(fresh_pg_store, queue = fresh_rig_queue);
