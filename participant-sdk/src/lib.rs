//! dtx-sdk: what a service embeds to take part in dtx distributed transactions.
//!
//! * [`barrier`] - the branch barrier: records every branch call in the same local transaction
//!   as its business change, so repeated Confirm/Cancel/compensation are no-ops, a Cancel that
//!   overtakes its Try is an empty rollback, and the late Try is rejected.
//! * [`server`] - a gRPC `Participant` service built from named handlers; it opens the local
//!   transaction, applies the barrier and maps outcomes to the wire.
//! * [`client`] - what an initiator uses: TCC transactions (with a closure form that commits on
//!   `Ok` and rolls back on `Err`) and a typed saga builder.
//! * [`metrics`] - the barrier's counters, through the `metrics` facade (the service's own
//!   exporter picks them up, as it does the idempotency records').
//! * [`idempotency`] - idempotency records for HTTP endpoints, payment callbacks, message
//!   consumers and jobs: the `dtx-idempotency` crate, re-exported. Its canonical-JSON hashes
//!   need this crate's feature `json`, its tower layer the feature `http`.
//!
//! Every database dtx supports works the same way: pass a `sqlx::Pool<sqlx::Postgres>`,
//! `Pool<sqlx::MySql>` or `Pool<sqlx::Sqlite>`; handlers receive that database's connection.
//! Create the barrier table with [`migrate_barrier`], the idempotency table with
//! [`migrate_idempotency`].

pub mod barrier;
pub mod client;
mod error;
pub mod metrics;
pub mod server;

pub use dtx_idempotency as idempotency;

pub use dtx_proto as proto;
pub use dtx_sql::{self as sql, Backend};
pub use error::Error;

/// Creates or upgrades the `dtx_barrier` table in the participant's database.
pub async fn migrate_barrier<DB: Backend>(pool: &dtx_sql::sqlx::Pool<DB>) -> Result<(), Error> {
    Ok(DB::migrate(pool, dtx_sql::Schema::Barrier).await?)
}

/// Creates or upgrades the `dtx_idempotency` table in the service's database.
pub async fn migrate_idempotency<DB: Backend>(pool: &dtx_sql::sqlx::Pool<DB>) -> Result<(), Error> {
    Ok(DB::migrate(pool, dtx_sql::Schema::Idempotency).await?)
}
