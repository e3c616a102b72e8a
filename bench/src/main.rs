//! `dtx-bench`: completed global transactions per second, latency, store commits per
//! transaction and coordinator memory, each workload measured against the raw single-insert
//! commit rate of the same database in the same run. See BENCHMARKS.md.
//!
//! The coordinator runs as a child process (this executable in `coordinator` mode, the real
//! server code); the participants and the closed-loop clients run in this process.

// A measuring tool, not an API: the missing_docs lint is for the SDK crates.
#![allow(missing_docs)]

/// With `--features dhat-heap`, every allocation is tracked (see `coordinator::serve`).
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

mod baseline;
mod coordinator;
mod cpu;
mod database;
mod load;
mod memory;
mod participants;
mod report;
mod security;
mod stats;
mod tls;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use dtx_sdk::client::Coordinator;
use dtx_sdk::sql::sqlx;

use crate::coordinator::CoordinatorProcess;
use crate::database::{BenchDatabase, Store};
use crate::load::Measured;
use crate::report::{Report, Row, StoreReport};
use crate::workload::{Targets, Workload};

/// Everything that can stop a bench run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Setup(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("{0}")]
    Sdk(#[from] dtx_sdk::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Measures the dtx coordinator against the raw commit rate of its database.
#[derive(Debug, Parser)]
#[command(name = "dtx-bench")]
struct Args {
    /// Stores to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["sqlite", "postgres", "mysql"])]
    stores: Vec<Store>,
    /// Closed-loop client counts to sweep.
    #[arg(long, value_delimiter = ',', default_values = ["1", "8", "32", "128"])]
    clients: Vec<usize>,
    /// Workloads to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Measured seconds per workload and client count.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Unmeasured warm-up seconds before each measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Transactions held in flight for the memory figure (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    memory_tx: usize,
    /// An existing PostgreSQL database to connect through; the bench creates `dtx_bench`.
    #[arg(
        long,
        env = "DTX_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres_url: String,
    /// An existing MySQL/MariaDB database to connect through; the bench creates `dtx_bench`.
    #[arg(
        long,
        env = "DTX_BENCH_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    mysql_url: String,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/dtx-bench/results.json")]
    out: PathBuf,
    /// Also run every workload with TLS and mTLS on every hop (initiator, coordinator,
    /// participants; certificates made at run time), after the plain-text sweep at the same
    /// client counts: rows named `<workload>+tls`, against the same baselines.
    #[arg(long)]
    tls: bool,
    /// Also run every workload with auth on (the initiators' JWT checked on every coordinator
    /// call, every branch call signed and verified by the participants), after the
    /// plain-text sweep: rows named `<workload>+auth`, against the same baselines.
    #[arg(long)]
    auth: bool,
    /// Also run every workload with every branch call sent alone (`--branch-batch 1`), after
    /// the plain-text sweep: rows named `<workload>-unbatched`, the A/B arm of batched calls.
    #[arg(long)]
    unbatched: bool,
    /// A few seconds per store to check the bench works (2 clients, 1 s per workload, 200
    /// transactions in flight); exits non-zero on any error.
    #[arg(long)]
    smoke: bool,
}

/// Connections of the participants' and the baseline's pools: PostgreSQL allows 100 by
/// default, and the coordinator holds 16.
pub const MAX_POOL: usize = 32;

fn main() -> Result<(), Error> {
    // `dtx-bench coordinator <coordinator flags>`: the coordinator under test.
    let mut argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("coordinator") {
        argv.remove(1);
        return coordinator::serve(argv.into_iter());
    }
    let mut args = Args::parse();
    if args.smoke {
        args.clients = vec![2];
        args.seconds = 1.0;
        args.warmup = 0.2;
        args.memory_tx = args.memory_tx.min(200);
    }
    if args.workloads.is_empty() {
        args.workloads = Workload::ALL.to_vec();
    }
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> Result<(), Error> {
    let mut report = Report {
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: report::Machine::read(),
        seconds_per_workload: args.seconds,
        stores: Vec::new(),
    };
    println!(
        "dtx-bench: {} cpus ({}), load {}; {} s per workload after {} s warm-up",
        report.machine.cpus,
        report.machine.cpu_model,
        report.machine.load_average,
        args.seconds,
        args.warmup
    );
    for &store in &args.stores {
        let admin = match store {
            Store::Sqlite => "",
            Store::Postgres => &args.postgres_url,
            Store::Mysql => &args.mysql_url,
        };
        report.stores.push(bench_store(&args, store, admin).await?);
        write(&args.out, &report)?;
    }
    println!("results: {}", args.out.display());
    let errors: u64 = report
        .stores
        .iter()
        .flat_map(|s| {
            let rows = s
                .rows
                .iter()
                .map(|r| r.errors + u64::from(r.completed == 0));
            rows.chain(s.memory.iter().map(|m| m.errors))
        })
        .sum();
    if args.smoke && errors > 0 {
        return Err(Error::Setup(format!(
            "smoke run: {errors} failed transactions or empty workloads"
        )));
    }
    Ok(())
}

fn write(path: &PathBuf, report: &Report) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(report)?)?;
    Ok(())
}

async fn bench_store(args: &Args, store: Store, admin: &str) -> Result<StoreReport, Error> {
    let db = BenchDatabase::create(store, admin).await?;
    let settings = db.settings().await?;
    println!(
        "\n== {store:?}: {}",
        settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let plain = security::Security::default();
    let (noop, gate) = participants::serve_noop(&plain).await?;
    gate.open();
    let (rows, local) = serve_rows(store, &db.business_url, &plain).await?;
    let targets = Arc::new(Targets { noop, rows, local });
    let (warmup, window) = (
        Duration::from_secs_f64(args.warmup),
        Duration::from_secs_f64(args.seconds),
    );

    let process = CoordinatorProcess::start(&db.store_url, &plain).await?;
    let client = process.client().await?;
    let harness = Harness {
        store,
        process: &process,
        client: &client,
        targets: &targets,
        warmup,
        window,
    };
    println!("{}", report::HEADER);
    let mut rows = Vec::new();
    let mut baselines = Vec::new();
    for &clients in &args.clients {
        let raw = baseline::raw_inserts(store, &db.raw_url, clients, warmup, window);
        let (raw, raw_cpu) = harness.charged(raw).await?;
        let noop = baseline::noop_calls(&targets.noop, clients, warmup, window);
        let (noop, noop_cpu) = harness.charged(noop).await?;
        let floor = Floor {
            raw_insert: raw_cpu,
            noop_call: noop_cpu,
        };
        for (name, m, cpu) in [
            ("raw-insert", &raw, raw_cpu),
            ("noop-grpc", &noop, noop_cpu),
        ] {
            let mut r = row(store, clients, name, m, raw.per_second());
            r.cpu_per_tx = Some(cpu);
            println!("{}", r.line());
            rows.push(r);
        }
        for &w in &args.workloads {
            let r = harness.measure(clients, w, &raw, &floor).await?;
            println!("{}", r.line());
            if let Some(e) = &r.first_error {
                println!("    first error: {e}");
            }
            rows.push(r);
        }
        baselines.push((clients, raw, floor));
    }
    let commit_to_confirmed = workload::commit_to_confirmed(&client, &targets.noop, 200)
        .await
        .map_err(Error::Setup)?;
    println!(
        "tcc commit -> both confirms delivered (1 client, 200 tx): p50 {:.2} ms, p99 {:.2} ms",
        commit_to_confirmed.p50_ms, commit_to_confirmed.p99_ms
    );
    process.stop().await?;

    let sweeps = [
        (
            args.tls,
            security::Security::tls as fn() -> std::io::Result<_>,
        ),
        (args.auth, security::Security::auth),
        (args.unbatched, security::Security::unbatched),
    ];
    for (_, secure) in sweeps.into_iter().filter(|(on, _)| *on) {
        let security = secure()?;
        let (noop, secure_gate) = participants::serve_noop(&security).await?;
        secure_gate.open();
        let (rows_url, local) = serve_rows(store, &db.business_url, &security).await?;
        let targets = Arc::new(Targets {
            noop,
            rows: rows_url,
            local,
        });
        let process = CoordinatorProcess::start(&db.store_url, &security).await?;
        let client = process.client().await?;
        let harness = Harness {
            store,
            process: &process,
            client: &client,
            targets: &targets,
            warmup,
            window,
        };
        for (clients, raw, floor) in &baselines {
            for &w in &args.workloads {
                let mut r = harness.measure(*clients, w, raw, floor).await?;
                // Named once per workload for the whole run (a bench process, not a server).
                r.workload =
                    Box::leak(format!("{}{}", w.name(), security.suffix()).into_boxed_str());
                println!("{}", r.line());
                if let Some(e) = &r.first_error {
                    println!("    first error: {e}");
                }
                rows.push(r);
            }
        }
        process.stop().await?;
    }

    let mut memory = Vec::new();
    // With --unbatched, the memory figures of the unbatched arm too (`tcc-unbatched`).
    let mut arms = vec![plain];
    if args.unbatched {
        arms.push(security::Security::unbatched()?);
    }
    for arm in arms.iter().filter(|_| args.memory_tx > 0) {
        // `tcc-nowait`: the clients commit without waiting for phase two.
        for kind in ["saga", "tcc", "tcc-nowait"] {
            // A fresh process: the figure is what in-flight work costs, not what earlier
            // sweeps left in the allocator.
            let process = CoordinatorProcess::start(&db.store_url, arm).await?;
            let client = process.client().await?;
            let (n, noop) = (args.memory_tx, targets.noop.as_str());
            let name: &'static str = Box::leak(format!("{kind}{}", arm.suffix()).into_boxed_str());
            let figure = if kind == "saga" {
                memory::measure(name, &process, &gate, n, 1, memory::saga(&client, noop)).await?
            } else {
                let wait = kind == "tcc";
                let start = memory::tcc(&client, noop, wait);
                memory::measure(name, &process, &gate, n, 2, start).await?
            };
            println!("{}", figure.line(store));
            memory.push(figure);
            process.stop().await?;
        }
    }
    Ok(StoreReport {
        store,
        settings,
        rows,
        commit_to_confirmed,
        memory,
    })
}

/// Serves the rows participant on the business database (over mTLS with `tls`).
async fn serve_rows(
    store: Store,
    url: &str,
    security: &security::Security,
) -> Result<(String, Arc<dyn workload::LocalTransactions>), Error> {
    let pool = MAX_POOL as u32;
    match store {
        Store::Sqlite => database::serve_rows::<sqlx::Sqlite>(url, pool, security).await,
        Store::Postgres => database::serve_rows::<sqlx::Postgres>(url, pool, security).await,
        Store::Mysql => database::serve_rows::<sqlx::MySql>(url, pool, security).await,
    }
}

/// What every measured point of one store shares.
struct Harness<'a> {
    store: Store,
    process: &'a CoordinatorProcess,
    client: &'a Coordinator,
    targets: &'a Arc<Targets>,
    warmup: Duration,
    window: Duration,
}

/// Machine CPU of one unit of each baseline at one client count.
struct Floor {
    raw_insert: cpu::PerTx,
    noop_call: cpu::PerTx,
}

impl Harness<'_> {
    /// Runs a baseline, charging it the CPU used meanwhile.
    async fn charged(
        &self,
        run: impl Future<Output = Result<Measured, Error>>,
    ) -> Result<(Measured, cpu::PerTx), Error> {
        let before = cpu::Reading::now(self.process.pid());
        let measured = run.await?;
        let cpu = before.per_tx(&cpu::Reading::now(self.process.pid()), measured.total_ok);
        Ok((measured, cpu))
    }

    /// One workload at one client count, with the coordinator's counters, CPU and peak memory
    /// read around it; `raw` is the baseline at the same client count, `floor` the CPU of
    /// one unit of each baseline.
    async fn measure(
        &self,
        clients: usize,
        w: Workload,
        raw: &Measured,
        floor: &Floor,
    ) -> Result<Row, Error> {
        let (process, store, warmup, window) = (self.process, self.store, self.warmup, self.window);
        process.reset_peak()?;
        let before = process.counters().await?;
        let cpu_before = cpu::Reading::now(process.pid());
        let (client, targets) = (self.client.clone(), self.targets.clone());
        let measured = load::closed_loop(clients, warmup, window, move || {
            let (client, targets) = (client.clone(), targets.clone());
            async move { w.run_one(&client, &targets).await }
        })
        .await;
        let cpu_after = cpu::Reading::now(process.pid());
        let after = process.counters().await?;
        let done = measured.total_ok as f64;
        let mut r = row(store, clients, w.name(), &measured, raw.per_second());
        r.store_commits_per_tx = Some(stats::ratio((after.commits - before.commits) as f64, done));
        let writes = stats::ratio((after.writes - before.writes) as f64, done);
        r.store_writes_per_tx = Some(writes);
        r.p99_to_commit_floor = Some(stats::ratio(
            measured.latency.p99_ms,
            w.sequential_commits() as f64 * raw.latency.mean_ms,
        ));
        let cpu = cpu_before.per_tx(&cpu_after, measured.total_ok);
        let floor_ms = f64::from(w.grpc_calls()) * floor.noop_call.machine_ms
            + (writes + f64::from(w.participant_commits())) * floor.raw_insert.machine_ms;
        r.cpu_per_tx = Some(cpu);
        r.cpu_floor_ms = Some(floor_ms);
        r.cpu_to_floor = Some(stats::ratio(cpu.machine_ms, floor_ms));
        r.coordinator_peak_mib = Some(process.peak_rss_kib()? as f64 / 1024.0);
        Ok(r)
    }
}

fn row(store: Store, clients: usize, workload: &'static str, m: &Measured, raw: f64) -> Row {
    Row {
        store,
        clients,
        workload,
        per_second: m.per_second(),
        ratio_to_raw: stats::ratio(m.per_second(), raw),
        latency: m.latency,
        completed: m.completed,
        errors: m.errors,
        first_error: m.first_error.clone(),
        store_commits_per_tx: None,
        store_writes_per_tx: None,
        p99_to_commit_floor: None,
        coordinator_peak_mib: None,
        cpu_per_tx: None,
        cpu_floor_ms: None,
        cpu_to_floor: None,
    }
}
