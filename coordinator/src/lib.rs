//! The dtx coordinator.
//!
//! Layers, each only using the ones below it:
//! * [`server`] and [`listen`] - the listeners (gRPC, HTTP/JSON, console, metrics) on one
//!   serving path: per-listener connection caps, header and body timeouts, body limits read
//!   as they arrive, draining on shutdown;
//! * [`grpc`] - the `dtx.v1.Coordinator` service: converts requests, calls the engine, maps
//!   errors to gRPC codes in one place;
//! * [`http_api`] - the same services as JSON over HTTP, calling the gRPC implementations;
//! * [`engine`] - TCC and saga semantics, the driver that carries decided work to a terminal
//!   state, recovery of due work;
//! * [`store`] - durable state behind a small trait, group-committed writes, one SQL module
//!   for SQLite, PostgreSQL and MySQL/MariaDB;
//! * [`domain`] - statuses, records, saga plans, backoff: pure logic, no I/O.

// The coordinator is a service, not an embedded library: its public items are the surface the
// end-to-end tests and the bench drive, documented where a reader needs the why (module docs,
// the types a test constructs); the workspace's missing_docs lint is for the SDK crates.
#![allow(missing_docs)]

pub mod admin;
pub mod auth;
pub mod config;
pub mod console;
pub mod domain;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod http_api;
pub mod listen;
pub mod quota;
pub mod server;
pub mod startup;
pub mod store;
pub mod tls;

pub use error::{Error, Result};
