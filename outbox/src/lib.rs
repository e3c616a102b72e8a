//! dtx-outbox: a transactional outbox. A service writes each event it owes the world in the
//! same local transaction as the business change that causes it ([`enqueue`]); a [`Relay`]
//! publishes the rows to a broker and marks each sent only after the broker confirmed it. So an
//! event is published if and only if its business change committed, at least once - and with
//! the broker's de-duplication by the event's id ([`JetStream`] sets `Nats-Msg-Id`) and a
//! consumer that keys its idempotency record by that id, its effect happens once.
//!
//! * Order per key: a row is published only after every earlier row of its key was sent (a
//!   parked row holds its key back until an operator [`republish`]es it).
//! * Several relays may run against one database: rows are claimed with a lease, `SKIP LOCKED`
//!   on PostgreSQL and MySQL/MariaDB (SQLite has one writer at a time).
//! * A publish that fails is retried with backoff; after the attempt limit the row is parked,
//!   logged and counted (`dtx_outbox_parked_total`), and [`backlog`] reports it.
//! * Sent rows are deleted after the retention period.
//!
//! ```no_run
//! # async fn run(pool: dtx_sql::sqlx::Pool<dtx_sql::sqlx::Postgres>, nats: async_nats::Client) -> Result<(), dtx_outbox::Error> {
//! use dtx_sql::Backend as _;
//! dtx_outbox::migrate(&pool).await?;
//! // In the business transaction:
//! let mut tx = dtx_sql::sqlx::Postgres::begin(&pool).await?;
//! // ... INSERT INTO orders ...
//! let headers = Default::default();
//! dtx_outbox::enqueue(&mut *tx, "orders.created", "order-42", &headers, b"{\"id\":42}").await?;
//! tx.commit().await?;
//! // In the service's start-up: one relay (or several) for the table.
//! let publisher = dtx_outbox::JetStream::new(async_nats::jetstream::new(nats));
//! tokio::spawn(dtx_outbox::Relay::new(pool, publisher).run(std::future::pending()));
//! # Ok(()) }
//! ```

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub mod consume;
mod error;
#[cfg(feature = "nats")]
mod jetstream;
pub mod metrics;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;
mod sql;

use std::collections::BTreeMap;

use dtx_proto::limits::{self, LimitError};
use dtx_sql::sqlx::Pool;
use dtx_sql::{Backend, Conn, Schema};
use futures::future::BoxFuture;

pub use error::Error;
#[cfg(feature = "nats")]
pub use jetstream::JetStream;
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::RabbitMq;
pub use relay::{Relay, RelayConfig};

/// Largest payload: NATS's default `max_payload` (1 MiB).
pub const MAX_PAYLOAD: usize = 1024 * 1024;
/// Longest topic and key.
pub const MAX_NAME: usize = 255;

/// One outbox row on its way to the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The row's id: order within a key.
    pub id: i64,
    /// The broker's message id (a UUID made at [`enqueue`]).
    pub event_id: String,
    /// Where it goes (a JetStream subject, a RabbitMQ routing key).
    pub topic: String,
    /// The ordering key: events of one key are published in enqueue order.
    pub key: String,
    /// Message headers (trace context, content type, ...).
    pub headers: BTreeMap<String, String>,
    /// The message body.
    pub payload: Vec<u8>,
    /// Failed publishes before this one.
    pub attempts: i64,
    /// When it was enqueued (Unix ms).
    pub created_at: i64,
}

/// Sends events to a broker. `publish` returns `Ok` only once the broker has the event
/// durably (a JetStream ack, an AMQP publisher confirm); the relay marks the row sent then.
/// An `Err` is retried later; the same event may be published more than once, so the broker
/// or the consumer must drop duplicates by `event_id`.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `event`; `Ok` once the broker holds it durably.
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>>;
}

/// Creates (or upgrades) the `dtx_outbox` table.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), Error> {
    Ok(DB::migrate(pool, Schema::Outbox).await?)
}

/// Writes an event in the caller's transaction (`conn`): it is published if and only if that
/// transaction commits. Returns its `event_id`.
pub async fn enqueue<C: Conn>(
    conn: &mut C,
    topic: &str,
    key: &str,
    headers: &BTreeMap<String, String>,
    payload: &[u8],
) -> Result<String, Error> {
    check_name("topic", topic)?;
    check_name("key", key)?;
    limits::check_headers("headers", headers)?;
    if payload.len() > MAX_PAYLOAD {
        return Err(LimitError(format!(
            "payload is {} bytes, the limit is {MAX_PAYLOAD}",
            payload.len()
        ))
        .into());
    }
    let event_id = uuid::Uuid::new_v4().to_string();
    let now = dtx_sql::now_ms();
    sql::insert(conn, &event_id, topic, key, headers, payload, now).await?;
    Ok(event_id)
}

/// A topic or key: 1..=255 printable ASCII characters without spaces (a NATS subject or an AMQP
/// routing key).
fn check_name(field: &str, value: &str) -> Result<(), LimitError> {
    if value.is_empty() || value.len() > MAX_NAME {
        return Err(LimitError(format!(
            "{field} is {} bytes, it must be 1..={MAX_NAME}",
            value.len()
        )));
    }
    if let Some(c) = value.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(LimitError(format!(
            "{field} {value:?} contains {c:?}: printable ASCII without spaces only"
        )));
    }
    Ok(())
}

/// What waits in the outbox now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Rows not sent yet (parked ones apart).
    pub waiting: i64,
    /// The oldest waiting row's `created_at` (Unix ms).
    pub oldest_created_at: Option<i64>,
    /// Rows parked after their attempt limit.
    pub parked: i64,
}

/// How much is waiting: unsent and parked rows, and the oldest unsent one's age.
pub async fn backlog<DB: Backend>(pool: &Pool<DB>) -> Result<Backlog, Error> {
    let mut conn = pool.acquire().await?;
    let (waiting, oldest_created_at, parked) = sql::backlog(DB::pooled(&mut conn)).await?;
    Ok(Backlog {
        waiting,
        oldest_created_at,
        parked,
    })
}

/// Where an event stands: `PENDING`, `SENT` or `PARKED`, its failed attempts and last error.
pub async fn status<DB: Backend>(
    pool: &Pool<DB>,
    event_id: &str,
) -> Result<Option<(String, i64, Option<String>)>, Error> {
    let mut conn = pool.acquire().await?;
    sql::status(DB::pooled(&mut conn), event_id).await
}

/// An operator's action: a parked event is published again (from zero attempts). False if it
/// is not parked.
pub async fn republish<DB: Backend>(pool: &Pool<DB>, event_id: &str) -> Result<bool, Error> {
    let mut conn = pool.acquire().await?;
    sql::republish(DB::pooled(&mut conn), event_id, dtx_sql::now_ms()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_keys_are_printable_ascii_within_the_limit() {
        assert!(check_name("topic", "orders.created").is_ok());
        assert!(check_name("topic", "").unwrap_err().0.contains("1..=255"));
        assert!(check_name("key", &"k".repeat(256)).is_err());
        let spaced = check_name("topic", "orders created").unwrap_err().0;
        assert!(spaced.contains("' '"), "{spaced}");
    }
}
