//! The transactional outbox end to end, on SQLite and the local NATS JetStream: an order
//! service writes `orders.created` in the transaction that creates the order, a relay publishes
//! it, and a shipping consumer ships each order once.
//!
//! ```text
//! cargo run -p dtx-sdk --example outbox      # NATS_URL, default nats://127.0.0.1:4222
//! ```
//! It places three orders and tries a fourth whose transaction rolls back (its event is never
//! published). It prints each shipment as the consumer applies it, then the totals.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use dtx_sdk::idempotency::Idempotency;
use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
use dtx_sdk::sql::sqlx::Sqlite;
use dtx_sdk::sql::{Backend, Conn, SqlRow, args};
use futures::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt::init();
    let pool = Sqlite::connect("sqlite://outbox-example.db", 8).await?;
    dtx_sdk::migrate_idempotency(&pool).await?;
    dtx_outbox::migrate(&pool).await?;
    Sqlite::execute_script(
        &pool,
        "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL); \
         CREATE TABLE IF NOT EXISTS shipments (order_id TEXT NOT NULL)"
            .into(),
    )
    .await?;
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let js = jetstream::new(async_nats::connect(url.as_str()).await?);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: "DTX_OUTBOX_EXAMPLE".into(),
            subjects: vec!["example.orders.>".into()],
            max_age: Duration::from_secs(3600),
            ..Default::default()
        })
        .await?;

    // The order service: the order and its event commit together, or neither does.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut placed = Vec::new();
    for (n, amount) in [(1, 30), (2, 45), (3, 12), (4, -1)] {
        let order = format!("order-{}-{n}", &run[..8]);
        let mut tx = Sqlite::begin(&pool).await?;
        let conn = Sqlite::conn(&mut tx);
        conn.execute(
            "INSERT INTO orders (id, amount) VALUES (?, ?)",
            args![order.as_str(), amount],
        )
        .await?;
        let payload = format!(r#"{{"order":"{order}","amount":{amount}}}"#);
        let headers = BTreeMap::new();
        dtx_outbox::enqueue(
            conn,
            "example.orders.created",
            &order,
            &headers,
            payload.as_bytes(),
        )
        .await?;
        if amount < 0 {
            tx.rollback().await?; // a refused order: no row, no event
            println!("{order}: refused, rolled back");
            continue;
        }
        tx.commit().await?;
        println!("{order}: placed ({amount})");
        placed.push(order);
    }

    // The relay (one per service instance; several may run).
    let relay = dtx_outbox::Relay::new(pool.clone(), dtx_outbox::JetStream::new(js.clone()));
    let relaying = tokio::spawn(relay.run(std::future::pending()));

    // The shipping service: each event applied once, acknowledged only after its commit.
    let shipping = stream
        .get_or_create_consumer(
            "shipping",
            consumer::pull::Config {
                durable_name: Some("shipping".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await?;
    let helper = Consumer::new(Idempotency::new(pool.clone()), "shipping", 1)?;
    let mut messages = shipping.messages().await?;
    let mut shipped = 0;
    while shipped < placed.len() {
        let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_secs(10), messages.next()).await
        else {
            return Err("no event within 10 s: is NATS running with JetStream?".into());
        };
        let message = message?;
        let body: serde_json::Value = serde_json::from_slice(&message.payload)?;
        let order = body["order"].as_str().unwrap_or_default().to_string();
        // Runs the insert once per event, in the transaction that records the event's id, and
        // acknowledges the message only after that commit.
        let delivery = dtx_outbox::consume::jetstream(&helper, &message, |conn, payload| {
            Box::pin(async move {
                let body: serde_json::Value = serde_json::from_slice(&payload)?;
                let order = body["order"].as_str().unwrap_or_default();
                let insert = "INSERT INTO shipments (order_id) VALUES (?)";
                conn.execute(insert, args![order]).await?;
                Ok(())
            })
        })
        .await?;
        if placed.contains(&order) && delivery.should_ack() {
            shipped += 1;
            println!(
                "{order}: {}",
                if delivery == Delivery::Processed {
                    "shipped"
                } else {
                    "already shipped"
                }
            );
        }
    }
    relaying.abort();
    let mut conn = pool.acquire().await?;
    let rows = Sqlite::pooled(&mut conn)
        .fetch_all("SELECT COUNT(*) FROM shipments", &[])
        .await?;
    println!(
        "{} shipments in total; outbox: {:?}",
        rows[0].i64(0)?,
        dtx_outbox::backlog(&pool).await?
    );
    Ok(())
}
