//! A TCC money transfer across two participant services.
//!
//! Start a coordinator (`cargo run --release --bin coordinator`), then:
//!
//! ```text
//! cargo run -p dtx-sdk --example tcc_transfer
//! ```
//!
//! The example starts two bank services in this process, each with its own SQLite database and
//! a `dtx_barrier` table: bank A holds alice's account, bank B holds bob's. A transfer is a TCC
//! transaction with two branches: Try *reserves* the money (debit: hold it; credit: announce it),
//! Confirm makes it final, Cancel undoes the reservation. The first transfer commits; the second
//! asks for more than alice has, bank A refuses the Try, and the whole transaction rolls back.
//! Set `DTX_COORDINATOR` to use another coordinator address.

use std::time::Duration;

use dtx_sdk::barrier::Reply;
use dtx_sdk::client::{Coordinator, TccBranch, TccOptions};
use dtx_sdk::server::{BranchCall, ParticipantServer};
use dtx_sdk::sql::sqlx::{self, Row, SqlitePool};
use dtx_sdk::{Backend, Error};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// Payload of both branches: the account and the amount, as "account:amount".
fn parse(call: &BranchCall) -> Result<(String, i64), Box<dyn std::error::Error + Send + Sync>> {
    let text = std::str::from_utf8(&call.payload)?;
    let (account, amount) = text
        .split_once(':')
        .ok_or("payload must be account:amount")?;
    Ok((account.to_string(), amount.parse()?))
}

/// One bank: an accounts table, the barrier, and a TCC resource "debit" and one "credit".
async fn start_bank(
    name: &str,
    account: &str,
    balance: i64,
) -> Result<(String, SqlitePool), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("dtx-example-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let pool =
        sqlx::Sqlite::connect(&format!("sqlite://{}", dir.join("bank.db").display()), 4).await?;
    dtx_sdk::migrate_barrier(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, held INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT OR REPLACE INTO accounts VALUES (?, ?, 0)")
        .bind(account)
        .bind(balance)
        .execute(&pool)
        .await?;

    let service = ParticipantServer::new(pool.clone())
        .tcc(
            "debit",
            // Try: hold the money, refusing if the balance is too low.
            |conn, call| {
                Box::pin(async move {
                    let (account, amount) = parse(&call)?;
                    let done = sqlx::query(
                        "UPDATE accounts SET balance = balance - ?, held = held + ? WHERE id = ? AND balance >= ?",
                    )
                    .bind(amount)
                    .bind(amount)
                    .bind(&account)
                    .bind(amount)
                    .execute(&mut *conn)
                    .await?;
                    if done.rows_affected() == 0 {
                        return Ok(Reply::refuse(format!("{account} cannot pay {amount}")));
                    }
                    Ok(Reply::ok())
                })
            },
            // Confirm: the held money is gone for good.
            |conn, call| {
                Box::pin(async move {
                    let (account, amount) = parse(&call)?;
                    sqlx::query("UPDATE accounts SET held = held - ? WHERE id = ?")
                        .bind(amount)
                        .bind(&account)
                        .execute(&mut *conn)
                        .await?;
                    Ok(Reply::ok())
                })
            },
            // Cancel: give the held money back.
            |conn, call| {
                Box::pin(async move {
                    let (account, amount) = parse(&call)?;
                    sqlx::query("UPDATE accounts SET balance = balance + ?, held = held - ? WHERE id = ?")
                        .bind(amount)
                        .bind(amount)
                        .bind(&account)
                        .execute(&mut *conn)
                        .await?;
                    Ok(Reply::ok())
                })
            },
        )
        .tcc(
            "credit",
            // Try: nothing to reserve for a credit; the barrier still records it.
            |_conn, _call| Box::pin(async { Ok(Reply::ok()) }),
            |conn, call| {
                Box::pin(async move {
                    let (account, amount) = parse(&call)?;
                    sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
                        .bind(amount)
                        .bind(&account)
                        .execute(&mut *conn)
                        .await?;
                    Ok(Reply::ok())
                })
            },
            |_conn, _call| Box::pin(async { Ok(Reply::ok()) }),
        )
        .into_service();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Ok((url, pool))
}

async fn balance(pool: &SqlitePool, account: &str) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query("SELECT balance, held FROM accounts WHERE id = ?")
        .bind(account)
        .fetch_one(pool)
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let coordinator_url =
        std::env::var("DTX_COORDINATOR").unwrap_or_else(|_| "http://127.0.0.1:50070".into());
    let (bank_a, pool_a) = start_bank("a", "alice", 100).await?;
    let (bank_b, pool_b) = start_bank("b", "bob", 0).await?;
    let coordinator = Coordinator::connect(&coordinator_url).await?;
    let options = || TccOptions {
        timeout: Duration::from_secs(10),
        ..TccOptions::default()
    };

    for amount in [30, 500] {
        let outcome = coordinator
            .tcc(options(), |tx| {
                let (bank_a, bank_b) = (bank_a.clone(), bank_b.clone());
                async move {
                    let payload = |who: &str| format!("{who}:{amount}").into_bytes();
                    tx.call(TccBranch::new(&bank_a, "debit", payload("alice")))
                        .await?;
                    tx.call(TccBranch::new(&bank_b, "credit", payload("bob")))
                        .await?;
                    Ok::<_, Error>(tx.xid().to_string())
                }
            })
            .await;
        match outcome {
            Ok(xid) => println!("transfer of {amount}: committed ({xid})"),
            Err(e) => println!("transfer of {amount}: rolled back - {e}"),
        }
        // Phase two is asynchronous for a rollback; give the Cancels a moment.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (alice, held) = balance(&pool_a, "alice").await?;
        let (bob, _) = balance(&pool_b, "bob").await?;
        println!("  alice: {alice} (held {held}), bob: {bob}");
    }
    Ok(())
}
