//! dtx-sql's shared helpers on real databases: the savepoint guard and the batched purges (one
//! delete-with-limit statement, and a purge across two tables by a selected key list - the
//! coordinator's shape). On SQLite, PostgreSQL and MariaDB.

use dtx_sql::sqlx::Pool;
use dtx_sql::{Arg, Backend, Conn, Savepoint, Sql, SqlRow, args, delete_limit};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::test_on_all_databases;

const CREATE: &str = "CREATE TABLE parent (id VARCHAR(16) NOT NULL PRIMARY KEY, \
                      created_ms BIGINT NOT NULL); \
                      CREATE TABLE child (parent_id VARCHAR(16) NOT NULL, n BIGINT NOT NULL)";
const INSERT_PARENT: &str = "INSERT INTO parent (id, created_ms) VALUES (?, ?)";
const INSERT_CHILD: &str = "INSERT INTO child (parent_id, n) VALUES (?, ?)";
const COUNT_PARENTS: &str = "SELECT COUNT(*) FROM parent";
const COUNT_CHILDREN: &str = "SELECT COUNT(*) FROM child";
const OLD_PARENTS: &str = "SELECT id FROM parent WHERE created_ms < ? ORDER BY created_ms LIMIT ?";
const PURGE_PARENTS: Sql = delete_limit!(
    from: "parent",
    where: "created_ms < ?",
    order_by: "created_ms"
);

async fn count<DB: Backend>(pool: &Pool<DB>, sql: &'static str) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let row = DB::pooled(&mut conn)
        .fetch_optional(sql, &[])
        .await
        .unwrap()
        .unwrap();
    row.i64(0).unwrap()
}

/// `n` parents created at 0..n ms, each with two children.
/// The test's tables, created on this database.
async fn create<DB: TestBackend>(db: &TestDb<DB>) {
    DB::execute_script(&db.pool, CREATE.to_string())
        .await
        .unwrap();
}

async fn fill<DB: Backend>(pool: &Pool<DB>, n: i64) {
    let mut tx = DB::begin(pool).await.unwrap();
    let conn = DB::conn(&mut tx);
    for i in 0..n {
        let id = format!("p{i}");
        conn.execute(INSERT_PARENT, args![&id, i]).await.unwrap();
        for c in 0..2 {
            conn.execute(INSERT_CHILD, args![&id, c]).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
}

async fn savepoints_keep_or_undo<DB: TestBackend>(db: &'static TestDb<DB>) {
    create(db).await;
    let mut tx = DB::begin(&db.pool).await.unwrap();
    let conn = DB::conn(&mut tx);
    conn.execute(INSERT_PARENT, args!["kept-before", 1])
        .await
        .unwrap();

    let undone = Savepoint::begin(conn, "dtx_test").await.unwrap();
    assert_eq!(undone.name(), "dtx_test");
    conn.execute(INSERT_PARENT, args!["undone", 2])
        .await
        .unwrap();
    undone.rollback(conn).await.unwrap();

    // The name is free again after a rollback, and the transaction goes on.
    let kept = Savepoint::begin(conn, "dtx_test").await.unwrap();
    conn.execute(INSERT_PARENT, args!["kept", 3]).await.unwrap();
    kept.release(conn).await.unwrap();

    let by_outcome = Savepoint::begin(conn, "dtx_test").await.unwrap();
    conn.execute(INSERT_PARENT, args!["undone-too", 4])
        .await
        .unwrap();
    by_outcome.end(conn, false).await.unwrap();
    tx.commit().await.unwrap();

    let mut conn = db.pool.acquire().await.unwrap();
    let ids: Vec<String> = DB::pooled(&mut conn)
        .fetch_all("SELECT id FROM parent ORDER BY created_ms", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.text(0).unwrap())
        .collect();
    assert_eq!(ids, ["kept-before", "kept"]);
}
test_on_all_databases!(savepoints_keep_or_undo, &[]);

async fn one_statement_deletes_in_batches<DB: TestBackend>(db: &'static TestDb<DB>) {
    create(db).await;
    fill(&db.pool, 25).await;
    // 20 rows older than 20 in batches of 7: rounds of 7, 7, 6.
    let deleted = dtx_sql::delete_batched(&db.pool, PURGE_PARENTS, args![20i64], 7)
        .await
        .unwrap();
    assert_eq!(deleted, 20);
    assert_eq!(count(&db.pool, COUNT_PARENTS).await, 5);
    // An exact multiple ends with an empty round; nothing old is left for a second run.
    let deleted = dtx_sql::delete_batched(&db.pool, PURGE_PARENTS, args![25i64], 5)
        .await
        .unwrap();
    assert_eq!(deleted, 5);
    let none = dtx_sql::delete_batched(&db.pool, PURGE_PARENTS, args![25i64], 5)
        .await
        .unwrap();
    assert_eq!(none, 0);
}
test_on_all_databases!(one_statement_deletes_in_batches, &[]);

async fn rounds_purge_across_tables<DB: TestBackend>(db: &'static TestDb<DB>) {
    create(db).await;
    fill(&db.pool, 10).await;
    let before_ms = 8i64;
    let rounds = std::sync::Mutex::new(Vec::new());
    let rounds = &rounds;
    let deleted = dtx_sql::purge_batched(&db.pool, 3, |mut tx, limit| async move {
        let conn = DB::conn(&mut tx);
        let ids: Vec<String> = conn
            .fetch_all(OLD_PARENTS, args![before_ms, limit])
            .await?
            .iter()
            .map(|r| r.text(0))
            .collect::<Result<_, _>>()?;
        if !ids.is_empty() {
            let marks = vec!["?"; ids.len()].join(", ");
            let list: Vec<Arg<'_>> = ids.iter().map(Arg::from).collect();
            conn.execute_dynamic(
                format!("DELETE FROM child WHERE parent_id IN ({marks})"),
                &list,
            )
            .await?;
            conn.execute_dynamic(format!("DELETE FROM parent WHERE id IN ({marks})"), &list)
                .await?;
        }
        rounds.lock().unwrap().push(ids.len());
        Ok::<_, dtx_sql::sqlx::Error>((tx, ids.len() as u64))
    })
    .await
    .unwrap();
    assert_eq!(deleted, 8);
    assert_eq!(*rounds.lock().unwrap(), [3, 3, 2]);
    assert_eq!(count(&db.pool, COUNT_PARENTS).await, 2);
    assert_eq!(count(&db.pool, COUNT_CHILDREN).await, 4);
}
test_on_all_databases!(rounds_purge_across_tables, &[]);
