//! CPU time from `/proc`: of one process, and of the whole machine (every process, the
//! database included). On a small machine CPU per transaction bounds throughput as much as
//! commits per transaction do.

/// Clock ticks per second of `/proc` times (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU milliseconds a process has used so far (user + system).
pub fn process_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / TICKS_PER_SECOND * 1000.0
}

/// Busy CPU milliseconds of the whole machine so far (all CPUs; idle and I/O wait excluded).
pub fn machine_busy_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let busy: f64 = ticks.iter().take(8).sum::<f64>()
        - ticks.get(3).unwrap_or(&0.0)
        - ticks.get(4).unwrap_or(&0.0);
    busy / TICKS_PER_SECOND * 1000.0
}

/// A reading of the three clocks a workload is charged with.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    coordinator: f64,
    bench: f64,
    machine: f64,
}

/// CPU milliseconds per transaction between two readings.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PerTx {
    pub coordinator_ms: f64,
    /// This process: the load clients and the participants.
    pub clients_and_participants_ms: f64,
    /// Every process on the machine, the database included.
    pub machine_ms: f64,
}

impl Reading {
    pub fn now(coordinator_pid: u32) -> Reading {
        Reading {
            coordinator: process_ms(coordinator_pid),
            bench: process_ms(std::process::id()),
            machine: machine_busy_ms(),
        }
    }

    pub fn per_tx(&self, later: &Reading, transactions: u64) -> PerTx {
        let per = |a: f64, b: f64| crate::stats::ratio(b - a, transactions as f64);
        PerTx {
            coordinator_ms: per(self.coordinator, later.coordinator),
            clients_and_participants_ms: per(self.bench, later.bench),
            machine_ms: per(self.machine, later.machine),
        }
    }
}
