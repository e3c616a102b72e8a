//! The crate's one error type.

use dtx_proto::limits::LimitError;

/// A handler error: the business could not be done now (or its outcome is unknown). The same
/// type as `dtx_sdk::barrier::HandlerError`, so one handler error serves both.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// What can go wrong with the idempotency records.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input outside the limits (the message names the limit): a key, scope or result.
    #[error("invalid input: {0}")]
    Limit(#[from] LimitError),
    /// The database failed; the statement's transaction did not commit.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    /// The business code returned an error; its local transaction was rolled back.
    #[error("handler error: {0}")]
    Handler(HandlerError),
    /// The lease expired and another request took the record over: this owner's completion was
    /// refused (fencing) and nothing was written.
    #[error("idempotency lease lost: the record was taken over, completion refused")]
    LeaseLost,
    /// The user-supplied fact check failed; the record keeps a fresh lease and is checked again
    /// when it expires.
    #[error("fact check failed: {0}")]
    FactCheck(HandlerError),
    /// A stored record is in a state the protocol cannot produce (unknown status, malformed key
    /// or hash).
    #[error("idempotency record: {0}")]
    Corrupt(String),
    /// An operation the record's state does not allow (resolving a record that is not parked,
    /// or resolving it to no result).
    #[error("idempotency record misused: {0}")]
    Misuse(String),
}

impl dtx_sql::LockConflict for Error {
    fn database_error(&self) -> Option<&dtx_sql::sqlx::Error> {
        match self {
            Error::Database(e) => Some(e),
            _ => None,
        }
    }
}
