//! Support for the end-to-end tests: per-test databases on the real servers, a business ledger
//! that participants keep through the barrier, and helpers to run real gRPC servers on port 0.

pub mod coordinator;
pub mod db;
pub mod idempotency;
pub mod ledger;
pub mod net;
pub mod participant;
pub mod world;
