//! What the participant server helper tells a dashboard, through the `metrics` facade.
//!
//! Recorded into whatever recorder the service installed; without one every call is a no-op.
//! Labels are the handler name (only registered handlers are counted, so a caller cannot grow
//! the label set), the action and the barrier's verdict - never an xid or a branch id. The
//! idempotency records' own metrics are in [`crate::idempotency::metrics`].

use metrics::{counter, describe_counter};

use crate::barrier::{Action, Detail};

/// Branch calls by handler, action and what the barrier made of them: `executed`,
/// `duplicate`, `empty_rollback`, `suspended`, `nothing_to_undo`, `out_of_order`, `conflict`,
/// or `rolled_back` (the local transaction failed and the call answered RETRY).
pub const BARRIER_CALLS: &str = "dtx_barrier_calls_total";
/// Local transactions that lost a lock conflict (deadlock, lock wait timeout, SQLite busy) and
/// ran again, by handler.
pub const BARRIER_LOCK_CONFLICTS: &str = "dtx_barrier_lock_conflicts_total";

/// Branch calls refused before the barrier because their call token was missing, forged,
/// expired or for another call (no label: the refused caller names the handler).
pub const CALLS_REFUSED: &str = "dtx_branch_calls_refused_total";

/// Every metric name the participant server exports.
pub const METRIC_NAMES: &[&str] = &[BARRIER_CALLS, BARRIER_LOCK_CONFLICTS, CALLS_REFUSED];

/// One branch call's verdict; `None`: rolled back, answered RETRY.
pub(crate) fn call(handler: &str, action: Action, detail: Option<Detail>) {
    describe();
    let detail = match detail {
        Some(Detail::Executed) => "executed",
        Some(Detail::Duplicate) => "duplicate",
        Some(Detail::EmptyRollback) => "empty_rollback",
        Some(Detail::Suspended) => "suspended",
        Some(Detail::NothingToUndo) => "nothing_to_undo",
        Some(Detail::OutOfOrder) => "out_of_order",
        Some(Detail::Conflict) => "conflict",
        None => "rolled_back",
    };
    counter!(
        BARRIER_CALLS,
        "handler" => handler.to_string(),
        "action" => action.as_str(),
        "detail" => detail
    )
    .increment(1);
}

pub(crate) fn lock_conflict(handler: &str) {
    counter!(BARRIER_LOCK_CONFLICTS, "handler" => handler.to_string()).increment(1);
}

pub(crate) fn refused() {
    describe();
    counter!(CALLS_REFUSED).increment(1);
}

/// Help texts, once per process: the exporter takes a write lock for each, too dear per call.
/// (A recorder installed after the first call gets the metrics without their help text.)
fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_counter!(
            BARRIER_CALLS,
            "Branch calls by handler, action and barrier verdict"
        );
        describe_counter!(
            BARRIER_LOCK_CONFLICTS,
            "Lock conflicts that made a branch's local transaction run again"
        );
        describe_counter!(
            CALLS_REFUSED,
            "Branch calls refused before the barrier: no valid coordinator call token"
        );
    });
}
