//! A tiny business ledger the test participants keep in their real database, through the
//! barrier: account balances (with a "held" column for TCC reservations) and an effect log with
//! one row per business effect, so tests can assert "exactly once" from the business tables.

use dtx_sql::sqlx::{self, Pool};
use dtx_sql::{Backend, Conn, SqlRow, args, now_ms};

use crate::db::TestBackend;

/// Creates the ledger tables (portable DDL: the same text works on all three databases).
pub async fn create_tables<DB: TestBackend>(pool: &Pool<DB>) {
    for sql in [
        "CREATE TABLE IF NOT EXISTS accounts (id VARCHAR(64) NOT NULL PRIMARY KEY, \
         balance BIGINT NOT NULL, held BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS effects (xid VARCHAR(128) NOT NULL, branch_id VARCHAR(64) NOT NULL, \
         kind VARCHAR(16) NOT NULL, amount BIGINT NOT NULL, at_ms BIGINT NOT NULL)",
    ] {
        DB::execute_script(pool, sql.to_string())
            .await
            .expect("create ledger table");
    }
}

/// Opens an account with a starting balance.
pub async fn open_account<DB: Backend>(pool: &Pool<DB>, id: &str, balance: i64) {
    let mut tx = DB::begin(pool).await.expect("begin");
    DB::conn(&mut tx)
        .execute(
            "INSERT INTO accounts (id, balance, held) VALUES (?, ?, 0)",
            args![id, balance],
        )
        .await
        .expect("open account");
    tx.commit().await.expect("commit");
}

/// Moves `delta` into the balance and `held_delta` into the held column of `account`, and logs
/// the effect; fails (so the handler's transaction rolls back) if the balance would go negative.
pub async fn apply<C: Conn>(
    conn: &mut C,
    account: &str,
    delta: i64,
    held_delta: i64,
    xid: &str,
    branch_id: &str,
    kind: &str,
) -> Result<(), sqlx::Error> {
    let rows = conn
        .execute(
            "UPDATE accounts SET balance = balance + ?, held = held + ? \
             WHERE id = ? AND balance + ? >= 0",
            args![delta, held_delta, account, delta],
        )
        .await?;
    if rows != 1 {
        return Err(sqlx::Error::Protocol(format!(
            "account {account} missing or balance too low for {delta}"
        )));
    }
    conn.execute(
        "INSERT INTO effects (xid, branch_id, kind, amount, at_ms) VALUES (?, ?, ?, ?, ?)",
        args![xid, branch_id, kind, delta, now_ms()],
    )
    .await?;
    Ok(())
}

/// (balance, held) of an account.
pub async fn account<DB: Backend>(pool: &Pool<DB>, id: &str) -> (i64, i64) {
    let mut tx = DB::begin(pool).await.expect("begin");
    let row = DB::conn(&mut tx)
        .fetch_optional("SELECT balance, held FROM accounts WHERE id = ?", args![id])
        .await
        .expect("read account")
        .expect("account exists");
    let out = (row.i64(0).unwrap(), row.i64(1).unwrap());
    tx.commit().await.expect("commit");
    out
}

/// How many effects of `kind` were logged for (xid, branch).
pub async fn effects<DB: Backend>(pool: &Pool<DB>, xid: &str, branch_id: &str, kind: &str) -> i64 {
    let mut tx = DB::begin(pool).await.expect("begin");
    let row = DB::conn(&mut tx)
        .fetch_optional(
            "SELECT COUNT(*) FROM effects WHERE xid = ? AND branch_id = ? AND kind = ?",
            args![xid, branch_id, kind],
        )
        .await
        .expect("count effects")
        .expect("a count row");
    let n = row.i64(0).unwrap();
    tx.commit().await.expect("commit");
    n
}

/// How many barrier rows exist for (xid, branch).
pub async fn barrier_rows<DB: Backend>(pool: &Pool<DB>, xid: &str, branch_id: &str) -> i64 {
    let mut tx = DB::begin(pool).await.expect("begin");
    let row = DB::conn(&mut tx)
        .fetch_optional(
            "SELECT COUNT(*) FROM dtx_barrier WHERE xid = ? AND branch_id = ?",
            args![xid, branch_id],
        )
        .await
        .expect("count barrier rows")
        .expect("a count row");
    let n = row.i64(0).unwrap();
    tx.commit().await.expect("commit");
    n
}
