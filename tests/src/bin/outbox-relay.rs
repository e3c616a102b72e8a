//! An outbox relay as a process of its own, for the test that SIGKILLs one mid-batch
//! (`tests/outbox_nats.rs`): relays the outbox of `--db` to the JetStream at `--nats` with the
//! lease `--lease-ms`, printing `published <event_id>` once the stream acknowledged an event -
//! and then holding that row's round for `--hold-ms` before marking it sent, so the test can
//! kill it between the broker's ack and the row's update.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use dtx_outbox::{Event, JetStream, Publisher, Relay, RelayConfig};
use dtx_sql::Backend;
use futures::future::BoxFuture;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    db: String,
    #[arg(long)]
    nats: String,
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
}

/// JetStream, announcing each acknowledged event and then holding its round.
struct Announcing {
    inner: JetStream,
    hold: Duration,
}

impl Publisher for Announcing {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.inner.publish(event).await?;
            println!("published {}", event.event_id);
            std::io::stdout().flush().ok();
            tokio::time::sleep(self.hold).await;
            Ok(())
        })
    }
}

async fn run<DB: Backend>(args: Args) {
    let pool = DB::connect(&args.db, 4).await.expect("database");
    let client = async_nats::connect(args.nats.as_str()).await.expect("nats");
    let publisher = Announcing {
        inner: JetStream::new(async_nats::jetstream::new(client)),
        hold: Duration::from_millis(args.hold_ms),
    };
    let config = RelayConfig {
        owner: format!("relay-process-{}", std::process::id()),
        lease: Duration::from_millis(args.lease_ms),
        publish_timeout: Duration::from_millis(args.hold_ms + 5_000),
        poll: Duration::from_millis(10),
        ..RelayConfig::default()
    };
    Relay::new(pool, publisher)
        .with_config(config)
        .run(std::future::pending())
        .await;
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    dtx_tests::run_on_backend_of!(args.db, run(args));
}
