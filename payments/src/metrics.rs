//! What the callbacks tell a dashboard, through the `metrics` facade.

/// Callbacks by provider and outcome: `applied`, `repeated`, `stale`, `ignored` (an event type
/// the shop does not handle), `bad_signature`, `malformed`, `conflict` (parked for a person),
/// `retry_later`.
pub const CALLBACKS: &str = "dtx_payment_callbacks_total";

/// Every metric name the callbacks export (tests check the dashboard and rules use only these).
pub const METRIC_NAMES: &[&str] = &[CALLBACKS];
