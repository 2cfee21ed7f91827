//! What herald's benchmark binaries share: CPU accounting ([`cpu`]) and a
//! fleet of real `herald serve` worker processes on PostgreSQL + NATS
//! JetStream ([`fleet`]).

pub mod cpu;
pub mod fleet;
