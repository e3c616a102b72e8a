//! Support for the idempotency-record tests: an `orders` business table (the fact a fact check
//! looks up), a `credits` table without any unique key (so a second effect would show), a real
//! axum server on port 0, and the NATS connection with the same skip/fail policy as the
//! databases.

use std::net::SocketAddr;
use std::time::Duration;

use dtx_sql::sqlx::{self, Pool};
use dtx_sql::{Backend, Conn, SqlRow, args, now_ms};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::db::{TestBackend, in_ci};

/// Creates `orders` (unique on the request key, as a business table should be) and `credits`
/// (deliberately without a unique key).
pub async fn create_tables<DB: TestBackend>(pool: &Pool<DB>) {
    for sql in [
        "CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) NOT NULL PRIMARY KEY, \
         request_key VARCHAR(128) NOT NULL UNIQUE, amount BIGINT NOT NULL, created_ms BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS credits (event_id VARCHAR(128) NOT NULL, \
         account VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
    ] {
        DB::execute_script(pool, sql.to_string())
            .await
            .expect("create test table");
    }
}

/// Inserts an order for `request_key` and returns its new id.
pub async fn insert_order<C: Conn>(
    conn: &mut C,
    request_key: &str,
    amount: i64,
) -> Result<String, sqlx::Error> {
    let id = format!("O{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    conn.execute(
        "INSERT INTO orders (id, request_key, amount, created_ms) VALUES (?, ?, ?, ?)",
        args![&id, request_key, amount, now_ms()],
    )
    .await?;
    Ok(id)
}

/// Inserts an order in its own transaction.
pub async fn insert_order_committed<DB: Backend>(
    pool: &Pool<DB>,
    request_key: &str,
    amount: i64,
) -> String {
    let mut tx = DB::begin(pool).await.expect("begin");
    let id = insert_order(DB::conn(&mut tx), request_key, amount)
        .await
        .expect("insert order");
    tx.commit().await.expect("commit");
    id
}

/// The id of the order placed for `request_key`, if any.
pub async fn find_order<DB: Backend>(pool: &Pool<DB>, request_key: &str) -> Option<String> {
    let mut tx = DB::begin(pool).await.expect("begin");
    let row = DB::conn(&mut tx)
        .fetch_optional(
            "SELECT id FROM orders WHERE request_key = ?",
            args![request_key],
        )
        .await
        .expect("find order");
    tx.commit().await.expect("commit");
    row.map(|r| r.text(0).unwrap())
}

/// How many rows a `SELECT COUNT(*) ...` returns.
pub async fn count<DB: Backend>(pool: &Pool<DB>, sql: &'static str, arg: &str) -> i64 {
    let mut tx = DB::begin(pool).await.expect("begin");
    let row = DB::conn(&mut tx)
        .fetch_optional(sql, args![arg])
        .await
        .expect("count")
        .expect("a count row");
    tx.commit().await.expect("commit");
    row.i64(0).unwrap()
}

/// Orders placed for `request_key`.
pub async fn orders_for<DB: Backend>(pool: &Pool<DB>, request_key: &str) -> i64 {
    count(
        pool,
        "SELECT COUNT(*) FROM orders WHERE request_key = ?",
        request_key,
    )
    .await
}

/// Credits applied for a business event.
pub async fn credits_for<DB: Backend>(pool: &Pool<DB>, event_id: &str) -> i64 {
    count(
        pool,
        "SELECT COUNT(*) FROM credits WHERE event_id = ?",
        event_id,
    )
    .await
}

/// An axum server on a fresh loopback port; stops when dropped.
pub struct HttpServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl HttpServer {
    pub async fn start(router: axum::Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    stopped.await.ok();
                })
                .await
                .expect("http server");
        });
        HttpServer {
            addr,
            stop: Some(stop),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
    }
}

/// URL of the NATS server with JetStream (`DTX_TEST_NATS_URL`, default the loopback server).
pub fn nats_url() -> String {
    std::env::var("DTX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Connects to NATS, or `None` (test skipped with a message) when it is unreachable outside CI.
/// Under `CI=true` an unreachable NATS fails the test: CI must never go green by skipping.
pub async fn nats() -> Option<async_nats::Client> {
    let url = nats_url();
    let connected = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .connect(url.as_str())
        .await;
    match connected {
        Ok(client) => Some(client),
        Err(e) => {
            let message = format!("NATS at {url} is unreachable: {e}");
            if in_ci() {
                panic!("{message} (CI=true: NATS tests must not be skipped)");
            }
            eprintln!("SKIPPED: {message}");
            None
        }
    }
}
