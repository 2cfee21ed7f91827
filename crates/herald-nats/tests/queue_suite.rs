//! herald's queue conformance suite on NATS JetStream, on a fresh stream per test.

use herald_nats::testing::fresh_nats_queue;

herald::queue_suite!(fresh_nats_queue);
