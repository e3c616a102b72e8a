//! The consumer helper against the real NATS JetStream (async-nats), on SQLite, PostgreSQL and
//! MariaDB: the ack of the first message is withheld so the broker redelivers it (short
//! `ack_wait`), the producer publishes the same business event twice, and one handler run fails
//! half-way. The `credits` table has no unique key, so any second effect would show.
//!
//! NATS is found through `DTX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`); when it is
//! unreachable the test is skipped with a message, except under `CI=true`, where it fails.
//! Every run uses its own stream and subject (in memory, expiring), so runs never collide.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use dtx_sdk::barrier::HandlerError;
use dtx_sdk::idempotency::Error;
use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
use dtx_sdk::idempotency::{Idempotency, RequestHash};
use dtx_sql::{Conn, Schema, args};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{count, create_tables, credits_for, nats};
use dtx_tests::test_on_all_databases;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;

const SCHEMAS: &[Schema] = &[Schema::Idempotency];

/// Deliveries of the first message before it is finally acknowledged.
const WITHHELD_DELIVERIES: i64 = 3;

/// The consumer's business write: one credit row per event, in the consumer's transaction.
/// `fail_once` makes the next run fail *after* its insert, which must then roll back.
fn credit<C: Conn>(
    event: &Value,
    fail_once: &Arc<AtomicBool>,
) -> impl for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync {
    let event_id = event["event_id"].as_str().unwrap().to_string();
    let account = event["account"].as_str().unwrap().to_string();
    let amount = event["amount"].as_i64().unwrap();
    let fail_once = fail_once.clone();
    move |conn| {
        let (event_id, account, fail_once) = (event_id.clone(), account.clone(), fail_once.clone());
        Box::pin(async move {
            conn.execute(
                "INSERT INTO credits (event_id, account, amount) VALUES (?, ?, ?)",
                args![&event_id, &account, amount],
            )
            .await?;
            if fail_once.swap(false, SeqCst) {
                return Err("the ledger service timed out".into());
            }
            Ok(())
        })
    }
}

async fn jetstream_redeliveries_have_one_effect<DB: TestBackend>(db: &'static TestDb<DB>) {
    let Some(client) = nats().await else {
        return;
    };
    create_tables(&db.pool).await;
    let js = jetstream::new(client);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let stream_name = format!("DTX_IDEM_{run}");
    let subject = format!("dtx.idem.{run}");
    let stream = js
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            // Leftovers of a crashed run disappear on their own.
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create stream");
    let pull = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("ledger".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(500),
            max_deliver: 20,
            ..Default::default()
        })
        .await
        .expect("create consumer");

    // E1, then E1 again as the producer's retry (a new broker message, fields reordered), then
    // E2, whose first handler run fails.
    for payload in [
        r#"{"event_id": "E1", "account": "acct", "amount": 10}"#,
        r#"{"amount": 10, "event_id": "E1", "account": "acct"}"#,
        r#"{"event_id": "E2", "account": "acct", "amount": 5}"#,
    ] {
        js.publish(subject.clone(), payload.into())
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    let helper = Consumer::new(Idempotency::new(db.pool.clone()), "ledger-credits", 1).unwrap();
    let e2_fails_once = Arc::new(AtomicBool::new(true));
    let never = Arc::new(AtomicBool::new(false));
    let mut messages = pull.messages().await.expect("message stream");
    // (stream sequence, delivery count, what the helper said; None = the handler failed)
    let mut log: Vec<(u64, i64, Option<Delivery>)> = Vec::new();
    let mut acked = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, messages.next())
            .await
            .unwrap_or_else(|_| panic!("not every message was acknowledged in time: {log:?}"))
            .expect("stream ended")
            .expect("message");
        let (seq, delivered) = {
            let info = message.info().expect("jetstream info");
            (info.stream_sequence, info.delivered)
        };
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        let event_id = event["event_id"].as_str().unwrap().to_string();
        let fail = if event_id == "E2" {
            &e2_fails_once
        } else {
            &never
        };
        let outcome = helper
            .handle(
                &event_id,
                &RequestHash::of_json(&event),
                credit(&event, fail),
            )
            .await;
        let delivery = match outcome {
            Ok(delivery) => Some(delivery),
            Err(Error::Handler(_)) => None,
            Err(e) => panic!("consumer failed: {e}"),
        };
        log.push((seq, delivered, delivery.clone()));
        let withhold = seq == 1 && delivered < WITHHELD_DELIVERIES;
        if delivery.is_some_and(|d| d.should_ack()) && !withhold {
            message.ack().await.expect("ack");
            acked.insert(seq);
        }
    }
    js.delete_stream(&stream_name).await.expect("delete stream");

    let of = |seq: u64| -> Vec<(i64, Option<Delivery>)> {
        log.iter()
            .filter(|(s, _, _)| *s == seq)
            .map(|(_, d, delivery)| (*d, delivery.clone()))
            .collect()
    };
    assert_eq!(
        of(1),
        vec![
            (1, Some(Delivery::Processed)),
            (2, Some(Delivery::Duplicate)),
            (3, Some(Delivery::Duplicate)),
        ],
        "the broker redelivered the unacknowledged message; only the first delivery had an effect"
    );
    assert_eq!(of(2), vec![(1, Some(Delivery::Duplicate))], "{log:?}");
    assert_eq!(
        of(3),
        vec![(1, None), (2, Some(Delivery::Processed))],
        "a failed run leaves no record, so the redelivery runs it"
    );
    assert_eq!(credits_for(&db.pool, "E1").await, 1);
    assert_eq!(credits_for(&db.pool, "E2").await, 1);
    assert_eq!(
        count(
            &db.pool,
            "SELECT COUNT(*) FROM credits WHERE account = ?",
            "acct"
        )
        .await,
        2,
        "two events, two credits"
    );
}
test_on_all_databases!(jetstream_redeliveries_have_one_effect, SCHEMAS);
