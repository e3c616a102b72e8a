//! A shop's orders for the state-machine and payment-callback tests: the `shop_orders` table
//! (id, status, version, amount in cents, currency) and its machine
//! `WAIT_PAY -> PAID -> SHIPPED -> DELIVERED`, `WAIT_PAY -> CLOSED`, `PAID -> REFUNDED`.

use dtx_sql::sqlx::Pool;
use dtx_sql::{Backend, Conn, SqlRow, args};
use dtx_state::{Entity, Machine};

use crate::db::TestBackend;

/// The states in the order the happy path passes them.
pub const PATH: [&str; 4] = ["WAIT_PAY", "PAID", "SHIPPED", "DELIVERED"];

pub fn machine() -> Machine {
    Machine::builder("order")
        .transition("WAIT_PAY", "PAID")
        .transition("PAID", "SHIPPED")
        .transition("SHIPPED", "DELIVERED")
        .transition("WAIT_PAY", "CLOSED")
        .transition("PAID", "REFUNDED")
        .build()
        .expect("the order machine")
}

pub fn orders() -> Entity {
    Entity::new(machine(), "shop_orders").expect("the orders entity")
}

pub async fn create_table<DB: TestBackend>(pool: &Pool<DB>) {
    DB::execute_script(
        pool,
        "CREATE TABLE IF NOT EXISTS shop_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, \
         status VARCHAR(16) NOT NULL, version BIGINT NOT NULL, amount BIGINT NOT NULL, \
         currency VARCHAR(3) NOT NULL)"
            .to_string(),
    )
    .await
    .expect("create shop_orders");
}

/// Places order `id` for `amount` cents in EUR, in state `status`.
pub async fn place<DB: Backend>(pool: &Pool<DB>, id: &str, amount: i64, status: &str) {
    let mut tx = DB::begin(pool).await.unwrap();
    DB::conn(&mut tx)
        .execute(
            "INSERT INTO shop_orders (id, status, version, amount, currency) \
             VALUES (?, ?, 0, ?, 'EUR')",
            args![id, status, amount],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Order `id`'s (status, version).
pub async fn state<DB: Backend>(pool: &Pool<DB>, id: &str) -> (String, i64) {
    let mut conn = pool.acquire().await.unwrap();
    let row = DB::pooled(&mut conn)
        .fetch_optional(
            "SELECT status, version FROM shop_orders WHERE id = ?",
            args![id],
        )
        .await
        .unwrap()
        .expect("the order exists");
    (row.text(0).unwrap(), row.i64(1).unwrap())
}
