//! herald's engine conformance suite on PostgreSQL and NATS JetStream
//! together: a fresh schema and a fresh stream per rig, through the real
//! worker runtime (messages of many events, a kill in the middle of one,
//! pauses, retries, the reconciler), as on the in-process queue.

use herald_nats::testing::fresh_rig_queue;
use herald_postgres::testing::fresh_pg_store;

herald::engine_suite!(fresh_pg_store, queue = fresh_rig_queue);
