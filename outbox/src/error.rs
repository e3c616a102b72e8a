//! The outbox's one error type.

use dtx_proto::limits::LimitError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An event outside the limits (the message names the limit); nothing was written.
    #[error("invalid event: {0}")]
    Limit(#[from] LimitError),
    /// The database failed; in `enqueue`, the caller's transaction must roll back.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
    /// A stored row the outbox cannot read (a manual edit).
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
}
