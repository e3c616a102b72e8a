//! Retention: deleting old rows in bounded batches, each batch its own short transaction, so
//! a purge never holds long locks next to live traffic.

use std::future::Future;

use sqlx::{Pool, Transaction};

use crate::{Arg, Backend, Conn, Sql};

/// `DELETE` of at most `?` rows matching `where`, per dialect; the limit is the statement's
/// last placeholder (after those of `where`). PostgreSQL and SQLite have no `DELETE ... LIMIT`,
/// so they delete the rows of a limited subquery (by `ctid` / `rowid`); MySQL deletes with
/// `ORDER BY order_by LIMIT ?` (ordered, so the statement is deterministic for statement-based
/// replication).
///
/// ```
/// const PURGE: dtx_sql::Sql = dtx_sql::delete_limit!(
///     from: "t", where: "created_ms < ?", order_by: "created_ms"
/// );
/// assert_eq!(
///     PURGE.mysql,
///     "DELETE FROM t WHERE created_ms < ? ORDER BY created_ms LIMIT ?"
/// );
/// ```
#[macro_export]
macro_rules! delete_limit {
    (from: $table:literal, where: $cond:literal, order_by: $order:literal $(,)?) => {
        $crate::Sql {
            postgres: concat!(
                "DELETE FROM ",
                $table,
                " WHERE ctid IN (SELECT ctid FROM ",
                $table,
                " WHERE ",
                $cond,
                " LIMIT ?)"
            ),
            mysql: concat!(
                "DELETE FROM ",
                $table,
                " WHERE ",
                $cond,
                " ORDER BY ",
                $order,
                " LIMIT ?"
            ),
            sqlite: concat!(
                "DELETE FROM ",
                $table,
                " WHERE rowid IN (SELECT rowid FROM ",
                $table,
                " WHERE ",
                $cond,
                " LIMIT ?)"
            ),
        }
    };
}

/// Runs purge rounds until one deletes fewer than `batch` rows (at least 1); returns the total.
///
/// Each round is its own transaction ([`Backend::begin`], committed after the round): `round`
/// gets the open transaction and the batch size, deletes at most that many units (rows, or
/// for a purge across tables, e.g. parents with their children, parents) and hands the
/// transaction back with how many it deleted. The transaction travels by value so the round
/// can be an ordinary `async move` closure borrowing from its caller. An error ends the purge
/// (the round's transaction is rolled back; earlier rounds stay committed).
///
/// ```no_run
/// # async fn demo<DB: dtx_sql::Backend>(pool: &dtx_sql::sqlx::Pool<DB>) -> Result<u64, dtx_sql::sqlx::Error> {
/// use dtx_sql::{Conn, args};
/// let cutoff = 0i64;
/// dtx_sql::purge_batched(pool, 500, |mut tx, limit| async move {
///     let deleted = DB::conn(&mut tx)
///         .execute("DELETE FROM t WHERE id IN (SELECT id FROM t WHERE at < ? LIMIT ?)",
///                  args![cutoff, limit])
///         .await?;
///     Ok((tx, deleted))
/// })
/// .await
/// # }
/// ```
pub async fn purge_batched<DB, E, F, Fut>(
    pool: &Pool<DB>,
    batch: i64,
    mut round: F,
) -> Result<u64, E>
where
    DB: Backend,
    E: From<sqlx::Error>,
    F: FnMut(Transaction<'static, DB>, i64) -> Fut,
    Fut: Future<Output = Result<(Transaction<'static, DB>, u64), E>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let tx = DB::begin(pool).await?;
        let (tx, deleted) = round(tx, batch).await?;
        tx.commit().await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}

/// [`purge_batched`] of one delete-with-limit statement (as [`delete_limit!`](crate::delete_limit)
/// builds it): runs `statement` with `args` followed by the batch size as its last argument
/// (the `LIMIT ?`), until fewer than `batch` rows go; returns the total.
pub async fn delete_batched<DB: Backend>(
    pool: &Pool<DB>,
    statement: Sql,
    args: &[Arg<'_>],
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let sql = statement.pick(<DB::Conn as Conn>::DIALECT);
    purge_batched(pool, batch, |mut tx, limit| {
        let mut all = args.to_vec();
        all.push(Arg::from(limit));
        async move {
            let deleted = DB::conn(&mut tx).execute(sql, &all).await?;
            Ok((tx, deleted))
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use crate::Dialect;

    const PURGE: crate::Sql = delete_limit!(
        from: "dtx_barrier",
        where: "created_ms < ?",
        order_by: "created_ms"
    );

    #[test]
    fn delete_limit_is_spelled_per_dialect() {
        assert_eq!(
            PURGE.pick(Dialect::Postgres),
            "DELETE FROM dtx_barrier WHERE ctid IN \
             (SELECT ctid FROM dtx_barrier WHERE created_ms < ? LIMIT ?)"
        );
        assert_eq!(
            PURGE.pick(Dialect::MySql),
            "DELETE FROM dtx_barrier WHERE created_ms < ? ORDER BY created_ms LIMIT ?"
        );
        assert_eq!(
            PURGE.pick(Dialect::Sqlite),
            "DELETE FROM dtx_barrier WHERE rowid IN \
             (SELECT rowid FROM dtx_barrier WHERE created_ms < ? LIMIT ?)"
        );
    }

    /// The statement the idempotency records' retention spells by hand today, literals and all.
    #[test]
    fn delete_limit_reproduces_the_idempotency_purge() {
        const PURGE: crate::Sql = delete_limit!(
            from: "dtx_idempotency",
            where: "scope = ? AND created_at < ? AND updated_at < ? AND status <> 'PROCESSING'",
            order_by: "created_at"
        );
        assert_eq!(
            PURGE.postgres,
            "DELETE FROM dtx_idempotency WHERE ctid IN \
             (SELECT ctid FROM dtx_idempotency WHERE scope = ? AND created_at < ? \
             AND updated_at < ? AND status <> 'PROCESSING' LIMIT ?)"
        );
        assert_eq!(
            PURGE.mysql,
            "DELETE FROM dtx_idempotency WHERE scope = ? AND created_at < ? AND updated_at < ? \
             AND status <> 'PROCESSING' ORDER BY created_at LIMIT ?"
        );
        assert_eq!(
            PURGE.sqlite,
            "DELETE FROM dtx_idempotency WHERE rowid IN \
             (SELECT rowid FROM dtx_idempotency WHERE scope = ? AND created_at < ? \
             AND updated_at < ? AND status <> 'PROCESSING' LIMIT ?)"
        );
        crate::assert_literals_known(&PURGE.texts(), &[&["PROCESSING"]]);
    }
}
