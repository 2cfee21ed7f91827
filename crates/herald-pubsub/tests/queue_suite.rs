//! herald's queue conformance suite on the Pub/Sub emulator, on a fresh
//! topic and subscription per test.

use herald_pubsub::testing::fresh_pubsub_queue;

herald::queue_suite!(fresh_pubsub_queue);
