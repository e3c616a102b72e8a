//! [`Conn`]: the connection stores are written against, with positional `?` arguments
//! ([`Arg`]) and typed row getters ([`SqlRow`]), implemented for each dialect's connection.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{LazyLock, RwLock};

use sqlx::Row as _;

use crate::Dialect;

/// One positional argument of a statement. NULLs carry their column type, which PostgreSQL
/// checks.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// An integer column (BIGINT).
    I64(Option<i64>),
    /// A text column.
    Str(Option<&'a str>),
    /// A binary column (BYTEA, BLOB).
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
    /// Column `idx` as an integer; NULL is an error.
    fn i64(&self, idx: usize) -> Result<i64, sqlx::Error>;
    /// Column `idx` as an integer, or `None` for NULL.
    fn opt_i64(&self, idx: usize) -> Result<Option<i64>, sqlx::Error>;
    /// Column `idx` as text; NULL is an error.
    fn text(&self, idx: usize) -> Result<String, sqlx::Error>;
    /// Column `idx` as text, or `None` for NULL.
    fn opt_text(&self, idx: usize) -> Result<Option<String>, sqlx::Error>;
    /// Column `idx` as bytes; NULL is an error.
    fn bytes(&self, idx: usize) -> Result<Vec<u8>, sqlx::Error>;
    /// Column `idx` as bytes, or `None` for NULL.
    fn opt_bytes(&self, idx: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

/// A database connection (usually inside a transaction) that stores are written against.
/// `'static` because every driver's connection is an owned value; saying so once spares each
/// generic caller a `where DB::Conn: 'static` bound.
pub trait Conn: Send + 'static {
    /// The SQL dialect this connection speaks (statements pick their text by it).
    const DIALECT: Dialect;
    /// A result row.
    type Row: SqlRow;

    /// Runs a statement; returns the affected (for MySQL: matched) row count.
    fn execute<'a>(
        &'a mut self,
        sql: &'static str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Runs a query; its first row, if any.
    fn fetch_optional<'a>(
        &'a mut self,
        sql: &'static str,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a;

    /// Runs a query; every row.
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

    /// Like [`Conn::fetch_all`] for SQL built at run time (a query with optional filters), on
    /// the same terms as [`Conn::execute_dynamic`].
    fn fetch_all_dynamic<'a>(
        &'a mut self,
        sql: String,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a;
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
                    let q = bind_args!(sqlx::query::<$db>(dynamic_sql($dialect, sql)), args);
                    Ok(q.execute(&mut *self).await?.rows_affected())
                }
            }

            fn fetch_all_dynamic<'a>(
                &'a mut self,
                sql: String,
                args: &'a [Arg<'a>],
            ) -> impl Future<Output = Result<Vec<$row>, sqlx::Error>> + Send + 'a {
                async move {
                    let q = bind_args!(sqlx::query::<$db>(dynamic_sql($dialect, sql)), args);
                    q.fetch_all(&mut *self).await
                }
            }
        }
    };
}

/// Run-time SQL in the dialect's placeholder form.
fn dynamic_sql(dialect: Dialect, sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(if dialect == Dialect::Postgres {
        numbered_placeholders(&sql)
    } else {
        sql
    })
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
}
