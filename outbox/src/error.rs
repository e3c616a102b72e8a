//! The outbox's one error type.

use dtx_proto::limits::LimitError;

/// What can go wrong enqueuing, relaying or consuming events.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An event outside the limits (the message names the limit); nothing was written.
    #[error("invalid event: {0}")]
    Limit(#[from] LimitError),
    /// The database failed; in `enqueue`, the caller's transaction must roll back.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    /// The outbox table's schema could not be brought up to date.
    #[error("migration failed: {0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
    /// The idempotency records failed while a consumer applied an event (the delivery was
    /// left to be delivered again).
    #[error("applying the event failed: {0}")]
    Apply(#[from] dtx_idempotency::Error),
    /// A delivery without the event id the relay sets: it cannot be applied once.
    #[error("a delivery on {0} carries no event id (Nats-Msg-Id / message_id)")]
    Unidentified(String),
    /// The broker did not take an acknowledgement.
    #[error("acknowledging a delivery failed: {0}")]
    Ack(String),
    /// A stored row the outbox cannot read (a manual edit).
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
}

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
impl Error {
    pub(crate) fn ack(e: impl std::fmt::Display) -> Self {
        Error::Ack(e.to_string())
    }
}
