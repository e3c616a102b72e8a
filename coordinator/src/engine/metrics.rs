//! Counters an operator alerts on, rendered in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::domain::{Kind, TxStatus};

#[derive(Debug, Default)]
pub struct Metrics {
    started_tcc: AtomicU64,
    started_saga: AtomicU64,
    committed: AtomicU64,
    rolled_back: AtomicU64,
    succeeded: AtomicU64,
    compensated: AtomicU64,
    /// Transactions parked because a Confirm/Cancel/compensation was refused: alert on any.
    needs_attention: AtomicU64,
    /// Transactions taken over by recovery (deadline, expired lease, due retry).
    recovered: AtomicU64,
    /// The database's clock minus this host's, at the last sample.
    clock_skew_ms: AtomicI64,
}

impl Metrics {
    pub(super) fn started(&self, kind: Kind) {
        match kind {
            Kind::Tcc => &self.started_tcc,
            Kind::Saga => &self.started_saga,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn finished(&self, status: TxStatus) {
        let counter = match status {
            TxStatus::Committed => &self.committed,
            TxStatus::RolledBack => &self.rolled_back,
            TxStatus::Succeeded => &self.succeeded,
            TxStatus::Compensated => &self.compensated,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn parked(&self) {
        self.needs_attention.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn recovered(&self) {
        self.recovered.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn clock_skew(&self, ms: i64) {
        self.clock_skew_ms.store(ms, Ordering::Relaxed);
    }

    /// Transactions parked in NEEDS_ATTENTION by this instance since it started.
    pub fn needs_attention(&self) -> u64 {
        self.needs_attention.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every counter, plus the store's commit counters.
    pub fn render(&self, store_commits: u64, store_writes: u64, parked_now: Option<u64>) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, labels: &[(&str, &AtomicU64)]| {
            let _ = writeln!(out, "# HELP dtx_{name} {help}\n# TYPE dtx_{name} counter");
            for (label, value) in labels {
                let _ = writeln!(out, "dtx_{name}{label} {}", value.load(Ordering::Relaxed));
            }
        };
        counter(
            "transactions_started_total",
            "Global transactions begun or submitted here.",
            &[
                ("{kind=\"tcc\"}", &self.started_tcc),
                ("{kind=\"saga\"}", &self.started_saga),
            ],
        );
        counter(
            "transactions_finished_total",
            "Transactions this instance drove to a terminal status.",
            &[
                ("{status=\"committed\"}", &self.committed),
                ("{status=\"rolled_back\"}", &self.rolled_back),
                ("{status=\"succeeded\"}", &self.succeeded),
                ("{status=\"compensated\"}", &self.compensated),
            ],
        );
        counter(
            "needs_attention_total",
            "Transactions parked because a Confirm, Cancel or compensation was refused.",
            &[("", &self.needs_attention)],
        );
        counter(
            "recovered_total",
            "Transactions taken over by recovery.",
            &[("", &self.recovered)],
        );
        let _ = writeln!(
            out,
            "# HELP dtx_store_commits_total Database commits made by the store.\n# TYPE dtx_store_commits_total counter\ndtx_store_commits_total {store_commits}"
        );
        let _ = writeln!(
            out,
            "# HELP dtx_store_writes_total State changes written (several share a commit).\n# TYPE dtx_store_writes_total counter\ndtx_store_writes_total {store_writes}"
        );
        let _ = writeln!(
            out,
            "# HELP dtx_clock_offset_ms The database's clock minus this host's wall clock (leases and deadlines use the database's).\n# TYPE dtx_clock_offset_ms gauge\ndtx_clock_offset_ms {}",
            self.clock_skew_ms.load(Ordering::Relaxed)
        );
        if let Some(parked) = parked_now {
            let _ = writeln!(
                out,
                "# HELP dtx_needs_attention Transactions parked in NEEDS_ATTENTION now, across all instances.\n# TYPE dtx_needs_attention gauge\ndtx_needs_attention {parked}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_the_alert_gauge() {
        let m = Metrics::default();
        m.started(Kind::Tcc);
        m.finished(TxStatus::Committed);
        m.parked();
        let text = m.render(7, 21, Some(3));
        assert!(
            text.contains("dtx_transactions_started_total{kind=\"tcc\"} 1"),
            "{text}"
        );
        assert!(text.contains("dtx_transactions_finished_total{status=\"committed\"} 1"));
        assert!(text.contains("dtx_needs_attention_total 1"));
        m.clock_skew(-30_000);
        let text = m.render(7, 21, Some(3));
        assert!(text.contains("# TYPE dtx_clock_offset_ms gauge\ndtx_clock_offset_ms -30000"));
        assert!(text.contains("# TYPE dtx_needs_attention gauge\ndtx_needs_attention 3"));
        assert!(
            text.contains("dtx_store_commits_total 7")
                && text.contains("dtx_store_writes_total 21")
        );
    }
}
