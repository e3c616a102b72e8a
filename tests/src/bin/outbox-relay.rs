//! An outbox relay as a process of its own, for the tests that SIGKILL one
//! (`tests/outbox_nats.rs`, `tests/outbox_faults.rs`): relays the outbox of `--db` to the
//! JetStream at `--nats` or the RabbitMQ at `--amqp` (default exchange: a topic names a queue)
//! with the lease `--lease`, printing `published <event_id>` once the broker confirmed an
//! event - and then holding that row's round for `--hold` before marking it sent, so a test
//! can kill it between the broker's ack and the row's update. It exits when its RabbitMQ
//! connection is lost (lapin does not reconnect); the tests start it again.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use dtx_outbox::{Event, JetStream, Publisher, RabbitMq, Relay, RelayConfig};
use dtx_proto::duration::Human;
use dtx_sql::Backend;
use futures::future::BoxFuture;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    db: String,
    #[arg(long, required_unless_present = "amqp")]
    nats: Option<String>,
    #[arg(long)]
    amqp: Option<String>,
    #[arg(long, default_value = "500ms")]
    lease: Human,
    #[arg(long, default_value = "0s")]
    hold: Human,
}

/// The broker's publisher, announcing each confirmed event and then holding its round.
struct Announcing {
    inner: Box<dyn Publisher>,
    /// The RabbitMQ connection, to exit once it is lost.
    amqp: Option<lapin::Connection>,
    hold: Duration,
}

impl Publisher for Announcing {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let published = self.inner.publish(event).await;
            if published.is_err() && self.amqp.as_ref().is_some_and(|c| !c.status().connected()) {
                std::process::exit(5);
            }
            published?;
            println!("published {}", event.event_id);
            std::io::stdout().flush().ok();
            tokio::time::sleep(self.hold).await;
            Ok(())
        })
    }
}

async fn run<DB: Backend>(args: Args) {
    let pool = DB::connect(&args.db, 4).await.expect("database");
    let (inner, amqp): (Box<dyn Publisher>, _) = match (&args.nats, &args.amqp) {
        (_, Some(url)) => {
            let properties = lapin::ConnectionProperties::default();
            let connection = lapin::Connection::connect(url, properties)
                .await
                .expect("rabbitmq");
            let channel = connection.create_channel().await.expect("a channel");
            let publisher = RabbitMq::new(channel, "").await.expect("confirm mode");
            (Box::new(publisher), Some(connection))
        }
        (Some(url), None) => {
            let client = async_nats::connect(url.as_str()).await.expect("nats");
            (
                Box::new(JetStream::new(async_nats::jetstream::new(client))),
                None,
            )
        }
        (None, None) => unreachable!("clap requires one"),
    };
    let publisher = Announcing {
        inner,
        amqp,
        hold: args.hold.0,
    };
    let config = RelayConfig {
        owner: format!("relay-process-{}", std::process::id()),
        lease: args.lease.0,
        publish_timeout: args.hold.0 + Duration::from_secs(5),
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
