//! What a run reports: one row per (store, clients, workload), printed as a table and written
//! as JSON.

use serde::Serialize;

use crate::database::Store;
use crate::memory::MemoryFigure;
use crate::stats::Latency;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub store: Store,
    pub clients: usize,
    /// A workload's name, or `raw-insert` for the baseline.
    pub workload: &'static str,
    pub per_second: f64,
    /// `per_second ÷` the raw single-insert commits/s at the same store and clients.
    pub ratio_to_raw: f64,
    pub latency: Latency,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Coordinator store commits (and state changes written) per completed transaction.
    pub store_commits_per_tx: Option<f64>,
    pub store_writes_per_tx: Option<f64>,
    /// p99 ÷ (the workload's sequential durable commits × the raw insert's mean latency).
    pub p99_to_commit_floor: Option<f64>,
    /// The coordinator's peak resident memory during this workload.
    pub coordinator_peak_mib: Option<f64>,
    /// CPU milliseconds per completed transaction, measured over warm-up and window.
    pub cpu_per_tx: Option<crate::cpu::PerTx>,
    /// The machine CPU floor of today's protocol: gRPC calls × one no-op call's machine CPU
    /// + writes (coordinator store and participants) × one raw insert's, at the same clients.
    pub cpu_floor_ms: Option<f64>,
    /// Machine CPU per transaction ÷ that floor: the work above the protocol's own cost.
    pub cpu_to_floor: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StoreReport {
    pub store: Store,
    pub settings: Vec<(String, String)>,
    pub rows: Vec<Row>,
    /// Commit alone (until both Confirms were delivered), one client.
    pub commit_to_confirmed: Latency,
    pub memory: Vec<MemoryFigure>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started_unix: u64,
    pub machine: Machine,
    pub seconds_per_workload: f64,
    pub stores: Vec<StoreReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_average: String,
}

impl Machine {
    pub fn read() -> Machine {
        let file = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = file("/proc/cpuinfo");
        let field = |text: &str, name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let mem_kib: f64 = field(&file("/proc/meminfo"), "MemTotal")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0.0);
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: field(&cpuinfo, "model name"),
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: file("/proc/sys/kernel/osrelease").trim().to_string(),
            load_average: file("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

pub const HEADER: &str = "store     clients  workload          tx/s    ×raw    p50ms   p95ms   p99ms  errors  commits/tx  writes/tx  p99/floor  peakMiB  cpu ms/tx: coord clients+parts machine  floor ×floor";

fn opt(v: Option<f64>, width: usize, decimals: usize) -> String {
    v.map_or_else(
        || format!("{:>width$}", "-"),
        |v| format!("{v:>width$.decimals$}"),
    )
}

impl Row {
    pub fn line(&self) -> String {
        format!(
            "{:<9} {:>7}  {:<15} {:>8.0}  {:>6.3}  {:>7.2} {:>7.2} {:>7.2}  {:>6}  {}  {}  {}  {}  {}  {} {}",
            format!("{:?}", self.store).to_lowercase(),
            self.clients,
            self.workload,
            self.per_second,
            self.ratio_to_raw,
            self.latency.p50_ms,
            self.latency.p95_ms,
            self.latency.p99_ms,
            self.errors,
            opt(self.store_commits_per_tx, 10, 2),
            opt(self.store_writes_per_tx, 9, 2),
            opt(self.p99_to_commit_floor, 9, 2),
            opt(self.coordinator_peak_mib, 7, 0),
            self.cpu_per_tx.map_or_else(String::new, |c| format!(
                "{:>16.3} {:>13.3} {:>7.3}",
                c.coordinator_ms, c.clients_and_participants_ms, c.machine_ms
            )),
            opt(self.cpu_floor_ms, 6, 3),
            opt(self.cpu_to_floor, 6, 2),
        )
    }
}

impl MemoryFigure {
    pub fn line(&self, store: Store) -> String {
        format!(
            "memory: {:?} {}: {} of {} in flight, coordinator peak {:.0} MiB (idle {:.0} MiB), {} errors",
            store,
            self.kind,
            self.in_flight,
            self.target_in_flight,
            self.peak_rss_mib,
            self.idle_rss_mib,
            self.errors
        ) + &self
            .first_error
            .as_ref()
            .map(|e| format!("; first: {e}"))
            .unwrap_or_default()
    }
}
