//! The chaos harness in its short configuration (see `dtx_tests::chaos`; the long run is the
//! `chaos` binary, README "Chaos"). Three coordinator processes on one database (one of them
//! under a skewed clock), SIGKILLed at random moments and while slow calls are in flight,
//! faults at every participant call, status-only answers, callers that go away mid-call; every
//! invariant checked at the end.
//!
//! `DTX_CHAOS_SEED` replays a run; `DTX_CHAOS_COORDINATOR_BIN` runs another coordinator binary
//! (e.g. one built from an older commit, to see the harness find what was fixed since).

use dtx_sql::sqlx;
use dtx_tests::chaos::{ChaosConfig, ChaosReport, Classes, run};

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// One run at a time: each starts three coordinators with 1 s leases, and four runs at once on
/// a small CI machine starve them past their lease renewals (a takeover of an owner too slow to
/// renew is the lease working, not the exactly-once fault this harness looks for).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn seed() -> u64 {
    std::env::var("DTX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// The short configuration with the given fault classes.
fn config(classes: &str, transactions: usize) -> ChaosConfig {
    let bin = std::env::var("DTX_CHAOS_COORDINATOR_BIN").unwrap_or_else(|_| BIN.to_string());
    let mut config = ChaosConfig::short(&bin, seed());
    config.classes = Classes::parse(classes).unwrap();
    config.transactions = transactions;
    config
}

fn check(report: Option<ChaosReport>) {
    let Some(report) = report else { return };
    report.print();
    assert!(report.failures().next().is_none(), "{}", report.summary());
    assert!(report.kills > 0, "the short run must kill coordinators");
}

/// Classes a (slow calls in flight at a kill, short deadlines), b (a skewed instance), c
/// (status-only answers) and e (callers that go away mid-call), with the base mix.
const FIXED: &str = "slow,skew,status,abandon";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_postgres() {
    let _one = ONE_AT_A_TIME.lock().await;
    check(run::<sqlx::Postgres>(config(FIXED, 600)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_mariadb() {
    let _one = ONE_AT_A_TIME.lock().await;
    check(run::<sqlx::MySql>(config(FIXED, 400)).await);
}

/// SQLite: one coordinator (the file is its own), killed and restarted; no skew (one instance
/// has nobody to disagree with).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_sqlite() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("slow,status,abandon", 250);
    config.coordinators = 1;
    config.concurrency = 8;
    check(run::<sqlx::Sqlite>(config).await);
}

/// The short run with TLS and mTLS on every hop: kills, restarts and faults change nothing
/// of exactly-once when every call is encrypted and every caller presents a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_tls() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("slow,status", 300);
    config.tls = Some(std::sync::Arc::new(dtx_tests::chaos::ChaosTls::new()));
    check(run::<sqlx::Postgres>(config).await);
}

/// Auth on every hop: initiators' bearer tokens, branch calls signed by the coordinators and
/// checked by the bank before its barrier, across kills and every fault class.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_auth() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("slow,status", 300);
    config.auth = Some(std::sync::Arc::new(dtx_tests::chaos::ChaosAuth::new()));
    check(run::<sqlx::Postgres>(config).await);
}

/// Class d: a Cancel delivered after the coordinator's Confirm (and a Confirm after a Cancel)
/// must be refused without effect by the barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_reorder() {
    let _one = ONE_AT_A_TIME.lock().await;
    check(run::<sqlx::Postgres>(config("reorder", 300)).await);
    check(run::<sqlx::MySql>(config("reorder", 200)).await);
}
