//! The SDK's one error type.

use dtx_proto::limits::LimitError;
use dtx_proto::reason::Reason;

use crate::barrier::HandlerError;

/// What can go wrong in a participant, an initiator or a message's local transaction.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input outside the contract's limits (the message names the limit).
    #[error("invalid input: {0}")]
    Limit(#[from] LimitError),
    /// The local database failed; the local transaction did not commit.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    /// Creating or upgrading a dtx table failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
    /// A business handler returned an error; its local transaction was rolled back.
    #[error("handler error: {0}")]
    Handler(HandlerError),
    /// The barrier table is in a state the protocol cannot produce.
    #[error("barrier inconsistency: {0}")]
    Barrier(String),
    /// A two-phase message's check-back found its local transaction uncommitted and dropped
    /// the message: the local transaction must roll back (nothing will be delivered).
    #[error("message {xid} was dropped by a check-back before its local transaction committed")]
    MessageDropped {
        /// The message.
        xid: String,
    },
    /// A Try answered FAILURE: the transaction must roll back.
    #[error("branch {branch_id} of {xid} refused its try: {message}")]
    BranchRefused {
        /// The transaction.
        xid: String,
        /// The refusing branch.
        branch_id: String,
        /// The participant's reason.
        message: String,
    },
    /// A Try's outcome is unknown (timeout, RETRY, transport error): the transaction must roll
    /// back, never commit.
    #[error("branch {branch_id} of {xid} has an unknown outcome: {message}")]
    BranchInDoubt {
        /// The transaction.
        xid: String,
        /// The branch whose outcome is unknown.
        branch_id: String,
        /// What was seen (the timeout, the status, the transport error).
        message: String,
    },
    /// A transaction was still running when the wait ended.
    #[error("transaction {xid} is still {}", status.as_str_name())]
    NotSettled {
        /// The transaction.
        xid: String,
        /// Its status when the wait ended.
        status: dtx_proto::v1::TxStatus,
    },
    /// A call to the coordinator or a participant failed.
    #[error("rpc failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// Could not connect to the coordinator or a participant.
    #[error("transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An idempotency record's own failure: a lost lease, a failed fact check, a corrupt or
    /// misused record (database, limit and handler errors arrive as the variants above).
    #[error(transparent)]
    Idempotency(dtx_idempotency::Error),
}

// `dtx_idempotency::Error`'s database, limit and handler errors become the SDK's own variants
// (so one `Error::Database` arm covers them wherever they came from); the rest are wrapped.
impl From<dtx_idempotency::Error> for Error {
    fn from(e: dtx_idempotency::Error) -> Self {
        match e {
            dtx_idempotency::Error::Database(e) => Error::Database(e),
            dtx_idempotency::Error::Limit(e) => Error::Limit(e),
            dtx_idempotency::Error::Handler(e) => Error::Handler(e),
            other => Error::Idempotency(other),
        }
    }
}

impl Error {
    /// Why a coordinator call failed (`dtx_proto::reason`, the README's table of error
    /// reasons): the reason a status carries or implies; an input this SDK refused before
    /// sending is `INVALID_REQUEST`, as the coordinator would have answered; a failed
    /// connection is `UNAVAILABLE`. `None` for errors of the local side (database, handler).
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::Rpc(status) => Reason::of_status(status),
            Error::Limit(_) => Some(Reason::InvalidRequest),
            Error::Transport(_) => Some(Reason::Unavailable),
            _ => None,
        }
    }
}

impl dtx_sql::LockConflict for Error {
    fn database_error(&self) -> Option<&dtx_sql::sqlx::Error> {
        match self {
            Error::Database(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through_question_mark(e: dtx_idempotency::Error) -> Result<(), Error> {
        Err(e)?
    }

    #[test]
    fn idempotency_errors_keep_their_kind_in_the_sdk_error() {
        let limit = LimitError("too long".into());
        assert!(matches!(
            through_question_mark(limit.into()),
            Err(Error::Limit(LimitError(m))) if m == "too long"
        ));
        assert!(matches!(
            through_question_mark(dtx_idempotency::Error::Handler("boom".into())),
            Err(Error::Handler(e)) if e.to_string() == "boom"
        ));
        assert!(matches!(
            through_question_mark(dtx_idempotency::Error::Database(
                dtx_sql::sqlx::Error::PoolTimedOut
            )),
            Err(Error::Database(dtx_sql::sqlx::Error::PoolTimedOut))
        ));
        let lost = through_question_mark(dtx_idempotency::Error::LeaseLost).unwrap_err();
        assert!(matches!(
            lost,
            Error::Idempotency(dtx_idempotency::Error::LeaseLost)
        ));
        assert_eq!(
            lost.to_string(),
            dtx_idempotency::Error::LeaseLost.to_string()
        );
    }
}
