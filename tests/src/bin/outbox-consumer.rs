//! A consumer process for the outbox fault run (`tests/outbox_faults.rs`): applies the events
//! of the durable JetStream consumer `--durable` on stream `--stream` once each, writing one
//! `credits` row per event through `dtx_outbox::consume::jetstream`. With `--crash-rate p`, a
//! first delivery is, with probability p, committed and then the process exits without
//! acknowledging it - a consumer dying between its commit and its ack. It also exits when the
//! broker connection fails; the test starts it again either way.

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
    #[arg(long)]
    nats: String,
    #[arg(long)]
    stream: String,
    #[arg(long)]
    durable: String,
    #[arg(long, default_value_t = 0.0)]
    crash_rate: f64,
}

async fn run<DB: Backend>(args: Args) {
    let pool = DB::connect(&args.db, 2).await.expect("database");
    let client = async_nats::connect(args.nats.as_str()).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(&args.stream).await.expect("the stream");
    let pull = stream
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&args.durable)
        .await
        .expect("the durable consumer");
    let helper = Consumer::new(Idempotency::new(pool), "outbox-faults", 1).unwrap();
    let mut messages = pull.messages().await.expect("messages");
    while let Some(message) = messages.next().await {
        let Ok(message) = message else {
            std::process::exit(2); // the broker went away: started again by the test
        };
        let event_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|id| id.to_string())
            .unwrap_or_default();
        if rand::random_bool(args.crash_rate) {
            let content = RequestHash::of_bytes(&message.payload);
            let credit = dtx_tests::outbox::credit::<DB::Conn>(&event_id);
            let handled = helper.handle(&event_id, &content, credit).await;
            if matches!(handled, Ok(Delivery::Processed)) {
                std::process::exit(3); // committed, never acknowledged
            }
        }
        let credit = dtx_tests::outbox::credit::<DB::Conn>(&event_id);
        let applied =
            dtx_outbox::consume::jetstream(&helper, &message, move |conn, _| credit(conn));
        if tokio::time::timeout(Duration::from_secs(10), applied)
            .await
            .is_err()
        {
            std::process::exit(4);
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    dtx_tests::run_on_backend_of!(args.db, run(args));
}
