//! The transactional outbox relayed to the real NATS JetStream, on SQLite, PostgreSQL and
//! MariaDB: events committed with their business transaction reach the stream exactly once
//! (rolled-back ones never), in order per key, with two relays at once and with a relay that
//! dies mid-batch - in this process, and a relay process SIGKILLed - (its rows are published
//! again after its lease, and the stream drops the duplicates by `Nats-Msg-Id`); an event that cannot be published parks, holds back its key,
//! and goes out once an operator republishes it; a consumer applies each event once through the
//! idempotency records although JetStream delivers one of them twice.
//!
//! Every run uses its own stream and subjects (in memory, expiring), so runs never collide.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use dtx_outbox::{Event, JetStream, Publisher, Relay, consume};
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::nats;
use dtx_tests::outbox::{
    DiesAfterPublishing, assert_in_order_per_key, config, credit, drained, enqueue, read_all,
};
use dtx_tests::test_on_all_databases;
use futures::StreamExt;
use futures::future::BoxFuture;

const SCHEMAS: &[Schema] = &[Schema::Outbox];

/// A stream capturing `<prefix>.>` for this run; returns it and the prefix.
async fn stream_for_run(js: &jetstream::Context) -> (stream::Stream, String) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("dtx.outbox.{run}");
    let stream = js
        .create_stream(stream::Config {
            name: format!("DTX_OUTBOX_{run}"),
            subjects: vec![format!("{prefix}.>")],
            storage: stream::StorageType::Memory,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create stream");
    (stream, prefix)
}

/// A stream for this run and `n` committed events of one key `k` (payloads `k:0`, `k:1`, ...)
/// on it: the jetstream context, the stream and the events' ids in order. `None` when NATS is
/// unreachable outside CI.
async fn backlog_of_one_key<DB: TestBackend>(
    db: &'static TestDb<DB>,
    n: usize,
) -> Option<(jetstream::Context, stream::Stream, Vec<String>)> {
    let js = jetstream::new(nats().await?);
    let (stream, prefix) = stream_for_run(&js).await;
    let topic = format!("{prefix}.orders");
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(enqueue(&db.pool, &topic, "k", &format!("k:{i}"), true).await);
    }
    Some((js, stream, ids))
}

async fn two_relays_publish_each_committed_event_once_in_order<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let (stream, prefix) = stream_for_run(&js).await;
    let topic = format!("{prefix}.orders");
    let mut committed = Vec::new();
    for n in 0..12 {
        for key in ["k0", "k1", "k2", "k3", "k4"] {
            committed.push(enqueue(&db.pool, &topic, key, &format!("{key}:{n}"), true).await);
        }
        // Rolled back: never published.
        enqueue(&db.pool, &topic, "k0", "rolled-back:0", false).await;
    }
    let relays: Vec<_> = ["relay-a", "relay-b"]
        .into_iter()
        .map(|owner| {
            let relay =
                Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config(owner));
            tokio::spawn(relay.run(std::future::pending()))
        })
        .collect();
    drained(&db.pool).await;
    for relay in relays {
        relay.abort();
    }
    let messages = read_all(&stream).await;
    let mut ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    committed.sort();
    assert_eq!(ids, committed, "each committed event once, nothing else");
    assert_in_order_per_key(messages.iter().map(|m| m.2.as_str()));
    for id in &committed {
        let (status, attempts, _) = dtx_outbox::status(&db.pool, id).await.unwrap().unwrap();
        assert_eq!((status.as_str(), attempts), ("SENT", 0));
    }
}

/// Publishes through `inner` except the event whose payload is `refused`.
struct Refuses<P> {
    inner: P,
    refused: &'static str,
}

impl<P: Publisher> Publisher for Refuses<P> {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if event.payload == self.refused.as_bytes() {
                return Err(format!("{} refused", self.refused));
            }
            self.inner.publish(event).await
        })
    }
}

/// One round takes a key's backlog behind its oldest row (up to the batch) and publishes it in
/// order. When a row fails, the rows behind it in that round are not tried: they stay unsent,
/// unclaimed, behind it, and the next round takes them all once it goes out.
async fn a_round_moves_a_keys_backlog_in_order_and_stops_at_a_failure<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some((js, stream, ids)) = backlog_of_one_key(db, 12).await else {
        return;
    };
    let refusing = Refuses {
        inner: JetStream::new(js.clone()),
        refused: "k:5",
    };
    let relay = Relay::new(db.pool.clone(), refusing).with_config(config("first"));
    assert_eq!(relay.round().await.unwrap(), 8, "the batch, all of one key");
    let status = |id| dtx_outbox::status(&db.pool, id);
    for (n, id) in ids.iter().enumerate() {
        let (state, attempts, _) = status(id).await.unwrap().unwrap();
        let expected = match n {
            0..5 => ("SENT", 0),
            5 => ("PENDING", 1),
            _ => ("PENDING", 0),
        };
        assert_eq!((state.as_str(), attempts), expected, "k:{n}");
    }
    // After k:5's backoff (the lease of the untried rows would hold them 500 ms).
    tokio::time::sleep(Duration::from_millis(60)).await;
    let relay = Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("next"));
    assert_eq!(
        relay.round().await.unwrap(),
        7,
        "k:5 and everything behind it"
    );
    let payloads: Vec<String> = read_all(&stream).await.into_iter().map(|m| m.2).collect();
    let expected: Vec<String> = (0..12).map(|n| format!("k:{n}")).collect();
    assert_eq!(payloads, expected);
}

/// Publishes through `inner`, each confirmation taking `delay` longer.
struct Slow<P> {
    inner: P,
    delay: Duration,
}

impl<P: Publisher> Publisher for Slow<P> {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.inner.publish(event).await
        })
    }
}

/// A key's run starts no publish after half the relay's lease: with 150 ms per publish and a
/// 500 ms lease, a round claims 8 rows of one key but publishes only the first few, and frees
/// the rest at once - another relay takes them immediately instead of after the lease, and no
/// row is still being published when its claim could pass to someone else.
async fn a_run_stops_at_half_the_lease_and_frees_the_rest<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some((js, stream, ids)) = backlog_of_one_key(db, 8).await else {
        return;
    };
    let slow = Slow {
        inner: JetStream::new(js.clone()),
        delay: Duration::from_millis(150),
    };
    let relay = Relay::new(db.pool.clone(), slow).with_config(config("slow"));
    assert_eq!(relay.round().await.unwrap(), 8, "the whole run is claimed");
    let mut sent = 0;
    for id in &ids {
        if dtx_outbox::status(&db.pool, id).await.unwrap().unwrap().0 == "SENT" {
            sent += 1;
        }
    }
    assert!(
        (1..=3).contains(&sent),
        "{sent} of 8 published before half the lease"
    );
    // Freed, not leased: the next relay's first round takes all the rest.
    let relay = Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("next"));
    assert_eq!(relay.round().await.unwrap(), 8 - sent);
    let payloads: Vec<String> = read_all(&stream).await.into_iter().map(|m| m.2).collect();
    let expected: Vec<String> = (0..8).map(|n| format!("k:{n}")).collect();
    assert_eq!(payloads, expected);
}

async fn a_relay_dying_mid_batch_leaves_its_rows_to_another<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let (stream, prefix) = stream_for_run(&js).await;
    let topic = format!("{prefix}.orders");
    let mut committed = Vec::new();
    for n in 0..5 {
        for key in ["a", "b", "c"] {
            committed.push(enqueue(&db.pool, &topic, key, &format!("{key}:{n}"), true).await);
        }
    }
    // The first relay claims a batch, publishes it and dies before marking anything.
    let dying = Relay::new(
        db.pool.clone(),
        DiesAfterPublishing(JetStream::new(js.clone())),
    )
    .with_config(config("dies"));
    let round = tokio::spawn(async move { dying.round().await });
    for _ in 0..500 {
        if stream.clone().info().await.unwrap().state.messages >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    round.abort();
    assert_eq!(dtx_outbox::backlog(&db.pool).await.unwrap().waiting, 15);

    // After its lease the second relay publishes everything, the dead one's rows again.
    let relay =
        Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("survivor"));
    let survivor = tokio::spawn(relay.run(std::future::pending()));
    drained(&db.pool).await;
    survivor.abort();
    let messages = read_all(&stream).await;
    let mut ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    committed.sort();
    assert_eq!(
        ids, committed,
        "the stream dropped the re-published duplicates"
    );
    assert_in_order_per_key(messages.iter().map(|m| m.2.as_str()));
}

async fn an_unpublishable_event_parks_and_holds_its_key_until_republished<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let (stream, prefix) = stream_for_run(&js).await;
    // No stream captures this topic: JetStream refuses every publish to it.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let nowhere = format!("dtx.nowhere.{run}");
    let stuck = enqueue(&db.pool, &nowhere, "k", "k:0", true).await;
    let behind = enqueue(&db.pool, &format!("{prefix}.orders"), "k", "k:1", true).await;
    let other = enqueue(&db.pool, &format!("{prefix}.orders"), "j", "j:0", true).await;
    let relay = Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("r"));
    let running = tokio::spawn(relay.run(std::future::pending()));
    let mut parked = None;
    for _ in 0..1000 {
        let status = dtx_outbox::status(&db.pool, &stuck).await.unwrap().unwrap();
        if status.0 == "PARKED" {
            parked = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, attempts, error) = parked.expect("the event parked");
    assert_eq!(attempts, 3);
    assert!(
        error.is_some_and(|e| e.contains(&nowhere)),
        "names the topic"
    );
    let backlog = dtx_outbox::backlog(&db.pool).await.unwrap();
    assert_eq!((backlog.waiting, backlog.parked), (1, 1), "{backlog:?}");
    let status = |id| dtx_outbox::status(&db.pool, id);
    assert_eq!(
        status(&other).await.unwrap().unwrap().0,
        "SENT",
        "other keys go on"
    );
    assert_eq!(
        status(&behind).await.unwrap().unwrap().0,
        "PENDING",
        "its key waits"
    );

    // The operator makes the topic publishable and republishes: both go out, in order.
    js.create_stream(stream::Config {
        name: format!("DTX_NOWHERE_{run}"),
        subjects: vec![nowhere.clone()],
        storage: stream::StorageType::Memory,
        max_age: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("create the missing stream");
    assert!(dtx_outbox::republish(&db.pool, &stuck).await.unwrap());
    assert!(
        !dtx_outbox::republish(&db.pool, &stuck).await.unwrap(),
        "once"
    );
    drained(&db.pool).await;
    running.abort();
    assert_eq!(status(&stuck).await.unwrap().unwrap().0, "SENT");
    assert_eq!(status(&behind).await.unwrap().unwrap().0, "SENT");
    let ids: Vec<String> = read_all(&stream).await.into_iter().map(|m| m.0).collect();
    assert_eq!(ids, [other, behind]);
}

/// A relay process SIGKILLed between JetStream's acknowledgement and its update of the row: a
/// relay started afterwards publishes the killed one's rows again once its lease ran out, and
/// the stream keeps each event once.
async fn a_relay_process_killed_mid_batch<DB: TestBackend>(db: &'static TestDb<DB>) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let (stream, prefix) = stream_for_run(&js).await;
    let topic = format!("{prefix}.orders");
    let mut committed = Vec::new();
    for n in 0..4 {
        for key in ["a", "b", "c", "d"] {
            committed.push(enqueue(&db.pool, &topic, key, &format!("{key}:{n}"), true).await);
        }
    }
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "--db",
            &db.url,
            "--nats",
            &dtx_tests::idempotency::nats_url(),
        ])
        .args(["--lease", "500ms", "--hold", "30s"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the relay process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(
        matches!(&first, Ok(Ok(Some(line))) if line.starts_with("published ")),
        "the relay process published nothing: {first:?}"
    );
    child.kill().await.expect("SIGKILL the relay");
    assert_eq!(dtx_outbox::backlog(&db.pool).await.unwrap().waiting, 16);

    let relay =
        Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("after"));
    let running = tokio::spawn(relay.run(std::future::pending()));
    drained(&db.pool).await;
    running.abort();
    let messages = read_all(&stream).await;
    let mut ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    committed.sort();
    assert_eq!(ids, committed, "each event once across the kill");
    assert_in_order_per_key(messages.iter().map(|m| m.2.as_str()));
}

/// Relayed events applied by a consumer through `consume::jetstream`: the first handling of one
/// event commits but its ack is withheld (the consumer "crashed" before acking), so JetStream
/// delivers it again - answered as a duplicate, the effect still once per event.
async fn a_consumer_applies_each_relayed_event_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
    use dtx_sdk::idempotency::{Idempotency, RequestHash};
    let Some(client) = nats().await else { return };
    dtx_tests::idempotency::create_tables(&db.pool).await;
    let js = jetstream::new(client);
    let (stream, prefix) = stream_for_run(&js).await;
    let topic = format!("{prefix}.credits");
    let mut events = Vec::new();
    for n in 0..10 {
        let key = format!("acct{}", n % 3);
        events.push(enqueue(&db.pool, &topic, &key, &format!("{key}:{n}"), true).await);
    }
    let relay = Relay::new(db.pool.clone(), JetStream::new(js.clone())).with_config(config("r"));
    let relaying = tokio::spawn(relay.run(std::future::pending()));
    let pull = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("credits".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(300),
            ..Default::default()
        })
        .await
        .expect("create consumer");
    let helper = Consumer::new(Idempotency::new(db.pool.clone()), "credits", 1).unwrap();
    let mut messages = pull.messages().await.expect("messages");
    let (mut withheld, mut duplicates, mut processed) = (false, 0, 0);
    while processed < events.len() || duplicates == 0 {
        let message = tokio::time::timeout(Duration::from_secs(20), messages.next())
            .await
            .expect("a message within 20 s (the withheld one comes again)")
            .unwrap()
            .unwrap();
        let headers = message.headers.as_ref().unwrap();
        let event_id = headers.get("Nats-Msg-Id").unwrap().to_string();
        if !withheld {
            // Committed, never acknowledged: a consumer that died before its ack. JetStream
            // delivers it again after ack_wait.
            withheld = true;
            let content = RequestHash::of_bytes(&message.payload);
            let delivery = helper.handle(&event_id, &content, credit(&event_id)).await;
            assert_eq!(delivery.unwrap(), Delivery::Processed);
            processed += 1;
            continue;
        }
        let apply = credit(&event_id);
        let delivery = consume::jetstream(&helper, &message, move |conn, _| apply(conn))
            .await
            .unwrap();
        match delivery {
            Delivery::Processed => processed += 1,
            Delivery::Duplicate => duplicates += 1,
            other => panic!("{event_id}: {other:?}"),
        }
    }
    relaying.abort();
    for id in &events {
        assert_eq!(
            dtx_tests::idempotency::credits_for(&db.pool, id).await,
            1,
            "{id}"
        );
    }
}

test_on_all_databases!(
    two_relays_publish_each_committed_event_once_in_order,
    SCHEMAS
);
test_on_all_databases!(
    a_consumer_applies_each_relayed_event_once,
    &[Schema::Outbox, Schema::Idempotency]
);
test_on_all_databases!(a_relay_dying_mid_batch_leaves_its_rows_to_another, SCHEMAS);
test_on_all_databases!(
    a_round_moves_a_keys_backlog_in_order_and_stops_at_a_failure,
    SCHEMAS
);
test_on_all_databases!(a_run_stops_at_half_the_lease_and_frees_the_rest, SCHEMAS);
test_on_all_databases!(
    an_unpublishable_event_parks_and_holds_its_key_until_republished,
    SCHEMAS
);
test_on_all_databases!(a_relay_process_killed_mid_batch, SCHEMAS);
