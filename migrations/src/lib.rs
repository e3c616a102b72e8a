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
//! * One **SQL vocabulary**: [`db_enum!`] spells every status stored as text once (and
//!   [`assert_literals_known`] checks the literals in SQL text against those spellings),
//!   [`Savepoint`] isolates part of a transaction, [`delete_limit!`] / [`delete_batched`] /
//!   [`purge_batched`] delete old rows in bounded batches.
//! * **Cancellation**: [`detached`] runs a database conversation to its end even when the
//!   request that started it goes away; [`rerun_lock_conflicts`] runs a local transaction
//!   again after it lost a lock conflict.
//!
//! Why not sqlx's `Any` driver: it has no placeholder translation and drops types; why not
//! generic code over `sqlx::Database`: the trait bounds it needs are not implied and would have to
//! be repeated on every function.

use std::time::{SystemTime, UNIX_EPOCH};

pub use sqlx;

mod backend;
mod conn;
mod detached;
mod dialect;
mod enums;
mod literals;
mod purge;
mod rerun;
mod savepoint;

pub use backend::{Backend, Schema};
pub use conn::{Arg, Conn, SqlRow};
pub use detached::detached;
pub use dialect::{Dialect, Sql};
pub use literals::{assert_literals_known, sql_literals};
pub use purge::{delete_batched, purge_batched};
pub use rerun::{LockConflict, rerun_lock_conflicts};
pub use savepoint::Savepoint;

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
    fn urls_name_their_dialect() {
        assert_eq!(dialect_of_url("postgres://x/y"), Some(Dialect::Postgres));
        assert_eq!(dialect_of_url("mysql://root@h/db"), Some(Dialect::MySql));
        assert_eq!(dialect_of_url("sqlite://dtx.db"), Some(Dialect::Sqlite));
        assert_eq!(dialect_of_url("redis://x"), None);
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
