//! The crate's one error type (set-up and operator calls; a callback itself always ends in a
//! [`crate::Handled`]).

/// Why a callback set-up or an operator call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration that cannot work (a column name, an unknown state, a topic).
    #[error("invalid payment callback configuration: {0}")]
    Config(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    /// The payments tables' schema could not be brought up to date.
    #[error("migration failed: {0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
}

impl From<dtx_state::Error> for Error {
    fn from(e: dtx_state::Error) -> Self {
        Error::Config(e.to_string())
    }
}
