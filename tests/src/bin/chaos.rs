//! The chaos harness, long runs by hand:
//!
//! ```text
//! cargo build --release -p dtx-tests --bins
//! ./target/release/chaos --store postgres --count 10000 --kill-every 2s --seed 42
//! ```
//!
//! It starts coordinator processes from the `test-coordinator` binary next to this one (or
//! `--coordinator-bin`), prints its seed first and one summary line last (transactions, kills,
//! anomalies per fault class), and exits non-zero on any anomaly (notices are printed, see `Anomaly::is_notice`).

use std::time::Duration;

use clap::Parser;
use dtx_proto::duration::Human;
use dtx_sql::sqlx;
use dtx_tests::chaos::{ChaosConfig, Classes, default_rates, run};

#[derive(Parser)]
struct Args {
    /// postgres or mariadb.
    #[arg(long, default_value = "postgres")]
    store: String,
    /// Transactions to run.
    #[arg(long, default_value_t = 2000)]
    count: usize,
    /// Stop starting transactions after this long.
    #[arg(long, default_value = "1h")]
    duration: Human,
    /// Replays a run (random if not given).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 3)]
    coordinators: usize,
    /// Mean interval between coordinator kills; `0s` disables kills.
    #[arg(long, default_value = "2500ms")]
    kill_every: Human,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Fault classes besides the base mix: `all`, `none`, or a list of `slow` (a), `skew`
    /// (b), `status` (c), `reorder` (d), `abandon` (e).
    #[arg(long, default_value = "all")]
    classes: String,
    /// The skewed instance's clock offset (libfaketime syntax).
    #[arg(long, default_value = "+30s")]
    skew: String,
    /// The coordinators' lease.
    #[arg(long, default_value = "1s")]
    lease: Human,
    /// TLS and mTLS on every hop (initiator, coordinators, the participant).
    #[arg(long)]
    tls: bool,
    /// Auth on: bearer tokens, signed branch calls the participant verifies.
    #[arg(long)]
    auth: bool,
    /// The participant answers `BranchBatch` UNIMPLEMENTED (every call arrives alone).
    #[arg(long)]
    no_batches: bool,
    /// The coordinator binary (default: `test-coordinator` next to this one).
    #[arg(long)]
    coordinator_bin: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(rand::random);
    println!("chaos: seed {seed}");
    let bin = args.coordinator_bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("own path")
            .with_file_name("test-coordinator")
    });
    if !bin.exists() {
        eprintln!(
            "{} is missing: run `cargo build --release -p dtx-tests --bins` first",
            bin.display()
        );
        std::process::exit(2);
    }
    let mut classes = match Classes::parse(&args.classes) {
        Ok(classes) => classes,
        Err(e) => {
            eprintln!("--classes: {e}");
            std::process::exit(2);
        }
    };
    if let Some(skew) = &mut classes.skew {
        skew.offset = args.skew.clone();
    }
    let config = ChaosConfig {
        seed,
        transactions: args.count,
        duration: args.duration.0,
        concurrency: args.concurrency,
        coordinators: args.coordinators,
        kill_every: (!args.kill_every.0.is_zero()).then_some(args.kill_every.0),
        rates: default_rates(),
        settle_within: Duration::from_secs(300),
        coordinator_bin: bin.display().to_string(),
        accounts: 10,
        classes,
        lease_ms: args.lease.0.as_millis() as u64,
        tls: args
            .tls
            .then(|| std::sync::Arc::new(dtx_tests::chaos::ChaosTls::new())),
        auth: args
            .auth
            .then(|| std::sync::Arc::new(dtx_tests::chaos::ChaosAuth::new())),
        batches: !args.no_batches,
    };
    let report = match args.store.as_str() {
        "postgres" => run::<sqlx::Postgres>(config).await,
        "mariadb" | "mysql" => run::<sqlx::MySql>(config).await,
        other => {
            eprintln!("--store must be postgres or mariadb, not {other}");
            std::process::exit(2);
        }
    };
    let Some(report) = report else {
        eprintln!("the database is unreachable");
        std::process::exit(2);
    };
    report.print();
    std::process::exit(if report.failures().next().is_none() {
        0
    } else {
        1
    });
}
