//! Support for the end-to-end tests: per-test databases on the real servers, a business ledger
//! that participants keep through the barrier, and helpers to run real gRPC servers on port 0.

// Test support, not an API: the missing_docs lint is for the SDK crates.
#![allow(missing_docs)]

pub mod auth;
pub mod barrier;
pub mod brokers;
pub mod browser;
pub mod chaos;
pub mod coordinator;
pub mod db;
pub mod idempotency;
pub mod ledger;
pub mod net;
pub mod outbox;
pub mod participant;
pub mod pki;
pub mod python;
pub mod rpc;
pub mod scrape;
pub mod shop;
pub mod webhook;
pub mod world;

/// A uniform number in [0, 1) determined by `seed` and `key` alone (FNV-1a, then SplitMix64),
/// so a seeded run draws the same numbers for the same keys whatever the timing.
pub fn seeded_unit(seed: u64, key: &[u8]) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h >> 11) as f64 / (1u64 << 53) as f64
}
