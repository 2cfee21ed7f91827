//! The queue conformance suite on the in-process queue.
#![cfg(feature = "testkit")]

herald::queue_suite!(herald::testkit::queue::memory_queue);
