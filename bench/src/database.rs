//! The databases a run uses: a fresh `dtx_bench` database per store (a temporary directory for
//! SQLite), the raw single-insert baseline, and the participants' business database.

use std::path::PathBuf;
use std::sync::Arc;

use dtx_sdk::Backend;
use dtx_sdk::sql::sqlx::{self, Pool};
use dtx_sdk::sql::{Conn, Sql, args};

use crate::Error;
use crate::participants::{self, ROWS_TABLE};
use crate::workload::{LocalPool, LocalTransactions};

/// A store the coordinator runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    Sqlite,
    Postgres,
    Mysql,
}

/// Where one store's run keeps its data.
pub struct BenchDatabase {
    pub store: Store,
    /// The coordinator's store URL.
    pub store_url: String,
    /// The participants' business database and the raw baseline's (the same server as the
    /// store; for SQLite files next to it, since one SQLite file has one writer at a time).
    pub business_url: String,
    pub raw_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl BenchDatabase {
    /// Creates an empty `dtx_bench` database on the server `admin_url` points at (dropping
    /// the previous run's), or a temporary directory for SQLite.
    pub async fn create(store: Store, admin_url: &str) -> Result<Self, Error> {
        const NAME: &str = "dtx_bench";
        let setup = |e: sqlx::Error| Error::Setup(format!("{store:?} at {admin_url}: {e}"));
        let url = match store {
            Store::Sqlite => {
                let dir = tempfile::tempdir()?;
                let file = |name: &str| -> PathBuf { dir.path().join(name) };
                return Ok(BenchDatabase {
                    store,
                    store_url: format!("sqlite://{}", file("coordinator.db").display()),
                    business_url: format!("sqlite://{}", file("business.db").display()),
                    raw_url: format!("sqlite://{}", file("raw.db").display()),
                    _dir: Some(dir),
                });
            }
            // FORCE: a previous run's connections may still be closing.
            Store::Postgres => recreate::<sqlx::Postgres>(admin_url, NAME, "WITH (FORCE)").await,
            Store::Mysql => recreate::<sqlx::MySql>(admin_url, NAME, "").await,
        };
        Ok(Self::on_server(store, url.map_err(setup)?))
    }

    fn on_server(store: Store, url: String) -> Self {
        BenchDatabase {
            store,
            store_url: url.clone(),
            business_url: url.clone(),
            raw_url: url,
            _dir: None,
        }
    }

    /// The database's durability settings, for the report.
    pub async fn settings(&self) -> Result<Vec<(String, String)>, Error> {
        let e = |e: sqlx::Error| Error::Setup(e.to_string());
        Ok(match self.store {
            Store::Sqlite => vec![
                ("journal_mode".into(), "wal".into()),
                ("synchronous".into(), "full".into()),
            ],
            Store::Postgres => {
                let pool = sqlx::Postgres::connect(&self.raw_url, 1).await.map_err(e)?;
                let mut out = Vec::new();
                for name in [
                    "server_version",
                    "synchronous_commit",
                    "fsync",
                    "wal_sync_method",
                ] {
                    let sql = format!("SHOW {name}");
                    let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .fetch_one(&pool)
                        .await
                        .map_err(e)?;
                    out.push((name.to_string(), value));
                }
                out
            }
            Store::Mysql => {
                let pool = sqlx::MySql::connect(&self.raw_url, 1).await.map_err(e)?;
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SHOW VARIABLES WHERE Variable_name IN ('version', \
                     'innodb_flush_log_at_trx_commit', 'sync_binlog', 'log_bin', \
                     'innodb_flush_method')",
                )
                .fetch_all(&pool)
                .await
                .map_err(e)?;
                rows
            }
        })
    }
}

/// Drops (`DROP DATABASE IF EXISTS name <drop_options>`) and creates database `name` on the
/// server `admin_url` points at; returns its URL.
async fn recreate<DB: Backend>(
    admin_url: &str,
    name: &str,
    drop_options: &str,
) -> Result<String, sqlx::Error> {
    let admin = DB::connect(admin_url, 1).await?;
    DB::execute_script(
        &admin,
        format!("DROP DATABASE IF EXISTS {name} {drop_options}"),
    )
    .await?;
    DB::execute_script(&admin, format!("CREATE DATABASE {name}")).await?;
    admin.close().await;
    Ok(dtx_sdk::sql::with_database(admin_url, name))
}

/// One durable single-row INSERT per call, autocommit: what the database can commit.
pub struct RawInserts<DB: Backend> {
    pool: Pool<DB>,
}

const RAW_TABLE: Sql = Sql {
    postgres: "CREATE TABLE IF NOT EXISTS dtx_bench_raw (id BIGSERIAL PRIMARY KEY, v VARCHAR(64) NOT NULL)",
    mysql: "CREATE TABLE IF NOT EXISTS dtx_bench_raw (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64) NOT NULL)",
    sqlite: "CREATE TABLE IF NOT EXISTS dtx_bench_raw (id INTEGER PRIMARY KEY, v VARCHAR(64) NOT NULL)",
};

impl<DB: Backend> RawInserts<DB> {
    /// A pool of `clients` connections with the coordinator store's connection settings.
    pub async fn open(url: &str, clients: usize) -> Result<Arc<Self>, Error> {
        let pool = DB::connect(url, clients as u32).await?;
        let dialect = <DB::Conn as Conn>::DIALECT;
        DB::execute_script(&pool, RAW_TABLE.pick(dialect).to_string()).await?;
        Ok(Arc::new(RawInserts { pool }))
    }

    pub async fn insert_one(&self) -> Result<(), String> {
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        DB::pooled(&mut conn)
            .execute("INSERT INTO dtx_bench_raw (v) VALUES (?)", args!("bench"))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Opens the business database with the barrier and the rows table, and serves the rows
/// participant on it; returns its URL and the message initiators' local transactions there.
pub async fn serve_rows<DB: Backend>(
    url: &str,
    connections: u32,
    security: &crate::security::Security,
) -> Result<(String, Arc<dyn LocalTransactions>), Error> {
    let pool: Pool<DB> = DB::connect(url, connections).await?;
    dtx_sdk::migrate_barrier(&pool).await?;
    DB::execute_script(&pool, ROWS_TABLE.to_string()).await?;
    let local: Arc<dyn LocalTransactions> = Arc::new(LocalPool(pool.clone()));
    let make = |calls| {
        let server = participants::rows_participant(pool);
        match calls {
            Some(calls) => server.verify_calls(calls),
            None => server,
        }
        .into_service()
    };
    Ok((participants::serve(make, security).await?, local))
}
