//! The chaos harness in its short configuration (see `dtx_tests::chaos`; the long run is the
//! `chaos` binary, README "Chaos"). Three coordinator processes on one database, SIGKILLed at
//! random moments, faults at every participant call; every invariant checked at the end.

use dtx_sql::sqlx;
use dtx_tests::chaos::{ChaosConfig, run};

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

fn seed() -> u64 {
    std::env::var("DTX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

fn check(report: Option<dtx_tests::chaos::ChaosReport>) {
    let Some(report) = report else { return };
    println!("{}", report.summary());
    for anomaly in &report.anomalies {
        println!("ANOMALY {anomaly}");
    }
    assert!(report.anomalies.is_empty(), "{}", report.summary());
    assert!(report.kills > 0, "the short run must kill coordinators");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_postgres() {
    check(run::<sqlx::Postgres>(ChaosConfig::short(BIN, seed())).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_short_mariadb() {
    let mut config = ChaosConfig::short(BIN, seed());
    config.transactions = 200;
    check(run::<sqlx::MySql>(config).await);
}
