//! The crate's one error type.

/// Why a machine could not be built or an event could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A machine that is not one (names, no transitions, a cycle); found when it is built.
    #[error("invalid state machine: {0}")]
    Machine(String),
    /// A state the machine does not declare (in an event, or found in the entity's row).
    #[error("{machine} has no state {state:?}")]
    UnknownState {
        /// The machine's name.
        machine: String,
        /// The undeclared state.
        state: String,
    },
    /// A table or column name that is not a plain SQL identifier.
    #[error("invalid identifier {0:?}: letters, digits and '_' (a schema may prefix it with '.')")]
    Identifier(String),
    /// A fact longer than the log's column.
    #[error("fact is {0} bytes, the limit is {max}", max = crate::MAX_FACT)]
    FactTooLong(usize),
    /// No row has this id.
    #[error("{entity} {id} does not exist")]
    NotFound {
        /// The entity's table.
        entity: String,
        /// The id looked for.
        id: String,
    },
    /// The row kept changing between its read and the conditional update.
    #[error("{entity} {id} changed under {tries} conditional updates in a row")]
    Contended {
        /// The entity's table.
        entity: String,
        /// The row's id.
        id: String,
        /// Conditional updates tried.
        tries: u32,
    },
    /// The database failed; the caller's transaction should be rolled back and retried.
    #[error("database error: {0}")]
    Database(#[from] dtx_sql::sqlx::Error),
    /// The transition log's schema could not be brought up to date.
    #[error("migration failed: {0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
}
