//! The barrier's SQL: the only place that knows the `dtx_barrier` table.

use dtx_sql::{Backend, Conn, Sql, SqlRow, args, insert_ignore, now_ms};

use super::Row;
use crate::Error;

/// `outcome` of a Try/Action row whose handler is running in the inserting transaction.
pub(super) const PENDING: &str = "pending";
pub(super) const SUCCESS: &str = "success";
pub(super) const FAILURE: &str = "failure";
/// `outcome` of a row a Cancel/Compensate claimed before its Try/Action.
pub(super) const NONE: &str = "none";
/// `action` of a branch's one phase-two slot: Confirm and Cancel both insert it, `written_by`
/// says which of them won.
pub(super) const PHASE_TWO: &str = "phase2";

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

/// Deletes one bounded batch of old rows (each dialect spells "delete with a limit" its own way).
const PURGE: Sql = Sql {
    postgres: "DELETE FROM dtx_barrier WHERE ctid IN \
               (SELECT ctid FROM dtx_barrier WHERE created_ms < ? LIMIT ?)",
    mysql: "DELETE FROM dtx_barrier WHERE created_ms < ? ORDER BY created_ms LIMIT ?",
    sqlite: "DELETE FROM dtx_barrier WHERE rowid IN \
             (SELECT rowid FROM dtx_barrier WHERE created_ms < ? LIMIT ?)",
};

/// Inserts a row unless its key exists; true if this call inserted it. `request_hash` (hex)
/// only on Try/Action rows written by their own call.
pub(super) async fn insert<C: Conn>(
    conn: &mut C,
    xid: &str,
    branch_id: &str,
    action: &str,
    written_by: &str,
    outcome: &str,
    request_hash: Option<&str>,
) -> Result<bool, Error> {
    let sql = INSERT.pick(C::DIALECT);
    let rows = conn
        .execute(
            sql,
            args![
                xid,
                branch_id,
                action,
                written_by,
                outcome,
                request_hash,
                now_ms()
            ],
        )
        .await?;
    Ok(rows == 1)
}

pub(super) async fn read<C: Conn>(
    conn: &mut C,
    xid: &str,
    branch_id: &str,
    action: &str,
) -> Result<Option<Row>, Error> {
    let row = conn
        .fetch_optional(READ.pick(C::DIALECT), args![xid, branch_id, action])
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Row {
        written_by: row.text(0)?,
        outcome: row.text(1)?,
        result: row.opt_bytes(2)?.unwrap_or_default(),
        // CHAR(64) on PostgreSQL/MySQL; trimmed in case a driver pads it.
        request_hash: row.opt_text(3)?.map(|h| h.trim_end().to_string()),
    }))
}

pub(super) async fn record<C: Conn>(
    conn: &mut C,
    xid: &str,
    branch_id: &str,
    action: &str,
    outcome: &str,
    result: &[u8],
) -> Result<(), Error> {
    conn.execute(RECORD, args![outcome, result, xid, branch_id, action])
        .await?;
    Ok(())
}

pub(super) async fn savepoint<C: Conn>(conn: &mut C) -> Result<(), Error> {
    Ok(conn.execute_raw("SAVEPOINT dtx_barrier").await?)
}

pub(super) async fn release_savepoint<C: Conn>(conn: &mut C) -> Result<(), Error> {
    Ok(conn.execute_raw("RELEASE SAVEPOINT dtx_barrier").await?)
}

pub(super) async fn rollback_to_savepoint<C: Conn>(conn: &mut C) -> Result<(), Error> {
    Ok(conn
        .execute_raw("ROLLBACK TO SAVEPOINT dtx_barrier")
        .await?)
}

/// Deletes rows created before `cutoff_ms` (Unix ms) in batches of at most `batch` rows, each
/// batch its own short transaction so retention never holds long locks. Returns the total.
pub async fn purge_older_than<DB: Backend>(
    pool: &dtx_sql::sqlx::Pool<DB>,
    cutoff_ms: i64,
    batch: u32,
) -> Result<u64, Error> {
    let batch = i64::from(batch.max(1));
    let mut total = 0;
    loop {
        let mut tx = DB::begin(pool).await?;
        let deleted = DB::conn(&mut tx)
            .execute(
                PURGE.pick(<DB::Conn as Conn>::DIALECT),
                args![cutoff_ms, batch],
            )
            .await?;
        tx.commit().await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
