//! What the outbox tells a dashboard, through the `metrics` facade (recorded into the recorder
//! the service installed; without one every call is a no-op). No labels: topics and keys are
//! the service's own and may be unbounded.

/// Events the broker confirmed.
pub const PUBLISHED: &str = "dtx_outbox_published_total";
/// Publishes that failed (each retried with backoff, or parked at the attempt limit).
pub const PUBLISH_FAILURES: &str = "dtx_outbox_publish_failures_total";
/// Events parked after their attempt limit (they hold back their key until republished).
pub const PARKED_TOTAL: &str = "dtx_outbox_parked_total";
/// Seconds from a publish to the broker's confirmation.
pub const PUBLISH_SECONDS: &str = "dtx_outbox_publish_seconds";
/// Seconds from an event's enqueue (its business commit) to its confirmed publish.
pub const LAG_SECONDS: &str = "dtx_outbox_lag_seconds";
/// Rows waiting to be published (parked ones apart); set by [`crate::Relay::export_backlog`].
pub const WAITING: &str = "dtx_outbox_waiting";
/// Age of the oldest waiting row, in seconds (0 if none).
pub const OLDEST_UNSENT_SECONDS: &str = "dtx_outbox_oldest_unsent_seconds";
/// Rows parked now.
pub const PARKED: &str = "dtx_outbox_parked";
/// Deliveries a consumer dead-lettered: a known event id with other content (a producer bug).
pub const CONSUMER_CONFLICTS: &str = "dtx_outbox_consumer_conflicts_total";

/// Every metric name the outbox exports (tests check the dashboard and rules use only these).
pub const METRIC_NAMES: &[&str] = &[
    PUBLISHED,
    PUBLISH_FAILURES,
    PARKED_TOTAL,
    PUBLISH_SECONDS,
    LAG_SECONDS,
    WAITING,
    OLDEST_UNSENT_SECONDS,
    PARKED,
    CONSUMER_CONFLICTS,
];
