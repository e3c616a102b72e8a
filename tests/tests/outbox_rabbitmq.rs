//! The transactional outbox relayed to the real RabbitMQ (publisher confirms), on SQLite,
//! PostgreSQL and MariaDB: four relays put each committed event on the queue once, in order per
//! key; an event no queue takes (mandatory, returned) parks; and a relay that dies after the
//! broker confirmed a batch makes the next relay publish it again - RabbitMQ keeps no
//! de-duplication window, so the queue holds those events twice - while a consumer applying
//! events through the idempotency records by their `message_id` still has each effect once,
//! also when its own first handling is not acknowledged.
//!
//! RabbitMQ is found through `DTX_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`);
//! unreachable, the test is skipped with a message, except under `CI=true`, where it fails.

use std::time::Duration;

use dtx_outbox::{RabbitMq, Relay, consume};
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::outbox::{
    DiesAfterPublishing, assert_in_order_per_key, config, credit, drained, enqueue,
};
use dtx_tests::test_on_all_databases;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

const SCHEMAS: &[Schema] = &[Schema::Outbox];

fn amqp_url() -> String {
    std::env::var("DTX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A channel to RabbitMQ, or `None` (skipped) when it is unreachable outside CI.
async fn rabbit() -> Option<Channel> {
    let url = amqp_url();
    let connected = tokio::time::timeout(
        Duration::from_secs(5),
        Connection::connect(&url, ConnectionProperties::default()),
    )
    .await;
    match connected {
        Ok(Ok(connection)) => Some(connection.create_channel().await.expect("a channel")),
        other => {
            let message = format!("RabbitMQ at {url} is unreachable: {other:?}");
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("{message} (CI=true: RabbitMQ tests must not be skipped)");
            }
            eprintln!("SKIPPED: {message}");
            None
        }
    }
}

/// A queue of this run (deleted by the broker a minute after its last use).
async fn queue_for_run(channel: &Channel) -> String {
    let name = format!("dtx.outbox.{}", uuid::Uuid::new_v4().simple());
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongUInt(60_000));
    channel
        .queue_declare(&name, QueueDeclareOptions::default(), arguments)
        .await
        .expect("declare the queue");
    name
}

async fn publisher(channel: &Channel) -> RabbitMq {
    RabbitMq::new(channel.clone(), "")
        .await
        .expect("confirm mode")
}

/// Takes every message of `queue`: (message_id, payload, kind header), acknowledged.
async fn take_all(channel: &Channel, queue: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    while let Some(message) = channel
        .basic_get(queue, BasicGetOptions::default())
        .await
        .expect("basic.get")
    {
        let delivery = message.delivery;
        let id = delivery
            .properties
            .message_id()
            .clone()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let kind = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("kind").cloned())
            .map(|v| match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        out.push((id, String::from_utf8(delivery.data.clone()).unwrap(), kind));
        delivery.ack(BasicAckOptions::default()).await.expect("ack");
    }
    out
}

async fn relays_put_each_committed_event_on_the_queue_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(channel) = rabbit().await else {
        return;
    };
    let queue = queue_for_run(&channel).await;
    let mut committed = Vec::new();
    for n in 0..10 {
        for key in ["k0", "k1", "k2", "k3", "k4", "k5"] {
            committed.push(enqueue(&db.pool, &queue, key, &format!("{key}:{n}"), true).await);
        }
    }
    let mut relays = Vec::new();
    for owner in ["relay-a", "relay-b", "relay-c", "relay-d"] {
        let relay =
            Relay::new(db.pool.clone(), publisher(&channel).await).with_config(config(owner));
        relays.push(tokio::spawn(relay.run(std::future::pending())));
    }
    drained(&db.pool).await;
    for relay in relays {
        relay.abort();
    }
    let messages = take_all(&channel, &queue).await;
    let mut ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    committed.sort();
    assert_eq!(ids, committed);
    assert!(
        messages.iter().all(|(_, _, kind)| kind == "test"),
        "headers travel"
    );
    assert_in_order_per_key(messages.iter().map(|m| m.1.as_str()));
}

async fn an_event_no_queue_takes_parks<DB: TestBackend>(db: &'static TestDb<DB>) {
    let Some(channel) = rabbit().await else {
        return;
    };
    let nowhere = format!("dtx.nowhere.{}", uuid::Uuid::new_v4().simple());
    let stuck = enqueue(&db.pool, &nowhere, "k", "k:0", true).await;
    let relay = Relay::new(db.pool.clone(), publisher(&channel).await).with_config(config("r"));
    let running = tokio::spawn(relay.run(std::future::pending()));
    let mut last = None;
    for _ in 0..1000 {
        last = dtx_outbox::status(&db.pool, &stuck).await.unwrap();
        if last.as_ref().is_some_and(|s| s.0 == "PARKED") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.abort();
    let (status, attempts, error) = last.unwrap();
    assert_eq!((status.as_str(), attempts), ("PARKED", 3));
    assert!(error.is_some_and(|e| e.contains("unroutable")), "says why");
}

async fn a_consumer_applies_each_event_once_though_the_queue_holds_it_twice<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
    use dtx_sdk::idempotency::{Idempotency, RequestHash};
    let Some(channel) = rabbit().await else {
        return;
    };
    dtx_tests::idempotency::create_tables(&db.pool).await;
    let queue = queue_for_run(&channel).await;
    let mut events = Vec::new();
    for n in 0..6 {
        let key = format!("acct{}", n % 2);
        events.push(enqueue(&db.pool, &queue, &key, &format!("{key}:{n}"), true).await);
    }
    // A relay publishes a batch (confirmed) and dies before marking it; the next one publishes
    // it again after the lease.
    let dying = Relay::new(
        db.pool.clone(),
        DiesAfterPublishing(publisher(&channel).await),
    )
    .with_config(config("dies"));
    let round = tokio::spawn(async move { dying.round().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    round.abort();
    let relay = Relay::new(db.pool.clone(), publisher(&channel).await).with_config(config("next"));
    let running = tokio::spawn(relay.run(std::future::pending()));
    drained(&db.pool).await;
    running.abort();

    let helper = Consumer::new(Idempotency::new(db.pool.clone()), "credits", 1).unwrap();
    let (mut deliveries, mut duplicates, mut rejected) = (0, 0, false);
    while let Some(message) = channel
        .basic_get(&queue, BasicGetOptions::default())
        .await
        .expect("basic.get")
    {
        let delivery = message.delivery;
        deliveries += 1;
        if !rejected {
            // Committed, then the consumer goes away without its ack: back on the queue.
            rejected = true;
            let event_id = delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string();
            let content = RequestHash::of_bytes(&delivery.data);
            let handled = helper.handle(&event_id, &content, credit(&event_id)).await;
            assert_eq!(handled.unwrap(), Delivery::Processed);
            let requeue = BasicRejectOptions { requeue: true };
            delivery.reject(requeue).await.unwrap();
            continue;
        }
        let event_id = delivery
            .properties
            .message_id()
            .clone()
            .unwrap()
            .to_string();
        let apply = credit(&event_id);
        let outcome = consume::amqp(&helper, &delivery, move |conn, _| apply(conn))
            .await
            .unwrap();
        match outcome {
            Delivery::Processed => {}
            Delivery::Duplicate => duplicates += 1,
            other => panic!("{event_id}: {other:?}"),
        }
    }
    assert!(
        duplicates >= 2,
        "the re-published and the rejected ones came twice: {duplicates}"
    );
    assert!(
        deliveries > events.len(),
        "{deliveries} deliveries of {} events",
        events.len()
    );
    for id in &events {
        assert_eq!(
            dtx_tests::idempotency::credits_for(&db.pool, id).await,
            1,
            "{id}"
        );
    }
}

test_on_all_databases!(relays_put_each_committed_event_on_the_queue_once, SCHEMAS);
test_on_all_databases!(an_event_no_queue_takes_parks, SCHEMAS);
test_on_all_databases!(
    a_consumer_applies_each_event_once_though_the_queue_holds_it_twice,
    &[Schema::Outbox, Schema::Idempotency]
);
