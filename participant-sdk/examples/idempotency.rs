//! An idempotent create endpoint (axum + the `Idempotency-Key` layer) and an idempotent
//! JetStream consumer, on SQLite.
//!
//! ```text
//! cargo run -p dtx-sdk --example idempotency
//! curl -i localhost:3000/orders -H 'idempotency-key: 8e03978e-40d5' \
//!      -H 'content-type: application/json' -d '{"amount": 10}'
//! ```
//! Repeat the call: the same 201 comes back with `idempotent-replayed: true` and no second
//! order; change the amount under the same key: 409. With `NATS_URL=nats://127.0.0.1:4222` it
//! also consumes `orders.created` events, shipping each order once however often it arrives.
//! `LISTEN=127.0.0.1:3001` serves on another address.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use dtx_sdk::idempotency::consumer::Consumer;
use dtx_sdk::idempotency::http::IdempotencyLayer;
use dtx_sdk::idempotency::{Fact, Idempotency, RequestHash, StoredResult};
use dtx_sdk::sql::sqlx::{Pool, Sqlite};
use dtx_sdk::sql::{Backend, Conn, SqlRow, args};
use futures::StreamExt;
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt::init();
    let pool = Sqlite::connect("sqlite://idempotency-example.db", 8).await?;
    dtx_sdk::migrate_idempotency(&pool).await?;
    for table in [
        "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, request_key TEXT NOT NULL UNIQUE, \
         amount INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS shipments (order_id TEXT NOT NULL)",
    ] {
        Sqlite::execute_script(&pool, table.into()).await?;
    }

    // After an expired lease, look at the orders table before anything runs again.
    let facts = pool.clone();
    let store = Idempotency::new(pool.clone()).fact_check(move |expired| {
        let pool = facts.clone();
        Box::pin(async move {
            let mut tx = Sqlite::begin(&pool).await?;
            let row = Sqlite::conn(&mut tx)
                .fetch_optional(
                    "SELECT id FROM orders WHERE request_key = ?",
                    args![expired.key.business_id()],
                )
                .await?;
            Ok(match row {
                Some(row) => Fact::Happened(StoredResult::new("201").resource(row.text(0)?)),
                None => Fact::NotHappened,
            })
        })
    });

    let nats = std::env::var("NATS_URL").ok();
    if let Some(url) = nats.clone() {
        tokio::spawn(consume(url, store.clone()));
    }

    let orders = IdempotencyLayer::new(store, "order.create")?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(orders)
        .with_state(pool);
    let addr = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}; set LISTEN to a free address"))?;
    print_what_to_try(&listener.local_addr()?.to_string(), nats.as_deref());
    axum::serve(listener, app).await?;
    Ok(())
}

fn print_what_to_try(addr: &str, nats: Option<&str>) {
    let curl = format!(
        "curl -i {addr}/orders -H 'idempotency-key: 8e03978e-40d5' \\\n       \
         -H 'content-type: application/json'"
    );
    println!(
        "idempotent orders endpoint on http://{addr}/orders (records in idempotency-example.db)"
    );
    println!("create an order (201):");
    println!("  {curl} -d '{{\"amount\": 10}}'");
    println!("the same call again: the same 201, `idempotent-replayed: true`, no second order");
    println!("the same key with another amount (409 Conflict):");
    println!("  {curl} -d '{{\"amount\": 11}}'");
    match nats {
        Some(url) => println!(
            "consuming orders.created from {url}: publish {{\"event_id\": .., \"order_id\": ..}} \
             twice and it ships once"
        ),
        None => println!("set NATS_URL=nats://127.0.0.1:4222 to also run the shipping consumer"),
    }
}

/// Runs once per Idempotency-Key; the layer replays its response to every repeat.
async fn create_order(
    State(pool): State<Pool<Sqlite>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> impl IntoResponse {
    // The layer only lets requests with a valid key through; it is the order's request key.
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim_matches('"');
    let id = format!("O{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let amount = request["amount"].as_i64().unwrap_or(0);
    let inserted = async {
        let mut tx = Sqlite::begin(&pool).await?;
        Sqlite::conn(&mut tx)
            .execute(
                "INSERT INTO orders (id, request_key, amount) VALUES (?, ?, ?)",
                args![&id, key, amount],
            )
            .await?;
        tx.commit().await
    };
    match inserted.await {
        Ok(()) => (
            StatusCode::CREATED,
            [(header::LOCATION, format!("/orders/{id}"))],
            Json(json!({ "id": id, "amount": amount })),
        )
            .into_response(),
        // Rolled back, nothing happened: a retryable 503 lets the client's next try run again.
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// Ships every created order once, however often JetStream delivers the event.
async fn consume(url: String, store: Idempotency<Sqlite>) -> Result<(), BoxError> {
    let js = jetstream::new(async_nats::connect(url).await?);
    let events = js
        .get_or_create_stream(stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.created".into()],
            ..Default::default()
        })
        .await?
        .get_or_create_consumer(
            "shipping",
            consumer::pull::Config {
                durable_name: Some("shipping".into()),
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await?;
    let shipping = Consumer::new(store, "shipping", 1)?;
    let mut messages = events.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        let event: Value = serde_json::from_slice(&message.payload)?;
        let (Some(event_id), Some(order_id)) =
            (event["event_id"].as_str(), event["order_id"].as_str())
        else {
            tracing::warn!("malformed event dropped");
            message.ack().await?;
            continue;
        };
        let order_id = order_id.to_string();
        let delivery = shipping
            .handle(event_id, &RequestHash::of_json(&event), |conn| {
                let order_id = order_id.clone();
                Box::pin(async move {
                    conn.execute(
                        "INSERT INTO shipments (order_id) VALUES (?)",
                        args![&order_id],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await;
        match delivery {
            Ok(delivery) if delivery.should_ack() => message.ack().await?,
            Ok(delivery) => tracing::warn!(?delivery, "not acknowledged"),
            Err(e) => tracing::warn!(error = %e, "handler failed; the broker will redeliver"),
        }
    }
    Ok(())
}
