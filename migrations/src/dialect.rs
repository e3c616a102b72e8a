//! [`Dialect`] and [`Sql`]: the SQL text that differs between dialects.

/// Which SQL dialect a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

/// SQL text that differs between dialects.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    /// PostgreSQL's text.
    pub postgres: &'static str,
    /// MySQL's and MariaDB's text.
    pub mysql: &'static str,
    /// SQLite's text.
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
    /// [`assert_literals_known`](crate::assert_literals_known).
    pub const fn texts(&self) -> [&'static str; 3] {
        [self.postgres, self.mysql, self.sqlite]
    }

    /// The text for `dialect`.
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
    ($($into:tt)+) => {
        $crate::Sql {
            postgres: concat!("INSERT INTO ", $($into)+, " ON CONFLICT DO NOTHING"),
            mysql: concat!("INSERT IGNORE INTO ", $($into)+),
            sqlite: concat!("INSERT INTO ", $($into)+, " ON CONFLICT DO NOTHING"),
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_ignore_differs_per_dialect() {
        let sql = crate::insert_ignore!("t (a) VALUES (?)");
        assert_eq!(
            sql.pick(Dialect::MySql),
            "INSERT IGNORE INTO t (a) VALUES (?)"
        );
        assert_eq!(
            sql.pick(Dialect::Postgres),
            "INSERT INTO t (a) VALUES (?) ON CONFLICT DO NOTHING"
        );
    }
}
