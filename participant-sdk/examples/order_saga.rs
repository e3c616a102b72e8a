//! An order saga across three services - inventory, payment, shipping - where the last step
//! fails and the first two are compensated.
//!
//! Start a coordinator (`cargo run --release --bin coordinator`), then:
//!
//! ```text
//! cargo run -p dtx-sdk --example order_saga
//! ```
//!
//! Each service keeps a SQLite database with its business table and the `dtx_barrier` table,
//! and registers one saga handler (an action and its compensation). The first order ships; the
//! second goes to an address no courier serves, so shipping refuses, payment is refunded and the
//! stock released - in that order. Set `DTX_COORDINATOR` to use another coordinator address.

use std::time::Duration;

use dtx_sdk::Backend;
use dtx_sdk::barrier::Reply;
use dtx_sdk::client::{Coordinator, SagaStep};
use dtx_sdk::server::ParticipantServer;
use dtx_sdk::sql::sqlx::{self, Row, SqlitePool};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// A service's database: `table` with one row `key = value`, plus the barrier.
async fn database(
    service: &str,
    table: &str,
    key: &str,
    value: i64,
) -> Result<SqlitePool, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("dtx-example-{service}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let pool =
        sqlx::Sqlite::connect(&format!("sqlite://{}", dir.join("service.db").display()), 4).await?;
    dtx_sdk::migrate_barrier(&pool).await?;
    let create =
        format!("CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, v INTEGER NOT NULL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&pool)
        .await?;
    let seed = format!("INSERT OR REPLACE INTO {table} VALUES ('{key}', {value})");
    sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// Serves a participant on a fresh port; returns its URL.
async fn serve(
    server: ParticipantServer<sqlx::Sqlite>,
) -> Result<String, Box<dyn std::error::Error>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server.into_service())
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Ok(url)
}

/// Adds `delta` to row `k` of `table` (the whole business effect of every step here).
async fn add(
    conn: &mut sqlx::SqliteConnection,
    sql: &'static str,
    k: &str,
    delta: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(sql)
        .bind(delta)
        .bind(k)
        .execute(conn)
        .await
        .map(|_| ())
}

async fn value(pool: &SqlitePool, table: &str, k: &str) -> Result<i64, sqlx::Error> {
    let sql = format!("SELECT v FROM {table} WHERE k = ?");
    Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(k)
        .fetch_one(pool)
        .await?
        .get(0))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let coordinator_url =
        std::env::var("DTX_COORDINATOR").unwrap_or_else(|_| "http://127.0.0.1:50070".into());

    let stock = database("inventory", "stock", "sku-1", 10).await?;
    let inventory = serve(ParticipantServer::new(stock.clone()).saga(
        "reserve",
        |conn, _| {
            Box::pin(async move {
                add(conn, "UPDATE stock SET v = v + ? WHERE k = ?", "sku-1", -1).await?;
                Ok(Reply::Success(b"reservation R-1".to_vec()))
            })
        },
        |conn, _| {
            Box::pin(async move {
                add(conn, "UPDATE stock SET v = v + ? WHERE k = ?", "sku-1", 1).await?;
                Ok(Reply::ok())
            })
        },
    ))
    .await?;

    let wallets = database("payment", "wallet", "alice", 100).await?;
    let payment = serve(ParticipantServer::new(wallets.clone()).saga(
        "charge",
        |conn, _| {
            Box::pin(async move {
                add(
                    conn,
                    "UPDATE wallet SET v = v + ? WHERE k = ?",
                    "alice",
                    -25,
                )
                .await?;
                Ok(Reply::Success(b"payment P-1".to_vec()))
            })
        },
        |conn, _| {
            Box::pin(async move {
                add(conn, "UPDATE wallet SET v = v + ? WHERE k = ?", "alice", 25).await?;
                Ok(Reply::ok())
            })
        },
    ))
    .await?;

    let parcels = database("shipping", "parcels", "sent", 0).await?;
    let shipping = serve(ParticipantServer::new(parcels.clone()).saga(
        "ship",
        |conn, call| {
            Box::pin(async move {
                let address = String::from_utf8_lossy(&call.payload).into_owned();
                if address.contains("Atlantis") {
                    return Ok(Reply::refuse(format!("no courier serves {address}")));
                }
                add(conn, "UPDATE parcels SET v = v + ? WHERE k = ?", "sent", 1).await?;
                Ok(Reply::Success(b"parcel S-1".to_vec()))
            })
        },
        |conn, _| {
            Box::pin(async move {
                add(conn, "UPDATE parcels SET v = v + ? WHERE k = ?", "sent", -1).await?;
                Ok(Reply::ok())
            })
        },
    ))
    .await?;

    let coordinator = Coordinator::connect(&coordinator_url).await?;
    for address in ["1 Main Street", "Atlantis"] {
        let outcome = coordinator
            .saga()
            .timeout(Duration::from_secs(30))
            .step(SagaStep::new("reserve", &inventory, "reserve"))
            .step(SagaStep::new("charge", &payment, "charge"))
            .step(SagaStep::new("ship", &shipping, "ship").payload(address.as_bytes().to_vec()))
            .submit()
            .await?
            .await_outcome(Duration::from_secs(30))
            .await?;
        println!(
            "order to {address}: {:?} {}",
            outcome.status(),
            outcome.0.last_error
        );
        for step in outcome.steps() {
            println!(
                "  {:<8} {:?} after {} call(s){}",
                step.branch_id,
                step.status(),
                step.attempts,
                if step.result.is_empty() {
                    String::new()
                } else {
                    format!(", result {:?}", String::from_utf8_lossy(&step.result))
                }
            );
        }
        println!(
            "  stock {}, alice's wallet {}, parcels sent {}",
            value(&stock, "stock", "sku-1").await?,
            value(&wallets, "wallet", "alice").await?,
            value(&parcels, "parcels", "sent").await?
        );
    }
    Ok(())
}
