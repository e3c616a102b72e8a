//! The SQL side of dtx, shared by the coordinator's store and the participant SDK.
//!
//! * The **schema** of every store in every dialect lives next to this crate as plain SQL files
//!   (`postgres/`, `mysql/`, `sqlite/`, one folder per schema) and is embedded here;
//!   [`Backend::migrate`] applies one schema, tracking it in its own `dtx_migrations_<schema>`
//!   table so the coordinator and participant schemas can share a database.
//! * A small **dialect layer**: stores are written once against [`Conn`] (execute / fetch with
//!   positional `?` arguments and typed row getters) and run on PostgreSQL, MySQL/MariaDB and
//!   SQLite. SQL that differs between dialects is chosen with [`Sql`]; everything else is
//!   written once with `?` placeholders (translated to `$n` for PostgreSQL, never inside string
//!   literals - our SQL has no `?` in literals).
//!
//! * One **SQL vocabulary**: [`db_enum!`] spells every status stored as text once (and
//!   [`assert_literals_known`] checks the literals in SQL text against those spellings),
//!   [`Savepoint`] isolates part of a transaction, [`delete_limit!`] / [`delete_batched`] /
//!   [`purge_batched`] delete old rows in bounded batches.
//!
//! Why not sqlx's `Any` driver: it has no placeholder translation and drops types; why not
//! generic code over `sqlx::Database`: the trait bounds it needs are not implied and would have to
//! be repeated on every function.

use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::{LazyLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::migrate::Migrator;
use sqlx::pool::PoolOptions;
use sqlx::{Pool, Row as _, Transaction};

pub use sqlx;

mod enums;
mod literals;
mod purge;
mod savepoint;

pub use literals::{assert_literals_known, sql_literals};
pub use purge::{delete_batched, purge_batched};
pub use savepoint::Savepoint;

/// Which SQL dialect a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

/// One positional argument of a statement. NULLs carry their column type, which PostgreSQL
/// checks.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    I64(Option<i64>),
    Str(Option<&'a str>),
    Bytes(Option<&'a [u8]>),
}

macro_rules! arg_from {
    ($variant:ident: $($t:ty => $convert:expr),* $(,)?) => {$(
        impl<'a> From<$t> for Arg<'a> {
            fn from(v: $t) -> Self {
                Arg::$variant(Some($convert(v)))
            }
        }
        impl<'a> From<Option<$t>> for Arg<'a> {
            fn from(v: Option<$t>) -> Self {
                Arg::$variant(v.map($convert))
            }
        }
    )*};
}

arg_from!(I64: i64 => |v| v);
arg_from!(Str: &'a str => |v| v, &'a String => String::as_str);
arg_from!(Bytes: &'a [u8] => |v| v, &'a Vec<u8> => Vec::as_slice);

/// Builds a `&[Arg]` from expressions convertible into [`Arg`].
#[macro_export]
macro_rules! args {
    ($($value:expr),* $(,)?) => { &[$($crate::Arg::from($value)),*] };
}

/// Typed column getters of a result row (by position).
pub trait SqlRow: Send {
    fn i64(&self, idx: usize) -> Result<i64, sqlx::Error>;
    fn opt_i64(&self, idx: usize) -> Result<Option<i64>, sqlx::Error>;
    fn text(&self, idx: usize) -> Result<String, sqlx::Error>;
    fn opt_text(&self, idx: usize) -> Result<Option<String>, sqlx::Error>;
    fn bytes(&self, idx: usize) -> Result<Vec<u8>, sqlx::Error>;
    fn opt_bytes(&self, idx: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

/// A database connection (usually inside a transaction) that stores are written against.
pub trait Conn: Send {
    const DIALECT: Dialect;
    type Row: SqlRow;

    /// Runs a statement; returns the affected (for MySQL: matched) row count.
    fn execute<'a>(
        &'a mut self,
        sql: &'static str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    fn fetch_optional<'a>(
        &'a mut self,
        sql: &'static str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a;

    fn fetch_all<'a>(
        &'a mut self,
        sql: &'static str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a;

    /// Runs argument-free SQL over the simple (text) protocol: savepoints, session settings,
    /// several statements separated by `;`.
    fn execute_raw<'a>(
        &'a mut self,
        sql: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Like [`Conn::execute`] for SQL built at run time (e.g. a multi-row insert of n rows).
    /// The caller guarantees the text contains no user input, only placeholders.
    fn execute_dynamic<'a>(
        &'a mut self,
        sql: String,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;
}

/// SQL text that differs between dialects.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    pub postgres: &'static str,
    pub mysql: &'static str,
    pub sqlite: &'static str,
}

impl Sql {
    /// The same text for every dialect.
    pub const fn same(sql: &'static str) -> Self {
        Sql {
            postgres: sql,
            mysql: sql,
            sqlite: sql,
        }
    }

    /// Every dialect's text (PostgreSQL, MySQL, SQLite), e.g. for
    /// [`assert_literals_known`].
    pub const fn texts(&self) -> [&'static str; 3] {
        [self.postgres, self.mysql, self.sqlite]
    }

    pub const fn pick(&self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Postgres => self.postgres,
            Dialect::MySql => self.mysql,
            Dialect::Sqlite => self.sqlite,
        }
    }
}

/// `INSERT ... ` that silently does nothing when the row's unique key exists: `ON CONFLICT DO
/// NOTHING` (PostgreSQL, SQLite) or `INSERT IGNORE` (MySQL). The affected row count tells
/// whether this statement inserted the row. MySQL's IGNORE would also turn data errors into
/// warnings, which is why every value is validated against the column sizes before it gets here.
#[macro_export]
macro_rules! insert_ignore {
    ($into:literal) => {
        $crate::Sql {
            postgres: concat!("INSERT INTO ", $into, " ON CONFLICT DO NOTHING"),
            mysql: concat!("INSERT IGNORE INTO ", $into),
            sqlite: concat!("INSERT INTO ", $into, " ON CONFLICT DO NOTHING"),
        }
    };
}

/// Rewrites `?` placeholders as `$1, $2, ...` for PostgreSQL, once per distinct statement.
fn postgres_sql(sql: &'static str) -> &'static str {
    static CACHE: LazyLock<RwLock<HashMap<usize, &'static str>>> = LazyLock::new(Default::default);
    let key = sql.as_ptr() as usize ^ (sql.len() << 48);
    if let Some(found) = CACHE.read().expect("sql cache").get(&key) {
        return found;
    }
    let translated: &'static str = Box::leak(numbered_placeholders(sql).into_boxed_str());
    CACHE.write().expect("sql cache").insert(key, translated);
    translated
}

fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut q = $query;
        for arg in $args {
            q = match *arg {
                Arg::I64(v) => q.bind(v),
                Arg::Str(v) => q.bind(v),
                Arg::Bytes(v) => q.bind(v),
            };
        }
        q
    }};
}

macro_rules! impl_conn {
    ($conn:ty, $db:ty, $row:ty, $dialect:expr, $translate:expr) => {
        impl SqlRow for $row {
            fn i64(&self, idx: usize) -> Result<i64, sqlx::Error> {
                self.try_get(idx)
            }
            fn opt_i64(&self, idx: usize) -> Result<Option<i64>, sqlx::Error> {
                self.try_get(idx)
            }
            fn text(&self, idx: usize) -> Result<String, sqlx::Error> {
                self.try_get(idx)
            }
            fn opt_text(&self, idx: usize) -> Result<Option<String>, sqlx::Error> {
                self.try_get(idx)
            }
            fn bytes(&self, idx: usize) -> Result<Vec<u8>, sqlx::Error> {
                self.try_get(idx)
            }
            fn opt_bytes(&self, idx: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
                self.try_get(idx)
            }
        }

        impl Conn for $conn {
            const DIALECT: Dialect = $dialect;
            type Row = $row;

            fn execute<'a>(
                &'a mut self,
                sql: &'static str,
                args: &'a [Arg<'a>],
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    let sql: &'static str = $translate(sql);
                    let q = bind_args!(sqlx::query::<$db>(sql), args);
                    Ok(q.execute(&mut *self).await?.rows_affected())
                }
            }

            fn fetch_optional<'a>(
                &'a mut self,
                sql: &'static str,
                args: &'a [Arg<'a>],
            ) -> impl Future<Output = Result<Option<$row>, sqlx::Error>> + Send + 'a {
                async move {
                    let sql: &'static str = $translate(sql);
                    let q = bind_args!(sqlx::query::<$db>(sql), args);
                    q.fetch_optional(&mut *self).await
                }
            }

            fn fetch_all<'a>(
                &'a mut self,
                sql: &'static str,
                args: &'a [Arg<'a>],
            ) -> impl Future<Output = Result<Vec<$row>, sqlx::Error>> + Send + 'a {
                async move {
                    let sql: &'static str = $translate(sql);
                    let q = bind_args!(sqlx::query::<$db>(sql), args);
                    q.fetch_all(&mut *self).await
                }
            }

            fn execute_raw<'a>(
                &'a mut self,
                sql: &'static str,
            ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a {
                async move {
                    sqlx::raw_sql(sql).execute(&mut *self).await?;
                    Ok(())
                }
            }

            fn execute_dynamic<'a>(
                &'a mut self,
                sql: String,
                args: &'a [Arg<'a>],
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    let sql = if $dialect == Dialect::Postgres {
                        numbered_placeholders(&sql)
                    } else {
                        sql
                    };
                    let q = bind_args!(sqlx::query::<$db>(sqlx::AssertSqlSafe(sql)), args);
                    Ok(q.execute(&mut *self).await?.rows_affected())
                }
            }
        }
    };
}

fn unchanged(sql: &'static str) -> &'static str {
    sql
}

impl_conn!(
    sqlx::PgConnection,
    sqlx::Postgres,
    sqlx::postgres::PgRow,
    Dialect::Postgres,
    postgres_sql
);
impl_conn!(
    sqlx::MySqlConnection,
    sqlx::MySql,
    sqlx::mysql::MySqlRow,
    Dialect::MySql,
    unchanged
);
impl_conn!(
    sqlx::SqliteConnection,
    sqlx::Sqlite,
    sqlx::sqlite::SqliteRow,
    Dialect::Sqlite,
    unchanged
);

/// The schemas dtx keeps, each migrated and versioned independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// The coordinator's global transactions and branches.
    Coordinator,
    /// The participant's branch barrier table.
    Barrier,
    /// The participant's general idempotency records.
    Idempotency,
}

impl Schema {
    fn table(self) -> &'static str {
        match self {
            Schema::Coordinator => "dtx_migrations_coordinator",
            Schema::Barrier => "dtx_migrations_barrier",
            Schema::Idempotency => "dtx_migrations_idempotency",
        }
    }
}

fn with_table(mut migrator: Migrator, schema: Schema) -> Migrator {
    migrator.dangerous_set_table_name(schema.table());
    migrator
}

macro_rules! migrators {
    ($coordinator:literal, $barrier:literal, $idempotency:literal) => {
        |schema: Schema| -> Migrator {
            let migrator = match schema {
                Schema::Coordinator => sqlx::migrate!($coordinator),
                Schema::Barrier => sqlx::migrate!($barrier),
                Schema::Idempotency => sqlx::migrate!($idempotency),
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
                let $o = <$options>::from_str(url)?;
                pool_options(max_connections).connect_with($tune).await
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
    ("postgres/coordinator", "postgres/barrier", "postgres/idempotency"),
    begin: |pool| pool.begin(),
    options: sqlx::postgres::PgConnectOptions => |o| o
);

backend!(
    sqlx::MySql,
    sqlx::MySqlConnection,
    ("mysql/coordinator", "mysql/barrier", "mysql/idempotency"),
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
    ("sqlite/coordinator", "sqlite/barrier", "sqlite/idempotency"),
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

/// Replaces the database name (the URL path) of `url`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{}", &base[..path_start], name);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Which database a URL names, by scheme.
pub fn dialect_of_url(url: &str) -> Option<Dialect> {
    let scheme = url.split(':').next()?;
    match scheme {
        "postgres" | "postgresql" => Some(Dialect::Postgres),
        "mysql" | "mariadb" => Some(Dialect::MySql),
        "sqlite" => Some(Dialect::Sqlite),
        _ => None,
    }
}

/// The unique key of the row already exists.
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// The transaction lost a lock conflict (deadlock, serialization failure, lock wait timeout,
/// SQLite busy) and rolled back: running it again is safe and will usually succeed.
pub fn is_lock_conflict(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let Some(code) = db.code() else {
        return false;
    };
    match code.as_ref() {
        // PostgreSQL: serialization_failure, deadlock_detected, lock_not_available.
        "40001" | "40P01" | "55P03" => true,
        // MySQL/MariaDB: deadlock, lock wait timeout.
        "1213" | "1205" => true,
        // SQLite: SQLITE_BUSY / SQLITE_LOCKED and their extended codes.
        c => c.parse::<i32>().is_ok_and(|n| matches!(n & 0xff, 5 | 6)),
    }
}

/// The database could not be reached or the connection broke: the outcome of an in-flight
/// commit is unknown.
pub fn is_connection_error(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
    )
}

/// Milliseconds since the Unix epoch; every dtx timestamp column holds this (BIGINT), which
/// keeps the three dialects identical.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered_once_per_statement() {
        assert_eq!(
            numbered_placeholders("UPDATE t SET a = ? WHERE b = ? AND c = ?"),
            "UPDATE t SET a = $1 WHERE b = $2 AND c = $3"
        );
        let sql = "SELECT ? FROM x WHERE y = ?";
        assert_eq!(postgres_sql(sql), "SELECT $1 FROM x WHERE y = $2");
        assert!(std::ptr::eq(postgres_sql(sql), postgres_sql(sql)));
    }

    #[test]
    fn urls_name_their_dialect() {
        assert_eq!(dialect_of_url("postgres://x/y"), Some(Dialect::Postgres));
        assert_eq!(dialect_of_url("mysql://root@h/db"), Some(Dialect::MySql));
        assert_eq!(dialect_of_url("sqlite://dtx.db"), Some(Dialect::Sqlite));
        assert_eq!(dialect_of_url("redis://x"), None);
    }

    #[test]
    fn insert_ignore_differs_per_dialect() {
        let sql = insert_ignore!("t (a) VALUES (?)");
        assert_eq!(
            sql.pick(Dialect::MySql),
            "INSERT IGNORE INTO t (a) VALUES (?)"
        );
        assert_eq!(
            sql.pick(Dialect::Postgres),
            "INSERT INTO t (a) VALUES (?) ON CONFLICT DO NOTHING"
        );
    }

    #[test]
    fn database_names_are_swapped_in_urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("mysql://root@h:3306/test?ssl-mode=disabled", "y"),
            "mysql://root@h:3306/y?ssl-mode=disabled"
        );
        assert_eq!(with_database("postgres://h", "z"), "postgres://h/z");
    }
}
