//! [`Savepoint`]: one way to isolate part of a transaction.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

use crate::Conn;

/// An open `SAVEPOINT` inside the caller's transaction, ended by [`Savepoint::release`] (keep
/// what ran since [`Savepoint::begin`]) or [`Savepoint::rollback`] (undo it), or by
/// [`Savepoint::end`] choosing between them.
///
/// Why a token and not a drop guard: ending a savepoint runs SQL, which `Drop` cannot do in
/// async Rust. Instead the type is `#[must_use]` and ending it consumes it, so a savepoint is
/// begun only into a binding, ended at most once, and an unended binding is a compiler
/// warning (unused variable) unless some path ends it. Dropping it unended is right only on
/// an error path where the caller rolls back the whole transaction (the savepoint goes with
/// it); that is logged at debug level.
///
/// ```no_run
/// # async fn demo<C: dtx_sql::Conn>(conn: &mut C, ok: bool) -> Result<(), dtx_sql::sqlx::Error> {
/// let savepoint = dtx_sql::Savepoint::begin(conn, "dtx_example").await?;
/// // ... statements that may have to be undone ...
/// savepoint.end(conn, ok).await?; // release if ok, else roll back to the savepoint
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "end a savepoint with release(), rollback() or end()"]
pub struct Savepoint {
    statements: &'static Statements,
    open: bool,
}

#[derive(Debug)]
struct Statements {
    name: &'static str,
    begin: &'static str,
    release: &'static str,
    rollback: &'static str,
}

/// The three statements of a savepoint name, built once per distinct name.
fn statements(name: &'static str) -> &'static Statements {
    static CACHE: LazyLock<RwLock<HashMap<&'static str, &'static Statements>>> =
        LazyLock::new(Default::default);
    if let Some(found) = CACHE.read().expect("savepoint cache").get(name) {
        return found;
    }
    assert!(
        is_identifier(name),
        "savepoint name {name:?} is not a plain SQL identifier"
    );
    let built: &'static Statements = Box::leak(Box::new(Statements {
        name,
        begin: leak(format!("SAVEPOINT {name}")),
        release: leak(format!("RELEASE SAVEPOINT {name}")),
        // ROLLBACK TO leaves the savepoint defined; releasing it too frees the name again.
        rollback: leak(format!(
            "ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}"
        )),
    }));
    CACHE
        .write()
        .expect("savepoint cache")
        .entry(name)
        .or_insert(built)
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Savepoint {
    /// Runs `SAVEPOINT name`. `name` is a plain SQL identifier (letters, digits, `_`; panics
    /// otherwise). Beginning a savepoint of a name that is open again nests a new one that
    /// shadows it (PostgreSQL, SQLite) or replaces it (MySQL): end one before reusing its name.
    pub async fn begin<C: Conn>(conn: &mut C, name: &'static str) -> Result<Self, sqlx::Error> {
        let statements = statements(name);
        conn.execute_raw(statements.begin).await?;
        Ok(Savepoint {
            statements,
            open: true,
        })
    }

    /// The savepoint's name.
    pub fn name(&self) -> &'static str {
        self.statements.name
    }

    /// `RELEASE SAVEPOINT`: keeps everything since [`Savepoint::begin`] as part of the
    /// transaction.
    pub async fn release<C: Conn>(self, conn: &mut C) -> Result<(), sqlx::Error> {
        self.end(conn, true).await
    }

    /// `ROLLBACK TO SAVEPOINT` (then releases it): undoes everything since
    /// [`Savepoint::begin`]; the transaction goes on.
    pub async fn rollback<C: Conn>(self, conn: &mut C) -> Result<(), sqlx::Error> {
        self.end(conn, false).await
    }

    /// [`Savepoint::release`] if `keep`, else [`Savepoint::rollback`]: one call for callers
    /// that decide by an outcome, so no branch can miss the end.
    pub async fn end<C: Conn>(mut self, conn: &mut C, keep: bool) -> Result<(), sqlx::Error> {
        self.open = false;
        let statements = self.statements;
        let sql = if keep {
            statements.release
        } else {
            statements.rollback
        };
        conn.execute_raw(sql).await
    }
}

impl Drop for Savepoint {
    fn drop(&mut self) {
        if self.open {
            tracing::debug!(
                savepoint = self.statements.name,
                "savepoint dropped unended: its transaction must be rolled back"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_built_once_per_name() {
        let a = statements("dtx_test_sp");
        assert_eq!(a.begin, "SAVEPOINT dtx_test_sp");
        assert_eq!(a.release, "RELEASE SAVEPOINT dtx_test_sp");
        assert_eq!(
            a.rollback,
            "ROLLBACK TO SAVEPOINT dtx_test_sp; RELEASE SAVEPOINT dtx_test_sp"
        );
        assert!(std::ptr::eq(a, statements("dtx_test_sp")));
    }

    #[test]
    #[should_panic(expected = "not a plain SQL identifier")]
    fn names_must_be_identifiers() {
        statements("x; DROP TABLE t");
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("dtx_barrier"));
        assert!(is_identifier("_a1"));
        assert!(!is_identifier("1a"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("a-b"));
    }
}
