//! Payment callbacks (`dtx-payments`) served by a real HTTP server on SQLite, PostgreSQL and
//! MariaDB: a signed callback moves its order to PAID once, with its payment row and one outbox
//! event in the same commit, and only then gets the provider's acknowledgement; repeats (also
//! concurrent ones) get the same acknowledgement and no effect; tampered, expired and unsigned
//! callbacks are refused before anything is stored; a verified callback that cannot be applied
//! (the same trade with another amount, an amount that is not the order's, a closed order, an
//! order paid by another trade, another merchant) is parked for a person and answered 409,
//! never "success".

use std::time::Duration;

use dtx_payments::http::HeaderName;
use dtx_payments::{Callbacks, HmacSha256, sign};
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{HttpServer, count};
use dtx_tests::shop;
use dtx_tests::test_on_all_databases;

const SCHEMAS: &[Schema] = &[
    Schema::Idempotency,
    Schema::Transitions,
    Schema::Outbox,
    Schema::Payments,
];
const SECRET: &[u8] = b"whsec-test";

fn callbacks<DB: TestBackend>(db: &TestDb<DB>) -> Callbacks<DB> {
    let verifier = HmacSha256::new(HeaderName::from_static("x-pay-signature"), SECRET);
    Callbacks::builder(
        db.pool.clone(),
        "acmepay",
        "shop-1",
        verifier,
        shop::orders(),
    )
    .event("payment.succeeded", "PAID", "order.paid")
    .build()
    .unwrap()
}

fn body(merchant: &str, trade: &str, order: &str, amount: i64, event: &str) -> String {
    serde_json::json!({
        "merchant": merchant, "trade_no": trade, "order_no": order,
        "amount": amount, "currency": "EUR", "event_type": event,
    })
    .to_string()
}

fn paid(trade: &str, order: &str, amount: i64) -> String {
    body("shop-1", trade, order, amount, "payment.succeeded")
}

/// Posts `body` signed at `signed_at` (Unix seconds; `None`: unsigned); (status, text).
async fn post(server: &HttpServer, body: &str, signed_at: Option<i64>) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(server.url("/callbacks/acmepay"))
        .body(body.to_string());
    if let Some(at) = signed_at {
        request = request.header("x-pay-signature", sign(SECRET, at, body.as_bytes()));
    }
    let response = request.send().await.expect("the shop answers");
    (response.status().as_u16(), response.text().await.unwrap())
}

fn now() -> i64 {
    dtx_sql::now_ms() / 1000
}

async fn payments<DB: TestBackend>(db: &TestDb<DB>, order: &str) -> i64 {
    count(
        &db.pool,
        "SELECT COUNT(*) FROM dtx_payments WHERE order_no = ?",
        order,
    )
    .await
}

async fn events<DB: TestBackend>(db: &TestDb<DB>, order: &str) -> i64 {
    count(
        &db.pool,
        "SELECT COUNT(*) FROM dtx_outbox WHERE msg_key = ?",
        order,
    )
    .await
}

async fn records<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    count(
        &db.pool,
        "SELECT COUNT(*) FROM dtx_idempotency WHERE scope = ?",
        "payments.acmepay",
    )
    .await
}

async fn callbacks_are_applied_once_and_refused_when_they_must_be<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    shop::create_table(&db.pool).await;
    for (order, amount, status) in [
        ("o1", 1999, "WAIT_PAY"),
        ("o2", 500, "WAIT_PAY"),
        ("o3", 700, "CLOSED"),
    ] {
        shop::place(&db.pool, order, amount, status).await;
    }
    let server = HttpServer::start(callbacks(db).router("/callbacks/acmepay")).await;

    // The first callback: acknowledged after its commit, which moved the order, wrote the
    // payment and the event.
    let good = paid("T1", "o1", 1999);
    assert_eq!(
        post(&server, &good, Some(now())).await,
        (200, "success".into())
    );
    assert_eq!(shop::state(&db.pool, "o1").await, ("PAID".into(), 1));
    assert_eq!((payments(db, "o1").await, events(db, "o1").await), (1, 1));
    // Repeats: the same acknowledgement, nothing more.
    for _ in 0..2 {
        assert_eq!(
            post(&server, &good, Some(now())).await,
            (200, "success".into())
        );
    }
    assert_eq!(shop::state(&db.pool, "o1").await, ("PAID".into(), 1));
    assert_eq!((payments(db, "o1").await, events(db, "o1").await), (1, 1));

    // Refused before anything is read or stored.
    let before = records(db).await;
    let tampered = good.replace("1999", "1");
    let signature = sign(SECRET, now(), good.as_bytes());
    let response = reqwest::Client::new()
        .post(server.url("/callbacks/acmepay"))
        .header("x-pay-signature", signature)
        .body(tampered)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401, "tampered");
    let expired = post(&server, &paid("T7", "o2", 500), Some(now() - 600)).await;
    assert_eq!(expired.0, 401);
    assert!(expired.1.contains("window"), "{}", expired.1);
    let unsigned = post(&server, &paid("T7", "o2", 500), None).await;
    assert_eq!(unsigned, (401, "no x-pay-signature header".into()));
    let forged = sign(b"guessed", now(), paid("T7", "o2", 500).as_bytes());
    let response = reqwest::Client::new()
        .post(server.url("/callbacks/acmepay"))
        .header("x-pay-signature", forged)
        .body(paid("T7", "o2", 500))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401, "forged");
    assert_eq!(
        records(db).await,
        before,
        "no record for a refused signature"
    );
    assert!(dtx_payments::parked(&db.pool).await.unwrap().is_empty());
    assert_eq!(shop::state(&db.pool, "o2").await, ("WAIT_PAY".into(), 0));

    // Verified but not applicable: parked, 409, never "success".
    let cases = [
        (
            paid("T1", "o1", 1),
            "o1",
            "another order, amount or currency",
        ),
        (
            paid("T2", "o2", 400),
            "o2",
            "400 EUR paid for order o2 of 500 EUR",
        ),
        (paid("T3", "o3", 700), "o3", "order o3 is CLOSED"),
        (paid("T9", "o1", 1999), "o1", "PAID was entered by \"T1\""),
        (
            body("shop-2", "T4", "o2", 500, "payment.succeeded"),
            "o2",
            "merchant shop-2",
        ),
    ];
    for (callback, order, reason) in &cases {
        let (status, _) = post(&server, callback, Some(now())).await;
        assert_eq!(status, 409, "{reason}");
        let parked = dtx_payments::parked(&db.pool).await.unwrap();
        let found = parked.iter().find(|p| p.reason.contains(reason));
        let found = found.unwrap_or_else(|| panic!("{reason} not in {parked:?}"));
        assert_eq!(found.order_no, *order);
    }
    // A repeat of a parked callback is counted on its row.
    assert_eq!(post(&server, &cases[1].0, Some(now())).await.0, 409);
    let parked = dtx_payments::parked(&db.pool).await.unwrap();
    assert_eq!(parked.len(), cases.len());
    let twice = parked.iter().find(|p| p.trade_no == "T2").unwrap();
    assert_eq!(twice.repeats, 2);
    // Nothing of them was applied.
    assert_eq!(shop::state(&db.pool, "o1").await, ("PAID".into(), 1));
    assert_eq!(shop::state(&db.pool, "o2").await, ("WAIT_PAY".into(), 0));
    assert_eq!(shop::state(&db.pool, "o3").await, ("CLOSED".into(), 0));
    assert_eq!((payments(db, "o2").await, events(db, "o2").await), (0, 0));
    assert_eq!((payments(db, "o3").await, events(db, "o3").await), (0, 0));
    assert_eq!((payments(db, "o1").await, events(db, "o1").await), (1, 1));
    // A person resolves one.
    assert!(dtx_payments::resolve(&db.pool, twice.id).await.unwrap());
    assert!(!dtx_payments::resolve(&db.pool, twice.id).await.unwrap());
    assert_eq!(
        dtx_payments::parked(&db.pool).await.unwrap().len(),
        cases.len() - 1
    );

    // The correct payment for o2 still applies; an unknown event type is acknowledged and
    // ignored; a signed body that is no notification is a 400.
    assert_eq!(
        post(&server, &paid("T5", "o2", 500), Some(now())).await.0,
        200
    );
    assert_eq!(shop::state(&db.pool, "o2").await, ("PAID".into(), 1));
    let pending = body("shop-1", "T6", "o2", 500, "payment.pending");
    assert_eq!(
        post(&server, &pending, Some(now())).await,
        (200, "success".into())
    );
    assert_eq!(post(&server, "{\"amount\":1}", Some(now())).await.0, 400);
    assert_eq!(shop::state(&db.pool, "o2").await, ("PAID".into(), 1));
}

async fn concurrent_repeats_apply_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    shop::create_table(&db.pool).await;
    let server = HttpServer::start(callbacks(db).router("/callbacks/acmepay")).await;
    let server: &'static HttpServer = Box::leak(Box::new(server));
    for round in 0..5 {
        let order = format!("c{round}");
        shop::place(&db.pool, &order, 300, "WAIT_PAY").await;
        let callback = paid(&format!("TC{round}"), &order, 300);
        let posts: Vec<_> = (0..12)
            .map(|_| {
                let callback = callback.clone();
                tokio::spawn(async move {
                    // A provider sends again until it is acknowledged.
                    for _ in 0..200 {
                        let (status, text) = post(server, &callback, Some(now())).await;
                        match status {
                            200 => return text,
                            503 => tokio::time::sleep(Duration::from_millis(20)).await,
                            other => panic!("{other}: {text}"),
                        }
                    }
                    panic!("never acknowledged");
                })
            })
            .collect();
        for post in posts {
            assert_eq!(post.await.unwrap(), "success");
        }
        assert_eq!(shop::state(&db.pool, &order).await, ("PAID".into(), 1));
        assert_eq!(
            (payments(db, &order).await, events(db, &order).await),
            (1, 1)
        );
    }
}

test_on_all_databases!(
    callbacks_are_applied_once_and_refused_when_they_must_be,
    SCHEMAS
);
test_on_all_databases!(concurrent_repeats_apply_once, SCHEMAS);
