//! herald's server as a library: the configuration of `herald serve`
//! ([`config`]), its handler kinds, webhook and command ([`runners`]), the
//! server with its HTTP API and dashboard ([`serve`]), and the commands of
//! the `herald` program ([`cli`], [`demo`], [`migrate`]). `main.rs` parses
//! the command line and calls these; a Rust program that embeds herald can
//! call them too.

pub mod cli;
pub mod config;
pub mod demo;
pub mod migrate;
pub mod runners;
pub mod serve;
