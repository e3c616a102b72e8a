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
//!
//! A whole TCC transaction, runnable as it stands: a coordinator in this process (in a
//! deployment, the `coordinator` binary), one participant with a stock table and the barrier,
//! and an initiator that holds an item and commits, after which the Confirm has sold it.
//!
//! ```
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use clap::Parser as _;
//! use dtx_sdk::Backend as _;
//! use dtx_sdk::barrier::Reply;
//! use dtx_sdk::client::{Coordinator, TccBranch, TccOptions};
//! use dtx_sdk::server::ParticipantServer;
//! use dtx_sdk::sql::sqlx::{self, Row as _};
//! use tonic::transport::server::TcpIncoming;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let coordinator_url = format!("http://{}", listener.local_addr()?);
//! let store = format!("sqlite://{}", std::env::temp_dir().join(format!("dtx-doc-{}.db", std::process::id())).display());
//! let config = dtx_coordinator::config::Config::try_parse_from(["coordinator", "--store", &store])?;
//! tokio::spawn(dtx_coordinator::server::run(config, listener, std::future::pending()));
//!
//! // The participant's database: its business table and the barrier table side by side.
//! let pool = sqlx::Sqlite::connect("sqlite::memory:", 1).await?;
//! dtx_sdk::migrate_barrier(&pool).await?;
//! sqlx::raw_sql("CREATE TABLE stock (held INTEGER, sold INTEGER); INSERT INTO stock VALUES (0, 0)")
//!     .execute(&pool)
//!     .await?;
//! let service = ParticipantServer::new(pool.clone())
//!     .tcc(
//!         "hold",
//!         |conn, _req| Box::pin(async move {
//!             sqlx::query("UPDATE stock SET held = held + 1").execute(&mut *conn).await?;
//!             Ok(Reply::ok())
//!         }),
//!         |conn, _req| Box::pin(async move {
//!             sqlx::query("UPDATE stock SET held = held - 1, sold = sold + 1")
//!                 .execute(&mut *conn)
//!                 .await?;
//!             Ok(Reply::ok())
//!         }),
//!         |conn, _req| Box::pin(async move {
//!             sqlx::query("UPDATE stock SET held = held - 1").execute(&mut *conn).await?;
//!             Ok(Reply::ok())
//!         }),
//!     )
//!     .into_service();
//! let participant = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let participant_url = format!("http://{}", participant.local_addr()?);
//! tokio::spawn(
//!     tonic::transport::Server::builder()
//!         .add_service(service)
//!         .serve_with_incoming(TcpIncoming::from(participant)),
//! );
//!
//! let coordinator = Coordinator::connect(&coordinator_url).await?;
//! coordinator
//!     .tcc(TccOptions::default(), |tx| async move {
//!         tx.call(TccBranch::new(&participant_url, "hold", b"sku-1".to_vec())).await?;
//!         Ok::<_, dtx_sdk::Error>(())
//!     })
//!     .await?;
//! // `tcc` returned after the commit and its Confirm (TccOptions::wait_phase_two).
//! let row = sqlx::query("SELECT held, sold FROM stock").fetch_one(&pool).await?;
//! assert_eq!((row.get::<i64, _>(0), row.get::<i64, _>(1)), (0, 1));
//! # Ok(()) }
//! ```

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
