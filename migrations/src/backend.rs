//! [`Backend`]: one database dtx runs on (pools, transactions, migrations) and [`Schema`].

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::pool::PoolOptions;
use sqlx::{Pool, Transaction};

use crate::Conn;

/// The schemas dtx keeps, each migrated and versioned independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// The coordinator's global transactions and branches.
    Coordinator,
    /// The participant's branch barrier table.
    Barrier,
    /// The participant's general idempotency records.
    Idempotency,
    /// The transactional outbox: events written with the business change, relayed to a broker.
    Outbox,
    /// The log of forward-only state transitions (which fact moved an entity into each state).
    Transitions,
    /// Applied payment callbacks and the ones parked for a person.
    Payments,
}

impl Schema {
    fn table(self) -> &'static str {
        match self {
            Schema::Coordinator => "dtx_migrations_coordinator",
            Schema::Barrier => "dtx_migrations_barrier",
            Schema::Idempotency => "dtx_migrations_idempotency",
            Schema::Outbox => "dtx_migrations_outbox",
            Schema::Transitions => "dtx_migrations_transitions",
            Schema::Payments => "dtx_migrations_payments",
        }
    }
}

fn with_table(mut migrator: Migrator, schema: Schema) -> Migrator {
    migrator.dangerous_set_table_name(schema.table());
    migrator
}

macro_rules! migrators {
    ($coordinator:literal, $barrier:literal, $idempotency:literal, $outbox:literal,
     $transitions:literal, $payments:literal) => {
        |schema: Schema| -> Migrator {
            let migrator = match schema {
                Schema::Coordinator => sqlx::migrate!($coordinator),
                Schema::Barrier => sqlx::migrate!($barrier),
                Schema::Idempotency => sqlx::migrate!($idempotency),
                Schema::Outbox => sqlx::migrate!($outbox),
                Schema::Transitions => sqlx::migrate!($transitions),
                Schema::Payments => sqlx::migrate!($payments),
            };
            with_table(migrator, schema)
        }
    };
}

/// A database dtx runs on: PostgreSQL, MySQL/MariaDB or SQLite (`sqlx::Postgres`,
/// `sqlx::MySql`, `sqlx::Sqlite`).
pub trait Backend: sqlx::Database + Sized {
    /// The connection type stores are written against.
    type Conn: Conn;

    /// Borrows the connection of a transaction.
    fn conn<'t>(tx: &'t mut Transaction<'static, Self>) -> &'t mut Self::Conn;

    /// Borrows a pooled connection outside any transaction (autocommit reads).
    fn pooled(conn: &mut sqlx::pool::PoolConnection<Self>) -> &mut Self::Conn;

    /// Begins a transaction the way dtx needs it: `BEGIN IMMEDIATE` on SQLite (so a transaction
    /// that reads before it writes cannot fail with SQLITE_BUSY on the upgrade), READ COMMITTED
    /// on MySQL (no gap locks from the duplicate-key checks of other transactions' reads).
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send;

    /// Opens a pool with dtx's connection settings.
    fn connect(
        url: &str,
        max_connections: u32,
    ) -> impl Future<Output = Result<Pool<Self>, sqlx::Error>> + Send;

    /// Runs SQL built at run time outside any transaction over the simple protocol (DDL,
    /// `CREATE DATABASE`, session setup). The caller guarantees the text is trusted.
    fn execute_script(
        pool: &Pool<Self>,
        sql: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Applies `schema`'s migrations (idempotent, safe to run from several processes at once).
    fn migrate(
        pool: &Pool<Self>,
        schema: Schema,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send;
}

/// The parts of a [`Backend`] impl that only differ in types and folder names.
macro_rules! backend {
    ($db:ty, $conn:ty, $migrations:tt, begin: |$pool:ident| $begin:expr,
     options: $options:ty => |$o:ident| $tune:expr) => {
        impl Backend for $db {
            type Conn = $conn;

            fn pooled(conn: &mut sqlx::pool::PoolConnection<Self>) -> &mut Self::Conn {
                conn
            }

            fn conn<'t>(tx: &'t mut Transaction<'static, Self>) -> &'t mut Self::Conn {
                tx
            }

            async fn begin($pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
                $begin.await
            }

            async fn connect(url: &str, max_connections: u32) -> Result<Pool<Self>, sqlx::Error> {
                use sqlx::ConnectOptions as _;
                let $o = <$options>::from_str(url)?;
                let options = $tune;
                match pool_options(max_connections).connect_with(options.clone()).await {
                    // The pool retried a refused or rejected connect until its acquire timeout
                    // (riding out a database that is still starting) and says only that it
                    // timed out; one more attempt says why.
                    Err(sqlx::Error::PoolTimedOut) => match options.connect().await {
                        Err(cause) => Err(cause),
                        Ok(_) => Err(sqlx::Error::PoolTimedOut),
                    },
                    pool => pool,
                }
            }

            async fn execute_script(pool: &Pool<Self>, sql: String) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
                Ok(())
            }

            async fn migrate(pool: &Pool<Self>, schema: Schema) -> Result<(), sqlx::migrate::MigrateError> {
                migrators! $migrations(schema)
                .run(pool)
                .await
            }
        }
    };
}

backend!(
    sqlx::Postgres,
    sqlx::PgConnection,
    (
        "postgres/coordinator",
        "postgres/barrier",
        "postgres/idempotency",
        "postgres/outbox",
        "postgres/transitions",
        "postgres/payments"
    ),
    begin: |pool| pool.begin(),
    options: sqlx::postgres::PgConnectOptions => |o| o
);

backend!(
    sqlx::MySql,
    sqlx::MySqlConnection,
    (
        "mysql/coordinator",
        "mysql/barrier",
        "mysql/idempotency",
        "mysql/outbox",
        "mysql/transitions",
        "mysql/payments"
    ),
    // READ COMMITTED: no gap locks taken by the duplicate-key checks of concurrent inserts.
    // ROLLBACK first: a begin cancelled after the server started the transaction but before
    // sqlx recorded it returns the connection to the pool inside a transaction nobody owns,
    // and every later begin on it would fail (error 1568). Nothing ran in such a transaction.
    begin: |pool| pool.begin_with(
        "ROLLBACK; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
    ),
    options: sqlx::mysql::MySqlConnectOptions => |o| o
);

backend!(
    sqlx::Sqlite,
    sqlx::SqliteConnection,
    (
        "sqlite/coordinator",
        "sqlite/barrier",
        "sqlite/idempotency",
        "sqlite/outbox",
        "sqlite/transitions",
        "sqlite/payments"
    ),
    // IMMEDIATE: take the write lock up front, so a transaction that reads before it writes
    // cannot fail with SQLITE_BUSY when it upgrades.
    begin: |pool| pool.begin_with("BEGIN IMMEDIATE"),
    options: sqlx::sqlite::SqliteConnectOptions => |o| {
        use sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
        o.create_if_missing(true)
            // WAL lets readers run beside the single writer; FULL keeps every commit durable
            // across power loss, which a coordinator's decisions need.
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true)
    }
);

fn pool_options<DB: sqlx::Database>(max_connections: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
}
