//! Two-phase messages at the initiator: "commit my local transaction and have these calls
//! delivered" - both or neither.
//!
//! The message has one barrier row, its slot `(xid, "msg", "message")`. The initiator's local
//! transaction inserts it next to the business change ([`prepare_message`]); the coordinator's
//! check-back, asking about a prepared message whose initiator went silent, inserts it too
//! ([`check_back`]). The unique key decides which came first, and every outcome is certain:
//! * the local transaction committed the row: the check-back finds it and answers "deliver";
//! * the check-back inserted it first: the local transaction never committed (and now never
//!   can: its own insert finds the check-back's row, so it must roll back): "drop";
//! * the local transaction is still running: the check-back's insert waits on its uncommitted
//!   row (a row lock on PostgreSQL and MariaDB, the write lock on SQLite) and then decides as
//!   above - the answer is never a guess.

use dtx_proto::limits;
use dtx_sql::Conn;

use super::sql::{self, NewRow, Outcome, RowKey, Slot};
use super::{Action, Answer, Detail, Reply};
use crate::Error;

/// The branch id of a message's slot (one per message xid).
pub const MESSAGE_BRANCH: &str = dtx_proto::MESSAGE_BRANCH;

/// What [`prepare_message`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// The slot is this transaction's: run the business change and commit.
    Fresh,
    /// An earlier local transaction of this message committed it: the business change is done;
    /// do not run it again (just submit the message).
    AlreadyCommitted,
}

fn slot(xid: &str) -> RowKey<'_> {
    RowKey::slot(xid, MESSAGE_BRANCH, Slot::Message)
}

/// Inserts the message's slot as written by `by` (the local transaction or the check-back);
/// true if this call took it, false if it was taken before.
async fn take_slot<C: Conn>(conn: &mut C, xid: &str, by: Action) -> Result<bool, Error> {
    limits::check_scoped_xid(xid)?;
    let outcome = match by {
        Action::Message => Outcome::Success,
        _ => Outcome::Empty,
    };
    let row = NewRow {
        key: slot(xid),
        written_by: by,
        outcome,
        request_hash: None,
    };
    sql::insert(conn, row).await
}

/// Inside the initiator's local transaction: takes the message's slot. [`Error::MessageDropped`]
/// if a check-back took it first - the message is dropped and the transaction must roll back.
pub async fn prepare_message<C: Conn>(conn: &mut C, xid: &str) -> Result<Prepared, Error> {
    if take_slot(conn, xid, Action::Message).await? {
        return Ok(Prepared::Fresh);
    }
    match holder(conn, xid).await? {
        Action::Message => Ok(Prepared::AlreadyCommitted),
        _ => Err(Error::MessageDropped {
            xid: xid.to_string(),
        }),
    }
}

/// The coordinator's check-back, in a transaction of its own (commit it after `Ok`): SUCCESS
/// if the message's local transaction committed (deliver); otherwise takes the slot so it never
/// can, and answers FAILURE (drop).
pub async fn check_back<C: Conn>(conn: &mut C, xid: &str) -> Result<Answer, Error> {
    let dropped = || {
        Reply::refuse(format!(
            "message {xid}: its local transaction did not commit"
        ))
    };
    if take_slot(conn, xid, Action::CheckBack).await? {
        return Ok(Answer::new(dropped(), Detail::EmptyRollback));
    }
    Ok(match holder(conn, xid).await? {
        Action::Message => Answer::new(Reply::ok(), Detail::Duplicate),
        _ => Answer::new(dropped(), Detail::Duplicate),
    })
}

/// Who holds the slot (a locking read of the existing row: waits for its writer's commit).
async fn holder<C: Conn>(conn: &mut C, xid: &str) -> Result<Action, Error> {
    Ok(sql::read(conn, slot(xid))
        .await?
        .ok_or_else(|| Error::Barrier(format!("message slot of {xid} vanished")))?
        .written_by)
}
