//! A consumer process for the outbox fault run (`tests/outbox_faults.rs`): applies each event
//! once, writing one `credits` row per event through `dtx_outbox::consume` - from the durable
//! JetStream consumer `--durable` on stream `--stream` at `--nats`, or from queue `--queue` at
//! the RabbitMQ `--amqp`. With `--crash-rate p`, a first delivery is, with probability p,
//! committed and then the process exits without acknowledging it - a consumer dying between its
//! commit and its ack (exit code 3). It also exits when the broker connection fails; the test
//! starts it again either way.

use std::time::Duration;

use clap::Parser;
use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
use dtx_sdk::idempotency::{Idempotency, RequestHash};
use dtx_sql::Backend;
use futures::StreamExt;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    db: String,
    #[arg(long, requires_all = ["stream", "durable"], required_unless_present = "amqp")]
    nats: Option<String>,
    #[arg(long)]
    stream: Option<String>,
    #[arg(long)]
    durable: Option<String>,
    #[arg(long, requires = "queue")]
    amqp: Option<String>,
    #[arg(long)]
    queue: Option<String>,
    #[arg(long, default_value_t = 0.0)]
    crash_rate: f64,
}

/// With probability `rate`: applies the event and exits without acknowledging it.
async fn maybe_crash<DB: Backend>(
    helper: &Consumer<DB>,
    rate: f64,
    event_id: &str,
    payload: &[u8],
) {
    if rand::random_bool(rate) {
        let content = RequestHash::of_bytes(payload);
        let credit = dtx_tests::outbox::credit::<DB::Conn>(event_id);
        let handled = helper.handle(event_id, &content, credit).await;
        if matches!(handled, Ok(Delivery::Processed)) {
            std::process::exit(3); // committed, never acknowledged
        }
    }
}

/// Runs one settle-after-commit helper call, exiting if it hangs (a broker gone mid-ack).
async fn settle<T>(applied: impl Future<Output = T>) {
    if tokio::time::timeout(Duration::from_secs(10), applied)
        .await
        .is_err()
    {
        std::process::exit(4);
    }
}

async fn run<DB: Backend>(args: Args) {
    let pool = DB::connect(&args.db, 2).await.expect("database");
    let helper = Consumer::new(Idempotency::new(pool), "outbox-faults", 1).unwrap();
    if let (Some(url), Some(queue)) = (&args.amqp, &args.queue) {
        let properties = lapin::ConnectionProperties::default();
        let connection = lapin::Connection::connect(url, properties)
            .await
            .expect("rabbitmq");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .basic_qos(16, Default::default())
            .await
            .expect("prefetch");
        let mut deliveries = channel
            .basic_consume(
                queue,
                "outbox-faults",
                Default::default(),
                Default::default(),
            )
            .await
            .expect("consume");
        while let Some(delivery) = deliveries.next().await {
            let Ok(delivery) = delivery else {
                std::process::exit(2); // the broker went away: started again by the test
            };
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string());
            let event_id = id.unwrap_or_default();
            maybe_crash(&helper, args.crash_rate, &event_id, &delivery.data).await;
            let credit = dtx_tests::outbox::credit::<DB::Conn>(&event_id);
            settle(dtx_outbox::consume::amqp(
                &helper,
                &delivery,
                move |conn, _| credit(conn),
            ))
            .await;
        }
        std::process::exit(2);
    }
    let url = args.nats.expect("--nats or --amqp");
    let client = async_nats::connect(url.as_str()).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream(args.stream.unwrap())
        .await
        .expect("the stream");
    let pull = stream
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&args.durable.unwrap())
        .await
        .expect("the durable consumer");
    let mut messages = pull.messages().await.expect("messages");
    while let Some(message) = messages.next().await {
        let Ok(message) = message else {
            std::process::exit(2);
        };
        let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
        let event_id = id.map(|id| id.to_string()).unwrap_or_default();
        maybe_crash(&helper, args.crash_rate, &event_id, &message.payload).await;
        let credit = dtx_tests::outbox::credit::<DB::Conn>(&event_id);
        settle(dtx_outbox::consume::jetstream(
            &helper,
            &message,
            move |conn, _| credit(conn),
        ))
        .await;
    }
    std::process::exit(2);
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    dtx_tests::run_on_backend_of!(args.db, run(args));
}
