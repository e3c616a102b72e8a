//! The request path's error type. Each variant is a distinct, documented gRPC code (see
//! `dtx.proto`); the conversion to `tonic::Status` lives in `grpc.rs`. What stops the
//! process before it serves is `startup::StartError`, not this.

use dtx_proto::limits::LimitError;
use dtx_proto::reason::Reason;

use crate::domain::TxStatus;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed input or a limit exceeded; nothing was stored. -> INVALID_ARGUMENT
    #[error("{0}")]
    Invalid(#[from] LimitError),
    /// -> NOT_FOUND
    #[error("no transaction with xid {0:?}")]
    UnknownXid(String),
    /// The key was used before with different content; the stored content is untouched.
    /// -> ALREADY_EXISTS
    #[error("{0}")]
    Conflict(String),
    /// A decision that contradicts the recorded one. -> ABORTED
    #[error("{message}")]
    Decided { message: String, status: TxStatus },
    /// A branch target the allowlist does not allow; nothing was stored. -> PERMISSION_DENIED
    #[error("{0}")]
    Forbidden(String),
    /// The transaction is not in a state that allows the call. -> FAILED_PRECONDITION
    #[error("{0}")]
    WrongState(String),
    /// The store failed or its commit outcome is unknown; the call is safe to repeat.
    /// -> UNAVAILABLE
    #[error("store unavailable: {0}")]
    Store(#[from] dtx_sql::sqlx::Error),
    /// The store's connection was lost while a batch of writes committed: each write's outcome
    /// is unknown (the one cause is shared by every caller of the batch). -> UNAVAILABLE
    #[error("store unavailable, outcome unknown: {0}")]
    Unavailable(String),
    /// The store holds something the coordinator cannot read (a bug or manual edit). -> INTERNAL
    #[error("corrupt store row: {0}")]
    Corrupt(String),
    /// The coordinator is shutting down. -> UNAVAILABLE
    #[error("coordinator is shutting down")]
    ShuttingDown,
}

impl Error {
    /// Why, as clients match on it: one reason per variant (`dtx_proto::reason`), which also
    /// fixes the gRPC code.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Invalid(_) => Reason::InvalidRequest,
            Error::UnknownXid(_) => Reason::UnknownTransaction,
            Error::Conflict(_) => Reason::KeyReused,
            Error::Decided { .. } => Reason::AlreadyDecided,
            Error::Forbidden(_) => Reason::TargetNotAllowed,
            Error::WrongState(_) => Reason::WrongState,
            Error::Store(_) | Error::Unavailable(_) | Error::ShuttingDown => Reason::Unavailable,
            Error::Corrupt(_) => Reason::Internal,
        }
    }

    /// Whether the store's connection was lost (the outcome of a write in flight is unknown),
    /// as opposed to an error of one statement.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Error::Store(e) => dtx_sql::is_connection_error(e),
            Error::Unavailable(_) => true,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
