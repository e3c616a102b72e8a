//! A begin cancelled between the server starting the transaction and sqlx recording it (a
//! client that hangs up mid-call drops the handler's future) returns the connection to the
//! pool inside a transaction nobody owns. The next begin on that connection must still work,
//! and must not commit whatever the orphan held.

use dtx_sql::Conn as _;
use dtx_tests::db::{TestBackend, TestDb, with_db};

async fn next_begin_recovers<DB: TestBackend>(db: &TestDb<DB>) -> Vec<i64> {
    // One connection, so the orphaned one is the one the next begin gets.
    let pool = DB::connect(&db.url, 1).await.unwrap();
    DB::execute_script(&pool, "CREATE TABLE t (v BIGINT NOT NULL)".into())
        .await
        .unwrap();
    {
        let mut conn = pool.acquire().await.unwrap();
        // A transaction sqlx does not know about, as a cancelled begin leaves it.
        DB::pooled(&mut conn)
            .execute_raw("START TRANSACTION")
            .await
            .unwrap();
        DB::pooled(&mut conn)
            .execute("INSERT INTO t (v) VALUES (?)", dtx_sql::args!(1i64))
            .await
            .unwrap();
    }
    let mut tx = DB::begin(&pool)
        .await
        .expect("begin on a connection left inside a transaction");
    DB::conn(&mut tx)
        .execute("INSERT INTO t (v) VALUES (?)", dtx_sql::args!(2i64))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    pool.close().await;
    let rows = db.rows("SELECT v FROM t ORDER BY v").await;
    rows.iter()
        .map(|r| dtx_sql::SqlRow::i64(r, 0).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_begin_rolls_back_an_orphaned_transaction() {
    with_db::<dtx_sql::sqlx::MySql, _, _>(&[], |db| async move {
        // Before the fix: error 1568, "Transaction characteristics can't be changed while a
        // transaction is in progress", on every later begin on that connection.
        assert_eq!(next_begin_recovers(db).await, vec![2]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_begin_works_on_an_orphaned_transaction() {
    with_db::<dtx_sql::sqlx::Postgres, _, _>(&[], |db| async move {
        // PostgreSQL only warns about BEGIN inside a transaction; the next commit ends both, so
        // the orphan's insert (put there by this test) commits too. A cancelled begin leaves no
        // statement in its orphan, so in real use nothing extra commits.
        assert_eq!(next_begin_recovers(db).await, vec![1, 2]);
    })
    .await;
}
