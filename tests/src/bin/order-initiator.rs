//! An order service's initiator as a process of its own, for tests that SIGKILL it at a
//! chosen point of a two-phase message (`tests/message_crash.rs`): it prepares the bank's order
//! message ([`dtx_tests::world::order_message`]), opens the local transaction with the order
//! and the message's barrier row, and at `--stop-at` prints `ready` and waits to be killed:
//! * `before-commit`: the local transaction is still open (its writes die with the process);
//! * `after-commit`: the local transaction committed, the message was never submitted.

use std::io::Write;

use clap::Parser;
use dtx_sdk::barrier;
use dtx_sdk::client::Coordinator;
use dtx_sql::Backend;
use dtx_tests::idempotency::insert_order;
use dtx_tests::world::order_message;

#[derive(Parser)]
struct Args {
    /// The order service's database (holding its orders and barrier tables).
    #[arg(long)]
    db: String,
    #[arg(long)]
    coordinator: String,
    /// The bank: the deliveries' target and the check-back's.
    #[arg(long)]
    bank: String,
    #[arg(long)]
    xid: String,
    /// `before-commit` or `after-commit`.
    #[arg(long)]
    stop_at: String,
}

async fn run<DB: Backend>(args: Args) {
    let pool = DB::connect(&args.db, 2).await.expect("database");
    let coordinator = Coordinator::connect(&args.coordinator)
        .await
        .expect("coordinator");
    let message = order_message(&coordinator, &args.bank, &args.xid)
        .prepare()
        .await
        .expect("prepare");
    let mut tx = DB::begin(&pool).await.expect("begin");
    barrier::prepare_message(DB::conn(&mut tx), message.branch_xid())
        .await
        .expect("the message's barrier row");
    insert_order(DB::conn(&mut tx), &args.xid, 10)
        .await
        .expect("the order");
    match args.stop_at.as_str() {
        "before-commit" => {}
        "after-commit" => tx.commit().await.expect("commit"),
        other => panic!("--stop-at {other:?}: before-commit or after-commit"),
    }
    println!("ready");
    std::io::stdout().flush().ok();
    std::future::pending::<()>().await;
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    dtx_tests::run_on_backend_of!(args.db, run(args));
}
