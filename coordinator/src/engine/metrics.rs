//! What the coordinator exports at `/metrics`.
//!
//! Recorded through the `metrics` facade into a Prometheus recorder of the engine's own, not a
//! global one: several engines in one process (tests, an embedding service) keep their numbers
//! apart, and an embedder's own global recorder is left alone. Handles with fixed labels are
//! registered once; the per-handler ones are looked up per call (a hash of name and labels).
//! Labels are bounded sets only - kind, status (as stored), action, outcome, handler,
//! operation - never an xid, a key or a target URL.

use std::time::Duration;

use metrics::{Counter, Gauge, counter, describe_counter, describe_gauge, describe_histogram};
use metrics::{Unit, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::domain::job::CallOutcome;
use crate::domain::{Kind, TxStatus};

/// Bucket bounds (seconds) of the branch call latency: a participant on loopback answers in
/// well under a millisecond, a slow one is cut off by its call timeout.
const CALL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Bucket bounds (seconds) of a transaction's life, from its creation to its final status.
const TX_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
    3600.0,
];

/// Every metric name the coordinator exports (tests check the dashboard and rules use only
/// these).
pub const METRIC_NAMES: &[&str] = &[
    "dtx_transactions_started_total",
    "dtx_transactions_finished_total",
    "dtx_transaction_duration_seconds",
    "dtx_needs_attention_total",
    "dtx_needs_attention",
    "dtx_takeovers_total",
    "dtx_branch_call_duration_seconds",
    "dtx_branch_retries_total",
    "dtx_oldest_open_transaction_age_seconds",
    "dtx_drivers_active",
    "dtx_clock_offset_ms",
    "dtx_store_commits_total",
    "dtx_store_writes_total",
    "dtx_store_errors_total",
    "dtx_alert_deliveries_total",
    "dtx_listener_refusals_total",
    "dtx_quota_rejections_total",
];

/// What a scrape reads from the store and the engine at that moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct Snapshot<'a> {
    pub store_commits: u64,
    pub store_writes: u64,
    /// Failed writes by operation (every write operation, zero or not).
    pub store_errors: &'a [(&'static str, u64)],
    /// Parked transactions across all instances; `None` if the store could not say.
    pub parked: Option<u64>,
    /// Age of the oldest non-terminal transaction; `Some(0)` when there is none.
    pub oldest_open_ms: Option<i64>,
    pub drivers: u64,
}

pub struct Metrics {
    handlers: HandlerLabels,
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Per kind, in the order of [`Kind::ALL`].
    started: Vec<Counter>,
    parked: Counter,
    clock_offset: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// The `handler` label of the calls past the cap of [`HandlerLabels`].
pub const OTHER_HANDLER: &str = "_other";

/// Most distinct handler names given a label of their own when none is configured.
pub const DEFAULT_MAX_HANDLER_LABELS: usize = 200;

/// The handler names given a label of their own, first come first served up to a cap: callers
/// name handlers, and each name is a series in every call metric, so without a cap a caller
/// could grow every scrape (and the exporter's memory) without bound.
struct HandlerLabels {
    max: usize,
    seen: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl HandlerLabels {
    fn label(&self, handler: &str) -> String {
        let known = |seen: &std::collections::HashSet<String>| seen.contains(handler);
        if self.seen.read().is_ok_and(|seen| known(&seen)) {
            return handler.to_string();
        }
        let Ok(mut seen) = self.seen.write() else {
            return OTHER_HANDLER.to_string();
        };
        if known(&seen) || seen.len() < self.max {
            seen.insert(handler.to_string());
            return handler.to_string();
        }
        if seen.len() == self.max {
            // Logged once: the set stays at `max` names, so mark it as having overflowed.
            seen.insert(OTHER_HANDLER.to_string());
            tracing::warn!(
                max = self.max,
                "more handler names than --metrics-max-handlers; further ones are counted under \
                 handler=\"{OTHER_HANDLER}\""
            );
        }
        OTHER_HANDLER.to_string()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(DEFAULT_MAX_HANDLER_LABELS)
    }
}

impl Metrics {
    /// A recorder whose call metrics label at most `max_handlers` handler names.
    pub fn new(max_handlers: usize) -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("dtx_branch_call_duration_seconds".into()),
                CALL_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("dtx_transaction_duration_seconds".into()),
                    TX_BUCKETS,
                )
            })
            .expect("bucket bounds are not empty")
            .build_recorder();
        let handle = recorder.handle();
        let (started, parked, clock_offset) = with_local_recorder(&recorder, || {
            describe();
            (
                Kind::ALL
                    .iter()
                    .map(|k| counter!("dtx_transactions_started_total", "kind" => k.as_str()))
                    .collect(),
                counter!("dtx_needs_attention_total"),
                gauge!("dtx_clock_offset_ms"),
            )
        });
        Metrics {
            handlers: HandlerLabels {
                max: max_handlers,
                seen: Default::default(),
            },
            recorder,
            handle,
            started,
            parked,
            clock_offset,
        }
    }
}

/// The help texts, registered once per recorder.
fn describe() {
    describe_counter!(
        "dtx_transactions_started_total",
        "Global transactions begun or submitted here."
    );
    describe_counter!(
        "dtx_transactions_finished_total",
        "Transactions this instance drove to a terminal status or parked."
    );
    describe_histogram!(
        "dtx_transaction_duration_seconds",
        Unit::Seconds,
        "From a transaction's creation to the final (or parked) status this instance wrote."
    );
    describe_counter!(
        "dtx_needs_attention_total",
        "Transactions this instance parked because a Confirm, Cancel or compensation was refused."
    );
    describe_gauge!(
        "dtx_needs_attention",
        "Transactions parked in NEEDS_ATTENTION now, across all instances."
    );
    describe_counter!(
        "dtx_takeovers_total",
        "Transactions claimed by this instance's recovery (deadline, expired lease, due retry), by the status they were in."
    );
    describe_histogram!(
        "dtx_branch_call_duration_seconds",
        Unit::Seconds,
        "Participant calls (Confirm, Cancel, action, compensation) by handler, action and answer."
    );
    describe_counter!(
        "dtx_branch_retries_total",
        "Participant calls answered with a failure or no answer and scheduled to be made again."
    );
    describe_gauge!(
        "dtx_oldest_open_transaction_age_seconds",
        "Age of the oldest transaction not in a terminal status, across all instances (0 if none)."
    );
    describe_gauge!(
        "dtx_drivers_active",
        "Transactions this instance is driving now."
    );
    describe_gauge!(
        "dtx_clock_offset_ms",
        "The database's clock minus this host's wall clock (leases and deadlines use the database's)."
    );
    describe_counter!(
        "dtx_store_commits_total",
        "Database commits made by the store."
    );
    describe_counter!(
        "dtx_store_writes_total",
        "State changes written (several share a commit)."
    );
    describe_counter!(
        "dtx_store_errors_total",
        "Store operations that failed, by operation."
    );
    describe_counter!(
        "dtx_listener_refusals_total",
        "Connections refused and requests cut by a listener (grpc, http, console, metrics), by reason: connection_cap, accept_failed, header_timeout, body_timeout, body_too_large, cut_at_shutdown."
    );
    describe_counter!(
        "dtx_quota_rejections_total",
        "Calls refused RESOURCE_EXHAUSTED by a tenant's quota, by tenant and quota (begins_per_second, payload_bytes_per_minute)."
    );
    describe_counter!(
        "dtx_alert_deliveries_total",
        "Alert webhook calls, by result (delivered: a 2xx answer; failed: anything else)."
    );
}

/// The answer class of a participant call.
pub fn outcome_label(outcome: &CallOutcome) -> &'static str {
    match outcome {
        CallOutcome::Success(_) => "success",
        CallOutcome::Failure(_) => "failure",
        CallOutcome::NotSent(_) => "not_sent",
        CallOutcome::Unknown(_) => "unknown",
    }
}

impl Metrics {
    /// Runs `f` with this engine's recorder behind the `metrics` macros.
    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(&self.recorder, f)
    }

    pub(super) fn started(&self, kind: Kind) {
        let i = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.started[i].increment(1);
    }

    /// A transaction reached `status` (terminal or parked) `age` after its creation.
    pub(super) fn finished(&self, kind: Kind, status: TxStatus, age: Duration) {
        let (kind, status) = (kind.as_str(), status.as_str());
        self.with(|| {
            counter!("dtx_transactions_finished_total", "status" => status).increment(1);
            histogram!("dtx_transaction_duration_seconds", "kind" => kind, "outcome" => status)
                .record(age.as_secs_f64());
        });
    }

    pub(super) fn parked(&self) {
        self.parked.increment(1);
    }

    /// Recovery claimed a transaction that was in `status`.
    pub(super) fn taken_over(&self, status: TxStatus) {
        let status = status.as_str();
        self.with(|| counter!("dtx_takeovers_total", "status" => status).increment(1));
    }

    /// One participant call and how it was answered.
    pub(super) fn branch_call(
        &self,
        handler: &str,
        action: &'static str,
        outcome: &'static str,
        took: Duration,
    ) {
        let handler = self.handlers.label(handler);
        self.with(|| {
            histogram!(
                "dtx_branch_call_duration_seconds",
                "handler" => handler,
                "action" => action,
                "outcome" => outcome
            )
            .record(took.as_secs_f64())
        });
    }

    /// A call that failed or got no answer and will be made again after its backoff.
    pub(super) fn retried(&self, handler: &str, action: &'static str) {
        let handler = self.handlers.label(handler);
        self.with(|| {
            counter!("dtx_branch_retries_total", "handler" => handler, "action" => action)
                .increment(1)
        });
    }

    /// A call refused by `tenant`'s `quota`.
    pub fn quota_rejected(&self, tenant: &str, quota: &'static str) {
        let tenant = tenant.to_string();
        self.with(|| {
            counter!("dtx_quota_rejections_total", "tenant" => tenant, "quota" => quota)
                .increment(1)
        });
    }

    /// Exports the quota counters of the default tenant at zero, so the series exist (and
    /// dashboards' `rate()` works) before the first rejection.
    pub fn quotas_serving(&self, quotas: &[&'static str]) {
        self.with(|| {
            for &quota in quotas {
                let tenant = dtx_proto::limits::DEFAULT_TENANT;
                counter!("dtx_quota_rejections_total", "tenant" => tenant, "quota" => quota)
                    .increment(0);
            }
        });
    }

    /// Exports a listener's refusal counters at zero, so they exist (and `rate()` works) before
    /// the first refusal.
    pub fn listener_serving(&self, listener: &'static str, reasons: &[&'static str]) {
        self.with(|| {
            for &reason in reasons {
                counter!("dtx_listener_refusals_total", "listener" => listener, "reason" => reason)
                    .increment(0);
            }
        });
    }

    /// A listener refused a connection or cut a request, and why (the listeners' refusal
    /// names).
    pub fn listener_refused(&self, listener: &'static str, reason: &'static str) {
        self.with(|| {
            counter!("dtx_listener_refusals_total", "listener" => listener, "reason" => reason)
                .increment(1)
        });
    }

    pub(super) fn alert_delivery(&self, delivered: bool) {
        let result = if delivered { "delivered" } else { "failed" };
        self.with(|| counter!("dtx_alert_deliveries_total", "result" => result).increment(1));
    }

    /// A store operation outside the writer (claims, scans) failed.
    pub(super) fn store_error(&self, operation: &'static str) {
        self.with(|| counter!("dtx_store_errors_total", "operation" => operation).increment(1));
    }

    pub(super) fn clock_skew(&self, ms: i64) {
        self.clock_offset.set(ms as f64);
    }

    /// Folds histogram samples into their buckets; the exporter's own installer would run
    /// this on a thread, here the engine calls it every few seconds.
    pub(super) fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The Prometheus text exposition, with the values read at scrape time set first.
    pub fn render(&self, now: Snapshot<'_>) -> String {
        self.with(|| {
            counter!("dtx_store_commits_total").absolute(now.store_commits);
            counter!("dtx_store_writes_total").absolute(now.store_writes);
            for &(operation, failed) in now.store_errors {
                counter!("dtx_store_errors_total", "operation" => operation).absolute(failed);
            }
            if let Some(parked) = now.parked {
                gauge!("dtx_needs_attention").set(parked as f64);
            }
            if let Some(age_ms) = now.oldest_open_ms {
                gauge!("dtx_oldest_open_transaction_age_seconds")
                    .set(age_ms.max(0) as f64 / 1000.0);
            }
            gauge!("dtx_drivers_active").set(now.drivers as f64);
        });
        self.handle.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_the_scrape_time_values() {
        let m = Metrics::default();
        m.started(Kind::Tcc);
        m.finished(Kind::Tcc, TxStatus::Committed, Duration::from_millis(30));
        m.parked();
        m.branch_call(
            "bank.debit",
            "CONFIRM",
            "success",
            Duration::from_micros(700),
        );
        m.clock_skew(-30_000);
        let errors = [("progress", 2), ("decide", 0)];
        let text = m.render(Snapshot {
            store_commits: 7,
            store_writes: 21,
            store_errors: &errors,
            parked: Some(3),
            oldest_open_ms: Some(2_500),
            drivers: 4,
        });
        for line in [
            "dtx_transactions_started_total{kind=\"tcc\"} 1",
            "dtx_transactions_finished_total{status=\"COMMITTED\"} 1",
            "dtx_transaction_duration_seconds_bucket{kind=\"tcc\",outcome=\"COMMITTED\",le=\"0.05\"} 1",
            "dtx_branch_call_duration_seconds_bucket{handler=\"bank.debit\",action=\"CONFIRM\",outcome=\"success\",le=\"0.001\"} 1",
            "dtx_needs_attention_total 1",
            "# TYPE dtx_clock_offset_ms gauge\ndtx_clock_offset_ms -30000",
            "# TYPE dtx_needs_attention gauge\ndtx_needs_attention 3",
            "dtx_oldest_open_transaction_age_seconds 2.5",
            "dtx_drivers_active 4",
            "dtx_store_commits_total 7",
            "dtx_store_writes_total 21",
            "dtx_store_errors_total{operation=\"progress\"} 2",
        ] {
            assert!(text.contains(line), "{line:?} missing in\n{text}");
        }
        assert!(
            text.contains("dtx_store_errors_total{operation=\"decide\"} 0"),
            "{text}"
        );
        for name in METRIC_NAMES {
            if ![
                "dtx_takeovers_total",
                "dtx_branch_retries_total",
                "dtx_alert_deliveries_total",
                "dtx_listener_refusals_total",
                "dtx_quota_rejections_total",
            ]
            .contains(name)
            {
                assert!(
                    text.contains(&format!("# TYPE {name} ")),
                    "{name} missing in\n{text}"
                );
            }
        }
    }

    #[test]
    fn handler_names_past_the_cap_share_one_label() {
        let m = Metrics::new(3);
        for i in 0..150 {
            let handler = format!("svc.h{i}");
            m.branch_call(&handler, "ACTION", "success", Duration::from_millis(1));
            m.retried(&handler, "ACTION");
        }
        // A known name keeps its label after the cap is reached.
        m.retried("svc.h1", "ACTION");
        let text = m.render(Snapshot::default());
        let handlers: std::collections::BTreeSet<&str> = text
            .split("handler=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert_eq!(
            handlers.into_iter().collect::<Vec<_>>(),
            ["_other", "svc.h0", "svc.h1", "svc.h2"],
            "{text}"
        );
        assert!(
            text.contains("dtx_branch_retries_total{handler=\"_other\",action=\"ACTION\"} 147")
        );
        assert!(text.contains("dtx_branch_retries_total{handler=\"svc.h1\",action=\"ACTION\"} 2"));
    }

    #[test]
    fn engines_in_one_process_keep_their_numbers_apart() {
        let (a, b) = (Metrics::default(), Metrics::default());
        a.started(Kind::Saga);
        a.started(Kind::Saga);
        b.started(Kind::Saga);
        let count = |m: &Metrics| m.render(Snapshot::default());
        assert!(count(&a).contains("dtx_transactions_started_total{kind=\"saga\"} 2"));
        assert!(count(&b).contains("dtx_transactions_started_total{kind=\"saga\"} 1"));
    }
}
