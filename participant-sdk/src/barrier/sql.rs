//! The barrier's SQL: the only place that knows the `dtx_barrier` table.
//!
//! Every statement's arguments are built in one place, from one named struct ([`RowKey`],
//! [`NewRow`]), and every value stored as text is a [`db_enum!`] spelling ([`Action`],
//! [`Slot`], [`Outcome`]); the test below checks that SQL text spells no other.

use dtx_sql::{Backend, Conn, Savepoint, Sql, SqlRow, args, db_enum, delete_limit, insert_ignore};

use super::{Action, Row};
use crate::Error;

db_enum! {
    /// `outcome` of a barrier row.
    pub(super) enum Outcome {
        /// A Try/Action row whose handler is running in the inserting transaction.
        Pending = "pending",
        Success = "success",
        Failure = "failure",
        /// A row a Cancel/Compensate claimed before its Try/Action (which now never runs).
        Empty = "none",
    }
}

db_enum! {
    /// `action` of a row that is no call's own row.
    pub(super) enum Slot {
        /// A branch's one phase-two slot: Confirm and Cancel both insert it, `written_by` says
        /// which of them won.
        PhaseTwo = "phase2",
        /// A two-phase message's one slot: the initiator's local transaction and the
        /// coordinator's check-back both insert it, `written_by` says which of them was first.
        Message = "message",
    }
}

/// The savepoint isolating a handler's (and the barrier's own tentative) changes.
const SAVEPOINT: &str = "dtx_barrier";

const INSERT: Sql = insert_ignore!(
    "dtx_barrier (xid, branch_id, action, written_by, outcome, result, request_hash, created_ms) \
     VALUES (?, ?, ?, ?, ?, NULL, ?, ?)"
);

/// Reads an existing row with a shared lock: it waits for a concurrent writer of the same row
/// and then reads its committed version, whatever the isolation level. The row exists (the
/// caller's insert just conflicted with it), so no gap lock is taken.
const READ: Sql = Sql {
    postgres: "SELECT written_by, outcome, result, request_hash FROM dtx_barrier \
               WHERE xid = ? AND branch_id = ? AND action = ? FOR SHARE",
    mysql: "SELECT written_by, outcome, result, request_hash FROM dtx_barrier \
            WHERE xid = ? AND branch_id = ? AND action = ? LOCK IN SHARE MODE",
    sqlite: "SELECT written_by, outcome, result, request_hash FROM dtx_barrier \
             WHERE xid = ? AND branch_id = ? AND action = ?",
};

const RECORD: &str = "UPDATE dtx_barrier SET outcome = ?, result = ? \
                      WHERE xid = ? AND branch_id = ? AND action = ?";

/// Deletes one bounded batch of old rows.
const PURGE: Sql = delete_limit!(
    from: "dtx_barrier",
    where: "created_ms < ?",
    order_by: "created_ms"
);

/// The key of one barrier row.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowKey<'a> {
    pub xid: &'a str,
    pub branch_id: &'a str,
    /// An [`Action`] (the call's own row) or a [`Slot`] spelling.
    pub action: &'static str,
}

impl<'a> RowKey<'a> {
    /// The own row of `action`.
    pub fn of(xid: &'a str, branch_id: &'a str, action: Action) -> Self {
        RowKey {
            xid,
            branch_id,
            action: action.as_str(),
        }
    }

    /// The `slot` row of a branch.
    pub fn slot(xid: &'a str, branch_id: &'a str, slot: Slot) -> Self {
        RowKey {
            xid,
            branch_id,
            action: slot.as_str(),
        }
    }
}

/// A row to insert.
#[derive(Debug, Clone, Copy)]
pub(super) struct NewRow<'a> {
    pub key: RowKey<'a>,
    pub written_by: Action,
    pub outcome: Outcome,
    /// Hex request hash, only on Try/Action rows written by their own call.
    pub request_hash: Option<&'a str>,
}

/// Inserts a row unless its key exists; true if this call inserted it.
pub(super) async fn insert<C: Conn>(conn: &mut C, row: NewRow<'_>) -> Result<bool, Error> {
    let NewRow {
        key,
        written_by,
        outcome,
        request_hash,
    } = row;
    let rows = conn
        .execute(
            INSERT.pick(C::DIALECT),
            args![
                key.xid,
                key.branch_id,
                key.action,
                written_by.as_str(),
                outcome.as_str(),
                request_hash,
                dtx_sql::now_ms()
            ],
        )
        .await?;
    Ok(rows == 1)
}

pub(super) async fn read<C: Conn>(conn: &mut C, key: RowKey<'_>) -> Result<Option<Row>, Error> {
    let row = conn
        .fetch_optional(
            READ.pick(C::DIALECT),
            args![key.xid, key.branch_id, key.action],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let written_by = row.text(0)?;
    let outcome = row.text(1)?;
    Ok(Some(Row {
        written_by: Action::parse(&written_by).ok_or_else(|| unknown("written_by", &written_by))?,
        outcome: Outcome::parse(&outcome).ok_or_else(|| unknown("outcome", &outcome))?,
        result: row.opt_bytes(2)?.unwrap_or_default(),
        // CHAR(64) on PostgreSQL/MySQL; trimmed in case a driver pads it.
        request_hash: row.opt_text(3)?.map(|h| h.trim_end().to_string()),
    }))
}

fn unknown(column: &str, value: &str) -> Error {
    Error::Barrier(format!("unknown {column} {value:?} in dtx_barrier"))
}

/// Records the first outcome (and result) of a Try/Action row.
pub(super) async fn record<C: Conn>(
    conn: &mut C,
    key: RowKey<'_>,
    outcome: Outcome,
    result: &[u8],
) -> Result<(), Error> {
    conn.execute(
        RECORD,
        args![outcome.as_str(), result, key.xid, key.branch_id, key.action],
    )
    .await?;
    Ok(())
}

/// Opens the barrier's savepoint.
pub(super) async fn savepoint<C: Conn>(conn: &mut C) -> Result<Savepoint, Error> {
    Ok(Savepoint::begin(conn, SAVEPOINT).await?)
}

/// Deletes rows created before `cutoff_ms` (Unix ms) in batches of at most `batch` rows, each
/// batch its own short transaction so retention never holds long locks. Returns the total.
pub async fn purge_older_than<DB: Backend>(
    pool: &dtx_sql::sqlx::Pool<DB>,
    cutoff_ms: i64,
    batch: u32,
) -> Result<u64, Error> {
    Ok(dtx_sql::delete_batched(pool, PURGE, args![cutoff_ms], i64::from(batch)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement above, in every dialect.
    fn statements() -> Vec<&'static str> {
        let mut all = vec![RECORD];
        for sql in [INSERT, READ, PURGE] {
            all.extend(sql.texts());
        }
        all
    }

    #[test]
    fn sql_spells_only_enum_spellings() {
        dtx_sql::assert_literals_known(
            &statements(),
            &[Action::SPELLINGS, Slot::SPELLINGS, Outcome::SPELLINGS],
        );
    }

    #[test]
    fn migrations_spell_only_enum_spellings() {
        let migrations = [
            include_str!(
                "../../../migrations/postgres/barrier/0002_phase_two_and_request_hash.sql"
            ),
            include_str!("../../../migrations/mysql/barrier/0002_phase_two_and_request_hash.sql"),
            include_str!("../../../migrations/sqlite/barrier/0002_phase_two_and_request_hash.sql"),
        ];
        dtx_sql::assert_literals_known(
            &migrations,
            &[Action::SPELLINGS, Slot::SPELLINGS, Outcome::SPELLINGS],
        );
    }

    #[test]
    fn spellings_are_the_stored_ones() {
        // Rows already in databases carry these; they must never change.
        assert_eq!(
            Outcome::SPELLINGS,
            ["pending", "success", "failure", "none"]
        );
        assert_eq!(Slot::SPELLINGS, ["phase2", "message"]);
        assert_eq!(
            Action::SPELLINGS,
            [
                "try",
                "confirm",
                "cancel",
                "action",
                "compensate",
                "check_back",
                "message"
            ]
        );
    }
}
