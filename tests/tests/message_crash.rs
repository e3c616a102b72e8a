//! The order service's initiator process (`order-initiator`) SIGKILLed in the middle of a
//! two-phase message, on SQLite, PostgreSQL and MariaDB: killed before its local commit, the
//! check-back drops the message and nothing is delivered; killed after it (the message never
//! submitted), the check-back finds the commit and every branch is delivered exactly once.

use std::process::Stdio;
use std::time::Duration;

use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::create_tables;
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, World};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_order-initiator");

/// Runs the initiator of message `xid` until it reports `stop_at`, then SIGKILLs it.
async fn kill_initiator_at<DB: TestBackend>(w: &World<DB>, xid: &str, stop_at: &str) {
    let mut child = Command::new(BIN)
        .args(["--db", &w.db.url, "--coordinator", &w.coordinator.url])
        .args(["--bank", &w.bank, "--xid", xid, "--stop-at", stop_at])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the initiator");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(
        matches!(&ready, Ok(Ok(Some(line))) if line == "ready"),
        "the initiator did not get to {stop_at}: {ready:?}"
    );
    // SIGKILL: no destructor, no rollback request, no submit.
    child.kill().await.expect("SIGKILL the initiator");
}

async fn killed_before_its_local_commit<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    kill_initiator_at(&w, "crash-before", "before-commit").await;
    w.assert_order_dropped("crash-before").await;
    let history = w.history("crash-before").await;
    assert!(history.contains("did not commit"), "{history}");
}

async fn killed_after_its_local_commit<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    kill_initiator_at(&w, "crash-after", "after-commit").await;
    w.assert_order_delivered("crash-after").await;
    let history = w.history("crash-after").await;
    assert!(
        history.contains("the local transaction committed"),
        "{history}"
    );
}

test_on_all_databases!(killed_before_its_local_commit, SCHEMAS);
test_on_all_databases!(killed_after_its_local_commit, SCHEMAS);
