//! What the records tell a dashboard, through the `metrics` facade.
//!
//! Recorded into whatever recorder the service installed (its own Prometheus exporter, say);
//! without one every call is a no-op. Labels are the scope and bounded outcome sets only, never
//! a key, a tenant or a business id: keys are high-cardinality and may carry personal data.
//! `repeats / (first + repeats)` of [`REQUESTS`] is the repeat rate the seed asks for.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};

use crate::{Answer, Completion, Fact, Stats, Status};

/// Requests by scope and outcome (see `Outcome`).
pub const REQUESTS: &str = "dtx_idempotency_requests_total";
/// Outcomes recorded, by scope and status (`succeeded`, `failed_final`, `failed_retryable`,
/// `unknown`; `parked` for a result over the limits, `refused` for a late completion fenced out
/// by a take-over).
pub const COMPLETIONS: &str = "dtx_idempotency_completions_total";
/// Expired leases taken over, by scope and what the fact check said (`happened`,
/// `not_happened`, `unknown`, `error`).
pub const TAKEOVERS: &str = "dtx_idempotency_takeovers_total";
/// Same-transaction runs that lost a lock conflict (deadlock, lock wait timeout, SQLite busy)
/// and ran again, by scope.
pub const LOCK_CONFLICTS: &str = "dtx_idempotency_lock_conflicts_total";
/// Records deleted by retention, by scope.
pub const PURGED: &str = "dtx_idempotency_purged_total";
/// Records by scope and status (`parked` counted apart from `processing`); set by
/// [`crate::Idempotency::export_stats`].
pub const RECORDS: &str = "dtx_idempotency_records";
/// Seconds since the least recently touched PROCESSING record changed, by scope (0 if none).
pub const OLDEST_PROCESSING_AGE: &str = "dtx_idempotency_oldest_processing_age_seconds";
/// Seconds since the least recently changed finished record changed, by scope (0 if none):
/// above the scope's retention window by more than a purge period, cleanup is lagging.
pub const OLDEST_FINISHED_AGE: &str = "dtx_idempotency_oldest_finished_age_seconds";

/// Every metric name the records export (tests check the dashboard and rules use only these).
pub const METRIC_NAMES: &[&str] = &[
    REQUESTS,
    COMPLETIONS,
    TAKEOVERS,
    LOCK_CONFLICTS,
    PURGED,
    RECORDS,
    OLDEST_PROCESSING_AGE,
    OLDEST_FINISHED_AGE,
];

/// How a request ended, as the `outcome` label of [`REQUESTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The key was new: this request runs the business.
    First,
    /// A FAILED_RETRYABLE record was claimed again: this request runs the business.
    Reclaimed,
    /// An expired lease was taken over and the fact check said "not happened".
    TakenOver,
    /// The first outcome was replayed.
    Replayed,
    /// Another request holds a live lease.
    InProgress,
    /// The key was first used with another request.
    Conflict,
    /// The record waits for a person.
    Parked,
    /// A new key over its tenant's limit (the HTTP layer's `limit_new_keys`):
    /// refused, nothing stored.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    Limited,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::First => "first",
            Outcome::Reclaimed => "reclaimed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::InProgress => "in_progress",
            Outcome::Conflict => "conflict",
            Outcome::Parked => "parked",
            Outcome::Limited => "limited",
        }
    }

    /// The outcome of a request answered without running anything; `None` for
    /// [`Answer::Executed`], whose outcome is how the claim was won.
    pub(crate) fn of_answer(answer: &Answer) -> Option<Outcome> {
        Some(match answer {
            Answer::Executed(_) => return None,
            Answer::Replayed { .. } => Outcome::Replayed,
            Answer::InProgress { .. } => Outcome::InProgress,
            Answer::Conflict => Outcome::Conflict,
            Answer::NeedsAttention { .. } => Outcome::Parked,
        })
    }
}

pub(crate) fn request(scope: &str, outcome: Outcome) {
    counter!(REQUESTS, "scope" => scope.to_string(), "outcome" => outcome.label()).increment(1);
}

pub(crate) fn completion(scope: &str, completion: &Completion) {
    let status = match completion {
        Completion::Succeeded(_) => "succeeded",
        Completion::FailedFinal(_) => "failed_final",
        Completion::FailedRetryable(_) => "failed_retryable",
        Completion::Unknown(_) => "unknown",
    };
    completed(scope, status);
}

/// A completion refused because the lease was taken over.
pub(crate) fn refused(scope: &str) {
    completed(scope, "refused");
}

/// A result that could not be stored: the record was parked instead.
pub(crate) fn parked(scope: &str) {
    completed(scope, "parked");
}

fn completed(scope: &str, status: &'static str) {
    counter!(COMPLETIONS, "scope" => scope.to_string(), "status" => status).increment(1);
}

/// A take-over and what the fact check said (`None`: it failed).
pub(crate) fn takeover(scope: &str, fact: Option<&Fact>) {
    let fact = match fact {
        Some(Fact::Happened(_)) => "happened",
        Some(Fact::NotHappened) => "not_happened",
        Some(Fact::Unknown(_)) => "unknown",
        None => "error",
    };
    counter!(TAKEOVERS, "scope" => scope.to_string(), "fact" => fact).increment(1);
}

pub(crate) fn lock_conflict(scope: &str) {
    counter!(LOCK_CONFLICTS, "scope" => scope.to_string()).increment(1);
}

pub(crate) fn purged(scope: &str, deleted: u64) {
    counter!(PURGED, "scope" => scope.to_string()).increment(deleted);
}

/// Sets the gauges of one scope from its [`Stats`] as of `now_ms`.
pub(crate) fn export(scope: &str, stats: &Stats, now_ms: i64) {
    describe();
    let counts = [
        (
            Status::Processing,
            stats.processing.saturating_sub(stats.parked),
        ),
        (Status::Succeeded, stats.succeeded),
        (Status::FailedRetryable, stats.failed_retryable),
        (Status::FailedFinal, stats.failed_final),
    ];
    for (status, count) in counts {
        let status = status.as_str().to_ascii_lowercase();
        gauge!(RECORDS, "scope" => scope.to_string(), "status" => status).set(count as f64);
    }
    gauge!(RECORDS, "scope" => scope.to_string(), "status" => "parked").set(stats.parked as f64);
    let age = |since: Option<i64>| since.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0);
    gauge!(OLDEST_PROCESSING_AGE, "scope" => scope.to_string())
        .set(age(stats.oldest_processing_update));
    gauge!(OLDEST_FINISHED_AGE, "scope" => scope.to_string())
        .set(age(stats.oldest_finished_update));
}

/// Help texts for the exporter; cheap to repeat (the recorder keeps the last one).
fn describe() {
    describe_counter!(REQUESTS, "Idempotent requests by scope and outcome");
    describe_counter!(COMPLETIONS, "Recorded outcomes by scope and status");
    describe_counter!(TAKEOVERS, "Expired leases taken over, by fact check answer");
    describe_counter!(LOCK_CONFLICTS, "Lock conflicts that made a run start again");
    describe_counter!(PURGED, "Records deleted by retention");
    describe_gauge!(RECORDS, "Records by scope and status");
    describe_gauge!(
        OLDEST_PROCESSING_AGE,
        Unit::Seconds,
        "Age of the least recently touched PROCESSING record"
    );
    describe_gauge!(
        OLDEST_FINISHED_AGE,
        Unit::Seconds,
        "Age of the least recently changed finished record (retention lag beyond the window)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoredResult;

    #[test]
    fn every_answer_but_executed_names_its_outcome() {
        let replay = Answer::Replayed {
            status: Status::Succeeded,
            result: StoredResult::new("201"),
        };
        assert_eq!(Outcome::of_answer(&replay), Some(Outcome::Replayed));
        assert_eq!(
            Outcome::of_answer(&Answer::Conflict),
            Some(Outcome::Conflict)
        );
        let executed = Answer::Executed(Completion::Unknown("timeout".into()));
        assert_eq!(Outcome::of_answer(&executed), None);
    }

    #[test]
    fn labels_are_snake_case_and_distinct() {
        let all = [
            Outcome::First,
            Outcome::Reclaimed,
            Outcome::TakenOver,
            Outcome::Replayed,
            Outcome::InProgress,
            Outcome::Conflict,
            Outcome::Parked,
        ];
        let labels: std::collections::BTreeSet<_> = all.iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), all.len());
        assert!(
            labels
                .iter()
                .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }
}
