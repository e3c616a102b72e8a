//! Payment callbacks end to end, on SQLite and the local NATS JetStream: a simulated payment
//! provider posts signed callbacks - a repeat, a tampered copy, a wrong amount, an expired
//! signature, a late repeat - to a shop service that marks each order PAID once; the outbox
//! publishes `order.paid`, and a shipping service ships each order once.
//!
//! ```text
//! cargo run -p dtx-payments --example shop     # NATS_URL, default nats://127.0.0.1:4222
//! ```
//! Its output is the block the README shows (a test runs it and compares).

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use dtx_idempotency::Idempotency;
use dtx_idempotency::consumer::{Consumer, Delivery};
use dtx_payments::http::HeaderName;
use dtx_payments::{Callbacks, HmacSha256, sign};
use dtx_sql::sqlx::Sqlite;
use dtx_sql::{Backend, Conn, SqlRow, args};
use dtx_state::{Entity, EntityId, Machine};
use futures::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SECRET: &[u8] = b"whsec-example";
const TOPIC: &str = "example.shop.order.paid";

fn orders() -> Result<Entity, dtx_state::Error> {
    let machine = Machine::builder("order")
        .transition("WAIT_PAY", "PAID")
        .transition("PAID", "SHIPPED")
        .transition("WAIT_PAY", "CLOSED")
        .build()?;
    Entity::new(machine, "orders")
}

/// Prints the next order the shipping service shipped.
async fn wait_shipped(shipped: &mut tokio::sync::mpsc::UnboundedReceiver<String>) {
    match tokio::time::timeout(Duration::from_secs(10), shipped.recv()).await {
        Ok(Some(order)) => println!("shipping: {order} shipped"),
        _ => println!("shipping: nothing within 10 s - is NATS running with JetStream?"),
    }
}

/// The provider: signs `body` (now, or `age_s` seconds ago) and posts it.
async fn provider_posts(url: &str, what: &str, body: &str, age_s: i64, tamper: bool) -> String {
    if age_s != 0 {
        // The shop names the skew in whole seconds: sign just after a second begins, so it
        // checks the signature within the same second and prints the age as given.
        let into_second = dtx_sql::now_ms().rem_euclid(1000) as u64;
        tokio::time::sleep(Duration::from_millis(1005 - into_second)).await;
    }
    let at = dtx_sql::now_ms() / 1000 - age_s;
    let signature = sign(SECRET, at, body.as_bytes());
    let sent = if tamper {
        body.replace("1999", "1")
    } else {
        body.to_string()
    };
    let response = reqwest::Client::new()
        .post(url)
        .header("x-pay-signature", signature)
        .body(sent)
        .send()
        .await
        .expect("the shop answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    format!("provider: {what:<38} -> {status} {text}")
}

fn paid(trade: &str, order: &str, amount: i64) -> String {
    format!(
        r#"{{"merchant":"shop-1","trade_no":"{trade}","order_no":"{order}","amount":{amount},"currency":"EUR","event_type":"payment.succeeded"}}"#
    )
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    let pool = Sqlite::connect(&url, 8).await?;
    dtx_payments::migrate(&pool).await?;
    Sqlite::execute_script(
        &pool,
        "CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL, \
         amount INTEGER NOT NULL, currency TEXT NOT NULL); \
         CREATE TABLE shipments (order_id TEXT NOT NULL); \
         INSERT INTO orders VALUES ('o-1001', 'WAIT_PAY', 0, 1999, 'EUR'), \
                                   ('o-1002', 'WAIT_PAY', 0, 500, 'EUR')"
            .into(),
    )
    .await?;

    // The shop: payment callbacks from "acmepay" for its account "shop-1".
    let verifier = HmacSha256::new(HeaderName::from_static("x-pay-signature"), SECRET);
    let callbacks = Callbacks::builder(pool.clone(), "acmepay", "shop-1", verifier, orders()?)
        .event("payment.succeeded", "PAID", TOPIC)
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let shop = format!("http://{}/callbacks/acmepay", listener.local_addr()?);
    tokio::spawn(axum::serve(listener, callbacks.router("/callbacks/acmepay")).into_future());

    // The outbox relay to JetStream, and the shipping service consuming `order.paid`.
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let js = jetstream::new(async_nats::connect(nats.as_str()).await?);
    let _ = js.delete_stream("DTX_SHOP_EXAMPLE").await; // a clean stream for every run
    let stream = js
        .create_stream(stream::Config {
            name: "DTX_SHOP_EXAMPLE".into(),
            subjects: vec![TOPIC.into()],
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await?;
    let relay = dtx_outbox::Relay::new(pool.clone(), dtx_outbox::JetStream::new(js.clone()));
    tokio::spawn(relay.run(std::future::pending()));
    let shipping = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("shipping".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let (shipped_tx, mut shipped) = tokio::sync::mpsc::unbounded_channel();
    let consumer = Consumer::new(Idempotency::new(pool.clone()), "shipping", 1)?;
    let mut messages = shipping.messages().await?;
    tokio::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            let delivery = dtx_outbox::consume::jetstream(&consumer, &message, |conn, payload| {
                Box::pin(async move {
                    let event: serde_json::Value = serde_json::from_slice(&payload)?;
                    let order = event["order_no"].as_str().unwrap_or_default().to_string();
                    let id = EntityId::from(order.as_str());
                    orders()?.apply(conn, &id, "SHIPPED", None).await?;
                    conn.execute(
                        "INSERT INTO shipments (order_id) VALUES (?)",
                        args![order.as_str()],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await;
            if let Ok(Delivery::Processed) = delivery {
                let event: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
                shipped_tx
                    .send(event["order_no"].as_str().unwrap_or_default().to_string())
                    .ok();
            }
        }
    });
    // The provider's script: (what, trade, order, amount in cents, signed seconds ago,
    // tampered after signing); `None` waits for the shipping service.
    let script = [
        Some((
            "o-1001 paid 19.99 EUR (trade T-1)",
            "T-1",
            "o-1001",
            1999,
            0,
            false,
        )),
        None,
        Some(("the same callback again", "T-1", "o-1001", 1999, 0, false)),
        Some((
            "a tampered copy (amount 0.01)",
            "T-1",
            "o-1001",
            1999,
            0,
            true,
        )),
        Some((
            "o-1002 paid 4.00 EUR of 5.00 (T-2)",
            "T-2",
            "o-1002",
            400,
            0,
            false,
        )),
        Some(("o-1002 paid 5.00 EUR (T-3)", "T-3", "o-1002", 500, 0, false)),
        None,
        Some((
            "o-1001 T-1 again, signed 10 min ago",
            "T-1",
            "o-1001",
            1999,
            600,
            false,
        )),
        Some((
            "o-1001 T-1 again, after shipping",
            "T-1",
            "o-1001",
            1999,
            0,
            false,
        )),
    ];
    for step in script {
        match step {
            Some((what, trade, order, amount, age, tamper)) => {
                let body = paid(trade, order, amount);
                println!("{}", provider_posts(&shop, what, &body, age, tamper).await);
            }
            None => wait_shipped(&mut shipped).await,
        }
    }

    let mut conn = pool.acquire().await?;
    let conn = Sqlite::pooled(&mut conn);
    for row in conn
        .fetch_all("SELECT id, status, version FROM orders ORDER BY id", &[])
        .await?
    {
        println!(
            "order {}: {} (version {})",
            row.text(0)?,
            row.text(1)?,
            row.i64(2)?
        );
    }
    let shipments = conn
        .fetch_all("SELECT COUNT(*) FROM shipments", &[])
        .await?;
    let payments = conn
        .fetch_all("SELECT COUNT(*) FROM dtx_payments", &[])
        .await?;
    println!(
        "payments recorded: {}, shipments: {}",
        payments[0].i64(0)?,
        shipments[0].i64(0)?
    );
    for parked in dtx_payments::parked(&pool).await? {
        println!(
            "parked for review: {} {}: {}",
            parked.trade_no, parked.order_no, parked.reason
        );
    }
    Ok(())
}
