//! Per-test databases on the real PostgreSQL, MariaDB and SQLite.
//!
//! Every test gets a database of its own (`CREATE DATABASE dtx_t_...` on PostgreSQL and
//! MariaDB, a temporary file on SQLite), so tests never see each other's rows. The servers are
//! found through `DTX_TEST_POSTGRES_URL` and `DTX_TEST_MYSQL_URL` (defaults: the loopback
//! servers of the development machine). When a server is unreachable the test is skipped with a
//! message - unless `CI=true`, where it fails: CI must never go green by skipping.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dtx_sql::sqlx::{self, Pool};
use dtx_sql::{Backend, Dialect, Schema};

/// Admin URL of the PostgreSQL server tests create their databases on.
pub fn postgres_url() -> String {
    std::env::var("DTX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// Admin URL of the MySQL/MariaDB server tests create their databases on.
pub fn mysql_url() -> String {
    std::env::var("DTX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// True when running under CI, where an unreachable database fails instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A database created for one test; dropped by [`TestDb::drop_database`] (leftovers from
/// crashed runs are removed by `.ci/run`).
pub struct TestDb<DB: Backend> {
    pub pool: Pool<DB>,
    /// URL of this test's database (for processes started by the test).
    pub url: String,
    name: String,
    admin_url: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_name() -> String {
    format!(
        "dtx_t_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// What the tests need of each backend beyond [`Backend`].
pub trait TestBackend: Backend {
    const DIALECT: Dialect;
    fn admin_url() -> Option<String>;
}

impl TestBackend for sqlx::Postgres {
    const DIALECT: Dialect = Dialect::Postgres;
    fn admin_url() -> Option<String> {
        Some(postgres_url())
    }
}

impl TestBackend for sqlx::MySql {
    const DIALECT: Dialect = Dialect::MySql;
    fn admin_url() -> Option<String> {
        Some(mysql_url())
    }
}

impl TestBackend for sqlx::Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;
    fn admin_url() -> Option<String> {
        None
    }
}

impl<DB: TestBackend> TestDb<DB> {
    /// Creates a fresh database with the given dtx schemas applied, or `None` (test skipped)
    /// when the server is unreachable outside CI.
    pub async fn create(schemas: &[Schema]) -> Option<Self> {
        let name = unique_name();
        let (url, admin_url, dir) = match DB::admin_url() {
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("test.db").display());
                (url, None, Some(dir))
            }
            Some(admin) => {
                let admin_pool = match DB::connect(&admin, 1).await {
                    Ok(pool) => pool,
                    Err(e) => {
                        let message = format!("{} at {admin} is unreachable: {e}", DB::NAME);
                        if in_ci() {
                            panic!("{message} (CI=true: database tests must not be skipped)");
                        }
                        eprintln!("SKIPPED: {message}");
                        return None;
                    }
                };
                DB::execute_script(&admin_pool, format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create test database");
                admin_pool.close().await;
                (dtx_sql::with_database(&admin, &name), Some(admin), None)
            }
        };
        let pool = DB::connect(&url, 16)
            .await
            .expect("connect to the test database");
        for schema in schemas {
            DB::migrate(&pool, *schema)
                .await
                .expect("migrate test database");
        }
        Some(TestDb {
            pool,
            url,
            name,
            admin_url,
            _dir: dir,
        })
    }

    /// Every row `sql` returns, read in a transaction of its own.
    pub async fn rows(&self, sql: &'static str) -> Vec<<DB::Conn as dtx_sql::Conn>::Row> {
        use dtx_sql::Conn as _;
        let mut tx = DB::begin(&self.pool).await.expect("begin");
        let rows = DB::conn(&mut tx).fetch_all(sql, &[]).await.expect(sql);
        tx.commit().await.expect("commit");
        rows
    }

    /// Closes the pool and drops the database. Bounded: a connection that never comes back to
    /// the pool (a test's own finding, reported by the test) must not hang the teardown, so the
    /// database is dropped from under whatever connections are left.
    pub async fn drop_database(&self) {
        if tokio::time::timeout(Duration::from_secs(10), self.pool.close())
            .await
            .is_err()
        {
            eprintln!(
                "test database {}: connections still checked out 10 s into closing",
                self.name
            );
        }
        if let Some(admin) = &self.admin_url
            && let Ok(admin_pool) = DB::connect(admin, 1).await
        {
            let sql = match DB::DIALECT {
                Dialect::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
                // A session left inside a transaction holds metadata locks the drop would wait
                // on for a year (the default lock_wait_timeout).
                _ => format!(
                    "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {}",
                    self.name
                ),
            };
            if let Err(e) = DB::execute_script(&admin_pool, sql).await {
                eprintln!("could not drop test database {}: {e}", self.name);
            }
            admin_pool.close().await;
        }
    }
}

/// Runs `body` against a fresh database (skipped outside CI if the server is down) and drops
/// the database afterwards if the body returned.
pub async fn with_db<DB, F, Fut>(schemas: &[Schema], body: F)
where
    DB: TestBackend,
    F: FnOnce(&'static TestDb<DB>) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(db) = TestDb::<DB>::create(schemas).await else {
        return;
    };
    // Leaked for the test's duration so spawned tasks can borrow it; the process ends soon.
    let db: &'static TestDb<DB> = Box::leak(Box::new(db));
    body(db).await;
    db.drop_database().await;
}

/// Declares one `#[tokio::test]` per database for a generic async test body
/// `async fn body<DB: TestBackend>(db: &'static TestDb<DB>)`, in a module named after it.
#[macro_export]
macro_rules! test_on_all_databases {
    ($body:ident, $schemas:expr) => {
        mod $body {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                $crate::db::with_db::<dtx_sql::sqlx::Sqlite, _, _>($schemas, super::$body).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                $crate::db::with_db::<dtx_sql::sqlx::Postgres, _, _>($schemas, super::$body).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mariadb() {
                $crate::db::with_db::<dtx_sql::sqlx::MySql, _, _>($schemas, super::$body).await;
            }
        }
    };
}

/// A test binary's main: runs `run::<DB>(args)` on the backend its `--db` URL names.
#[macro_export]
macro_rules! run_on_backend_of {
    ($url:expr, $run:ident($args:expr)) => {{
        let url: String = $url.to_string();
        match dtx_sql::dialect_of_url(&url) {
            Some(dtx_sql::Dialect::Postgres) => $run::<dtx_sql::sqlx::Postgres>($args).await,
            Some(dtx_sql::Dialect::MySql) => $run::<dtx_sql::sqlx::MySql>($args).await,
            Some(dtx_sql::Dialect::Sqlite) => $run::<dtx_sql::sqlx::Sqlite>($args).await,
            None => panic!("--db {url:?}: not a database URL"),
        }
    }};
}
