//! The transactional outbox against JetStream or RabbitMQ: whether one relay keeps up with
//! producers enqueueing at full speed (and the end-to-end latency, enqueue commit -> the
//! consumer has it), how many events per second it moves draining a backlog, beside the rate
//! at which the same number of publishers reach the same broker directly (each publish
//! confirmed) in the same run.
//!
//! ```text
//! cargo run --release -p dtx-bench --bin dtx-outbox-bench -- --seconds 10 --broker nats
//! cargo run --release -p dtx-bench --bin dtx-outbox-bench -- --seconds 10 --broker rabbitmq
//! ```

#[path = "../stats.rs"]
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use clap::Parser;
use dtx_outbox::{Event, JetStream, Publisher, RabbitMq, Relay, RelayConfig};
use dtx_sql::{Backend, Dialect, sqlx};
use futures::StreamExt;
use futures::future::BoxFuture;

#[derive(Parser)]
struct Args {
    /// The database to create `dtx_bench_outbox` through (PostgreSQL or MySQL/MariaDB URL).
    #[arg(
        long,
        env = "DTX_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    db: String,
    #[arg(
        long,
        env = "DTX_TEST_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: String,
    /// Concurrent producers (each a closed loop of one-event transactions), and as many direct
    /// publishers in the baseline.
    #[arg(long, default_value_t = 16)]
    producers: usize,
    /// Ordering keys the events spread over.
    #[arg(long, default_value_t = 1024)]
    keys: usize,
    /// Measured seconds of each half.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Rows one relay round claims.
    #[arg(long, default_value_t = 256)]
    batch: i64,
    /// Rows of one key a relay round claims (the relay's default: 64).
    #[arg(long, default_value_t = 64)]
    run_per_key: i64,
    /// `nats` (JetStream, file storage) or `rabbitmq` (a durable queue, publisher confirms).
    #[arg(long, default_value = "nats")]
    broker: String,
    #[arg(
        long,
        env = "DTX_TEST_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp: String,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    match dtx_sql::dialect_of_url(&args.db) {
        Some(Dialect::Postgres) => run::<sqlx::Postgres>(args).await,
        Some(Dialect::MySql) => run::<sqlx::MySql>(args).await,
        _ => Err(format!("--db {:?}: a postgres:// or mysql:// URL", args.db).into()),
    }
}

async fn run<DB: Backend>(args: Args) -> Result<(), Error> {
    let admin = DB::connect(&args.db, 2).await?;
    DB::execute_script(&admin, "DROP DATABASE IF EXISTS dtx_bench_outbox".into()).await?;
    DB::execute_script(&admin, "CREATE DATABASE dtx_bench_outbox".into()).await?;
    let url = dtx_sql::with_database(&args.db, "dtx_bench_outbox");
    let pool = DB::connect(&url, (args.producers + 4) as u32).await?;
    dtx_outbox::migrate(&pool).await?;
    let broker = Broker::connect(&args).await?;
    let window = Duration::from_secs_f64(args.seconds);

    // Baseline: the producers publishing straight to the broker (each publish confirmed).
    let direct_topic = broker.topic("direct").await?;
    let published = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut direct = Vec::new();
    for p in 0..args.producers {
        let (publisher, published, topic) = (
            broker.publisher().await?,
            published.clone(),
            direct_topic.clone(),
        );
        direct.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < window {
                let event = Event {
                    id: n,
                    event_id: format!("direct-{p}-{n}"),
                    topic: topic.clone(),
                    key: String::new(),
                    headers: Default::default(),
                    payload: b"x".to_vec(),
                    attempts: 0,
                    created_at: 0,
                };
                if publisher.publish(&event).await.is_ok() {
                    published.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
        }));
    }
    for task in direct {
        task.await?;
    }
    let direct_rate = published.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    // Keeping up: producers enqueue while one relay publishes and one consumer receives.
    let live = Phase::start(
        &args,
        &pool,
        &broker,
        &broker.topic("live").await?,
        args.run_per_key,
    )
    .await?;
    let produced = produce::<DB>(&args, &pool, &live.topic, window).await;
    let (got, took, latency) = live.finish(produced).await;
    println!(
        "{} keeping up ({:?}, {} producers, {} keys, batch {}): enqueued {produced} \
         ({:.0}/s) in {:.1} s, the consumer had them all after {:.1} s; end to end (enqueue \
         commit -> consumer) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.broker,
        <DB::Conn as dtx_sql::Conn>::DIALECT,
        args.producers,
        args.keys,
        args.batch,
        produced as f64 / window.as_secs_f64(),
        window.as_secs_f64(),
        took.as_secs_f64(),
        latency.p50_ms,
        latency.p99_ms,
        latency.max_ms,
    );
    check(got, produced)?;

    // Capacity: a backlog enqueued first, then one relay drains it - claiming only each key's
    // oldest row per round (the baseline) or runs of up to `--run-per-key`, in the order
    // baseline, runs, runs, baseline, with fresh planner statistics before each drain (the
    // first drain after a bulk insert otherwise meets a planner that thinks the table empty).
    let mut rates = [Vec::new(), Vec::new()];
    for (arm, run_per_key) in [(0, 1), (1, args.run_per_key), (1, args.run_per_key), (0, 1)] {
        let topic = broker
            .topic(&format!("backlog-{}-{arm}", rates[arm].len()))
            .await?;
        let produced = produce::<DB>(&args, &pool, &topic, window).await;
        let analyze = match <DB::Conn as dtx_sql::Conn>::DIALECT {
            Dialect::MySql => "ANALYZE TABLE dtx_outbox",
            _ => "ANALYZE dtx_outbox",
        };
        DB::execute_script(&pool, analyze.into()).await?;
        let drain = Phase::start(&args, &pool, &broker, &topic, run_per_key).await?;
        let (got, took, _) = drain.finish(produced).await;
        // A slow arm is measured on what it moved before the two-minute cut.
        let rate = got as f64 / took.as_secs_f64();
        let cut = if got < produced {
            format!(", cut after {:.0} s", took.as_secs_f64())
        } else {
            String::new()
        };
        println!(
            "{} one relay draining a backlog of {produced} ({run_per_key} rows per key a \
             round): {got} in {:.1} s{cut}, {rate:.0} events/s ({:.2}x the {direct_rate:.0}/s \
             of {} publishers straight to the broker)",
            args.broker,
            took.as_secs_f64(),
            stats::ratio(rate, direct_rate),
            args.producers,
        );
        rates[arm].push(rate);
        // What a cut arm left must not compete with the next one.
        DB::execute_script(
            &pool,
            "DELETE FROM dtx_outbox WHERE status = 'PENDING'".into(),
        )
        .await?;
    }
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    println!(
        "{} runs of a key per round drain {:.2}x the one-row-per-key baseline ({} keys, means \
         of two drains each)",
        args.broker,
        stats::ratio(mean(&rates[1]), mean(&rates[0])),
        args.keys
    );
    broker.clean_up().await;
    pool.close().await;
    DB::execute_script(&admin, "DROP DATABASE IF EXISTS dtx_bench_outbox".into()).await?;
    Ok(())
}

fn check(got: u64, produced: u64) -> Result<(), Error> {
    if got < produced {
        return Err(format!("the consumer received {got} of {produced} events").into());
    }
    Ok(())
}

/// `args.producers` closed loops of one-event transactions on `topic` for `window` (payload:
/// the enqueue time in Unix ms); how many committed.
async fn produce<DB: Backend>(
    args: &Args,
    pool: &sqlx::Pool<DB>,
    topic: &str,
    window: Duration,
) -> u64 {
    let enqueued = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..args.producers {
        let (pool, enqueued, stop, topic) = (
            pool.clone(),
            enqueued.clone(),
            stop.clone(),
            topic.to_string(),
        );
        let keys = args.keys;
        producers.push(tokio::spawn(async move {
            let headers = Default::default();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{}", (p * 7919 + n) % keys);
                let mut tx = DB::begin(&pool).await.expect("begin");
                let payload = dtx_sql::now_ms().to_string();
                dtx_outbox::enqueue(
                    DB::conn(&mut tx),
                    &topic,
                    &key,
                    &headers,
                    payload.as_bytes(),
                )
                .await
                .expect("enqueue");
                tx.commit().await.expect("commit");
                enqueued.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    for task in producers {
        task.await.expect("producer");
    }
    enqueued.load(Ordering::Relaxed)
}

/// One relay and one consumer of `topic`, running.
struct Phase {
    topic: String,
    started: Instant,
    received: Arc<AtomicU64>,
    latencies: Arc<std::sync::Mutex<Vec<u32>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Phase {
    /// A consumer on `topic` and a relay claiming at most `run_per_key` rows of a key a round.
    async fn start<DB: Backend>(
        args: &Args,
        pool: &sqlx::Pool<DB>,
        broker: &Broker,
        topic: &str,
        run_per_key: i64,
    ) -> Result<Phase, Error> {
        let received = Arc::new(AtomicU64::new(0));
        let latencies = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
        let record = {
            let (received, latencies) = (received.clone(), latencies.clone());
            move |payload: &[u8]| {
                let sent_ms: i64 = std::str::from_utf8(payload)
                    .ok()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                let micros = (dtx_sql::now_ms() - sent_ms).max(0) * 1000;
                latencies
                    .lock()
                    .unwrap()
                    .push(micros.min(u32::MAX as i64) as u32);
                received.fetch_add(1, Ordering::Relaxed);
            }
        };
        let consumer = broker.consume(topic, record).await?;
        let relay = Relay::new(pool.clone(), broker.publisher().await?).with_config(RelayConfig {
            batch: args.batch,
            run_per_key,
            poll: Duration::from_millis(5),
            retention: None,
            ..RelayConfig::default()
        });
        let relay = tokio::spawn(relay.run(std::future::pending()));
        Ok(Phase {
            topic: topic.to_string(),
            started: Instant::now(),
            received,
            latencies,
            tasks: vec![consumer, relay],
        })
    }

    /// Waits (two minutes at most) until the consumer received `produced` events; what it
    /// received, after how long since the start, and the end-to-end latencies.
    async fn finish(self, produced: u64) -> (u64, Duration, stats::Latency) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.received.load(Ordering::Relaxed) < produced && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = self.started.elapsed();
        for task in &self.tasks {
            task.abort();
        }
        let latency = stats::latency(&mut self.latencies.lock().unwrap());
        (self.received.load(Ordering::Relaxed), took, latency)
    }
}

/// The broker under test.
enum Broker {
    Nats {
        js: jetstream::Context,
        stream: Box<stream::Stream>,
        run: String,
    },
    Rabbit {
        channel: lapin::Channel,
        run: String,
    },
}

/// Either broker's publisher, for one relay type.
enum AnyPublisher {
    Nats(JetStream),
    Rabbit(RabbitMq),
}

impl Publisher for AnyPublisher {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        match self {
            AnyPublisher::Nats(p) => p.publish(event),
            AnyPublisher::Rabbit(p) => p.publish(event),
        }
    }
}

impl Broker {
    async fn connect(args: &Args) -> Result<Broker, Error> {
        let run = uuid::Uuid::new_v4().simple().to_string();
        match args.broker.as_str() {
            "nats" => {
                let js = jetstream::new(async_nats::connect(args.nats.as_str()).await?);
                let stream = js
                    .create_stream(stream::Config {
                        name: format!("DTX_BENCH_{run}"),
                        subjects: vec![format!("dtx.bench.{run}.>")],
                        storage: stream::StorageType::File,
                        max_age: Duration::from_secs(600),
                        ..Default::default()
                    })
                    .await?;
                Ok(Broker::Nats {
                    js,
                    stream: Box::new(stream),
                    run,
                })
            }
            "rabbitmq" => {
                let properties = lapin::ConnectionProperties::default();
                let connection = lapin::Connection::connect(&args.amqp, properties).await?;
                let channel = connection.create_channel().await?;
                Ok(Broker::Rabbit { channel, run })
            }
            other => Err(format!("--broker {other:?}: nats or rabbitmq").into()),
        }
    }

    /// A topic of this run named `name` (RabbitMQ: a durable queue of that name).
    async fn topic(&self, name: &str) -> Result<String, Error> {
        match self {
            Broker::Nats { run, .. } => Ok(format!("dtx.bench.{run}.{name}")),
            Broker::Rabbit { channel, run } => {
                let queue = format!("dtx.bench.{run}.{name}");
                let options = lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                let mut arguments = lapin::types::FieldTable::default();
                let expires = lapin::types::AMQPValue::LongUInt(600_000);
                arguments.insert("x-expires".into(), expires);
                channel.queue_declare(&queue, options, arguments).await?;
                Ok(queue)
            }
        }
    }

    async fn publisher(&self) -> Result<AnyPublisher, Error> {
        Ok(match self {
            Broker::Nats { js, .. } => AnyPublisher::Nats(JetStream::new(js.clone())),
            Broker::Rabbit { channel, .. } => {
                AnyPublisher::Rabbit(RabbitMq::new(channel.clone(), "").await?)
            }
        })
    }

    /// Receives every message of `topic`, calling `record` with its payload.
    async fn consume(
        &self,
        topic: &str,
        record: impl Fn(&[u8]) + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<()>, Error> {
        Ok(match self {
            Broker::Nats { stream, .. } => {
                let reader = stream
                    .create_consumer(consumer::pull::Config {
                        filter_subject: topic.to_string(),
                        ack_policy: consumer::AckPolicy::None,
                        ..Default::default()
                    })
                    .await?;
                tokio::spawn(async move {
                    let mut messages = reader.messages().await.expect("consume");
                    while let Some(Ok(message)) = messages.next().await {
                        record(&message.payload);
                    }
                })
            }
            Broker::Rabbit { channel, .. } => {
                let options = lapin::options::BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                };
                let table = lapin::types::FieldTable::default();
                let mut deliveries = channel
                    .basic_consume(topic, "bench", options, table)
                    .await?;
                tokio::spawn(async move {
                    while let Some(Ok(delivery)) = deliveries.next().await {
                        record(&delivery.data);
                    }
                })
            }
        })
    }

    async fn clean_up(&self) {
        if let Broker::Nats { js, run, .. } = self {
            js.delete_stream(format!("DTX_BENCH_{run}")).await.ok();
        }
    }
}
