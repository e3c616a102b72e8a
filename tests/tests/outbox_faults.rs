//! Every outbox fault in one run, counting effects rather than deliveries: while a producer
//! commits (and rolls back) events on a few keys, two relay processes are SIGKILLed and started
//! again at random, the broker - a file-backed NATS server or a RabbitMQ node of this test's
//! own - is SIGKILLed and restarted twice, and the consumer process is SIGKILLed at random and
//! also dies on its own between committing an event and acknowledging it. Afterwards every
//! committed event has exactly one effect (one `credits` row), no rolled-back one has any, every
//! row is sent and nothing is parked; the JetStream stream holds each committed event once, in
//! order per key (RabbitMQ keeps no de-duplication window: its queue may carry a re-published
//! event twice, which the consumer drops). On SQLite, PostgreSQL and MariaDB.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use dtx_sql::{Schema, SqlRow};
use dtx_tests::brokers::{Kind, OwnBroker};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::outbox::{assert_in_order_per_key, enqueue, read_all};
use dtx_tests::test_on_all_databases;
use tokio::process::{Child, Command};

const KEYS: usize = 6;
const EVENTS: usize = 360;
/// Between two enqueues: the producer runs about 5 s, while the faults land.
const PACE: Duration = Duration::from_millis(15);
/// Chance that the consumer dies after committing a first delivery, before its ack.
const CONSUMER_CRASH_RATE: &str = "0.03";

/// The processes under test, started again whenever they died or were killed.
struct Processes {
    db_url: String,
    /// How the relays and the consumer reach the broker.
    relay_args: Vec<String>,
    consumer_args: Vec<String>,
    relays: Vec<Child>,
    consumer: Child,
    relay_kills: u32,
    consumer_kills: u32,
    consumer_crashes: u32,
}

impl Processes {
    fn relay(&self) -> Child {
        Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(["--db", &self.db_url])
            .args(&self.relay_args)
            .args(["--lease", "500ms"])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start a relay process")
    }

    fn consumer(&self) -> Child {
        Command::new(env!("CARGO_BIN_EXE_outbox-consumer"))
            .args(["--db", &self.db_url])
            .args(&self.consumer_args)
            .args(["--crash-rate", CONSUMER_CRASH_RATE])
            .kill_on_drop(true)
            .spawn()
            .expect("start the consumer process")
    }

    /// Starts again whatever exited (a consumer that crashed before its ack exits with 3).
    fn revive(&mut self) {
        for i in 0..self.relays.len() {
            if self.relays[i].try_wait().expect("relay status").is_some() {
                self.relays[i] = self.relay();
            }
        }
        if let Some(status) = self.consumer.try_wait().expect("consumer status") {
            if status.code() == Some(3) {
                self.consumer_crashes += 1;
            }
            self.consumer = self.consumer();
        }
    }

    /// One random fault: a relay or the consumer SIGKILLed (and started again), or none.
    async fn strike(&mut self) {
        let roll: f64 = rand::random();
        if roll < 0.35 {
            let i = rand::random_range(0..self.relays.len());
            self.relays[i].kill().await.expect("SIGKILL a relay");
            self.relays[i] = self.relay();
            self.relay_kills += 1;
        } else if roll < 0.5 {
            self.consumer.kill().await.expect("SIGKILL the consumer");
            self.consumer = self.consumer();
            self.consumer_kills += 1;
        }
    }
}

async fn through_jetstream<DB: TestBackend>(db: &'static TestDb<DB>) {
    every_committed_event_takes_effect_once(db, Kind::Nats).await;
}

async fn through_rabbitmq<DB: TestBackend>(db: &'static TestDb<DB>) {
    every_committed_event_takes_effect_once(db, Kind::RabbitMq).await;
}

async fn every_committed_event_takes_effect_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
    kind: Kind,
) {
    let Some(mut broker) = OwnBroker::start(kind).await else {
        return;
    };
    dtx_tests::idempotency::create_tables(&db.pool).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let url = broker.url();
    let (topic, stream, relay_args, consumer_args) = match kind {
        Kind::Nats => {
            let js = jetstream::new(async_nats::connect(url.as_str()).await.expect("nats"));
            let name = format!("FAULTS_{run}");
            let stream = js
                .create_stream(stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("faults.{run}.>")],
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .expect("create stream");
            stream
                .create_consumer(consumer::pull::Config {
                    durable_name: Some("effects".into()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(1),
                    ..Default::default()
                })
                .await
                .expect("create the durable consumer");
            let consumer = strings(&["--nats", &url, "--stream", &name, "--durable", "effects"]);
            let topic = format!("faults.{run}.orders");
            (topic, Some(stream), strings(&["--nats", &url]), consumer)
        }
        Kind::RabbitMq => {
            let properties = lapin::ConnectionProperties::default();
            let connection = lapin::Connection::connect(&url, properties).await.unwrap();
            let channel = connection.create_channel().await.unwrap();
            let queue = format!("faults.{run}");
            let durable = lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            channel
                .queue_declare(&queue, durable, Default::default())
                .await
                .expect("declare the queue");
            connection.close(200, "declared").await.ok();
            let consumer = strings(&["--amqp", &url, "--queue", &queue]);
            (queue, None, strings(&["--amqp", &url]), consumer)
        }
    };

    let producer = tokio::spawn(async move {
        let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
        for n in 0..EVENTS {
            let key = format!("k{}", n % KEYS);
            let commit = n % 9 != 4;
            let id = enqueue(&db.pool, &topic, &key, &format!("{key}:{n}"), commit).await;
            if commit {
                &mut committed
            } else {
                &mut rolled_back
            }
            .push(id);
            tokio::time::sleep(PACE).await;
        }
        (committed, rolled_back)
    });

    let mut processes = Processes {
        db_url: db.url.clone(),
        relay_args,
        consumer_args,
        relays: Vec::new(),
        consumer: Command::new("true").spawn().unwrap(),
        relay_kills: 0,
        consumer_kills: 0,
        consumer_crashes: 0,
    };
    processes.relays = vec![processes.relay(), processes.relay()];
    processes.consumer = processes.consumer();
    let mut tick = 0u32;
    // At least 27 ticks (3 broker restarts) whatever the pace: a RabbitMQ node takes seconds
    // to start again, and the faults go on while the backlog drains.
    while !producer.is_finished() || tick < 27 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        tick += 1;
        if tick.is_multiple_of(9) {
            broker.restart(Duration::from_millis(300)).await;
        } else {
            processes.strike().await;
        }
        processes.revive();
    }
    let (committed, rolled_back) = producer.await.unwrap();

    // The faults stop; whatever runs now must finish the work.
    let mut effects = BTreeMap::new();
    for _ in 0..900 {
        processes.revive();
        effects = credits(db).await;
        let backlog = dtx_outbox::backlog(&db.pool).await.unwrap();
        if backlog.waiting == 0 && effects.len() >= committed.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let faults = format!(
        "{} relay kills, {} consumer kills, {} consumer crashes before the ack, {} broker starts",
        processes.relay_kills, processes.consumer_kills, processes.consumer_crashes, broker.starts
    );
    eprintln!("{} {kind:?}: {faults}", DB::NAME);
    assert_eq!(dtx_outbox::backlog(&db.pool).await.unwrap().parked, 0);
    let missing: Vec<&String> = committed
        .iter()
        .filter(|id| !effects.contains_key(*id))
        .collect();
    let doubled: Vec<(&String, &i64)> = effects.iter().filter(|(_, n)| **n > 1).collect();
    let phantom: Vec<&String> = rolled_back
        .iter()
        .filter(|id| effects.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty() && doubled.is_empty() && phantom.is_empty(),
        "each committed event takes effect once: {} missing {:?}, {} doubled {:?}, {} rolled \
         back but applied {:?} ({faults})",
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>(),
        doubled.len(),
        doubled.iter().take(3).collect::<Vec<_>>(),
        phantom.len(),
        phantom.iter().take(3).collect::<Vec<_>>(),
    );
    assert_eq!(effects.len(), committed.len(), "nothing else took effect");
    let backlog = dtx_outbox::backlog(&db.pool).await.unwrap();
    assert_eq!(backlog.waiting, 0, "every row sent");
    if let Some(stream) = stream {
        let messages = read_all(&stream).await;
        let mut ids: Vec<&str> = messages.iter().map(|(id, _, _)| id.as_str()).collect();
        ids.sort();
        let mut committed = committed;
        committed.sort();
        assert_eq!(ids, committed, "the stream holds each committed event once");
        assert_in_order_per_key(messages.iter().map(|m| m.2.as_str()));
    }
    assert!(
        processes.relay_kills > 0 && processes.consumer_kills + processes.consumer_crashes > 0,
        "the faults happened: {faults}"
    );
    assert!(broker.starts >= 3, "the broker was restarted: {faults}");
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Effects per event: the `credits` rows of each event id.
async fn credits<DB: TestBackend>(db: &TestDb<DB>) -> BTreeMap<String, i64> {
    let rows = db
        .rows("SELECT event_id, COUNT(*) FROM credits GROUP BY event_id")
        .await;
    let mut counted = HashMap::new();
    for row in rows {
        counted.insert(row.text(0).unwrap(), row.i64(1).unwrap());
    }
    counted.into_iter().collect()
}

const SCHEMAS: &[Schema] = &[Schema::Outbox, Schema::Idempotency];
test_on_all_databases!(through_jetstream, SCHEMAS);
test_on_all_databases!(through_rabbitmq, SCHEMAS);
