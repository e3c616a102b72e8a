//! A coordinator process SIGKILLed mid-saga (after some actions, with one in flight) and a new
//! process on the same database: the saga completes or compensates, every effect once.

use std::time::Duration;

use dtx_proto::v1::{Transaction, TxStatus};
use dtx_sdk::barrier::Action;
use dtx_tests::coordinator::Process;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::ledger;
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, alice_with_a_slow_step, debit_alice};

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// A fresh coordinator process (with `flags`) on the same database, and the saga `xid` as it
/// ends there.
async fn finish_in_a_new_process<DB: TestBackend>(
    db: &'static TestDb<DB>,
    flags: &[&str],
    xid: &str,
) -> (Process, Transaction) {
    let second = Process::start(BIN, &db.url, flags).await;
    let done = second
        .client()
        .await
        .wait(xid, Duration::from_secs(20))
        .await
        .unwrap();
    (second, done)
}

/// Runs a 4-step saga whose step s3 hangs in the network, kills the coordinator while it does,
/// and lets a fresh process finish. `refuse_last` makes s4 refuse, so the saga compensates.
async fn killed_mid_saga<DB: TestBackend>(db: &'static TestDb<DB>, xid: &str, refuse_last: bool) {
    let (faults, bank) = alice_with_a_slow_step(db, "s3", Duration::from_millis(1500)).await;

    let first = Process::start(BIN, &db.url, &[]).await;
    let last_amount = if refuse_last { START * 10 } else { 4 };
    let saga = first
        .client()
        .await
        .saga()
        .xid(xid)
        .step(debit_alice("s1", bank.url(), 1))
        .step(debit_alice("s2", bank.url(), 2))
        .step(debit_alice("s3", bank.url(), 3))
        .step(debit_alice("s4", bank.url(), last_amount));
    saga.submit().await.unwrap();
    while faults.calls("s3", Action::Action) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await;
    assert_eq!(ledger::effects(&db.pool, xid, "s1", "action").await, 1);
    assert_eq!(ledger::effects(&db.pool, xid, "s4", "action").await, 0);

    let (second, done) = finish_in_a_new_process(db, &[], xid).await;
    // The late s3 delivery lands too; give it time, then check nothing happened twice.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let expected = if refuse_last {
        TxStatus::Compensated
    } else {
        TxStatus::Succeeded
    };
    assert_eq!(done.status(), expected, "{done:?}");
    for s in ["s1", "s2", "s3"] {
        assert_eq!(
            ledger::effects(&db.pool, xid, s, "action").await,
            1,
            "{s} action once"
        );
        let compensations = ledger::effects(&db.pool, xid, s, "compensate").await;
        assert_eq!(compensations, i64::from(refuse_last), "{s} compensation");
    }
    assert_eq!(
        ledger::effects(&db.pool, xid, "s4", "action").await,
        i64::from(!refuse_last)
    );
    let spent = if refuse_last { 0 } else { 1 + 2 + 3 + 4 };
    assert_eq!(ledger::account(&db.pool, "alice").await, (START - spent, 0));
    assert!(
        faults.calls("s1", Action::Action) >= 2,
        "the new process repeated s1 (answered by the barrier)"
    );
    second.kill().await;
}

async fn killed_mid_saga_completes<DB: TestBackend>(db: &'static TestDb<DB>) {
    killed_mid_saga(db, "crash-saga-ok", false).await;
}
test_on_all_databases!(killed_mid_saga_completes, SCHEMAS);

async fn killed_mid_saga_compensates<DB: TestBackend>(db: &'static TestDb<DB>) {
    killed_mid_saga(db, "crash-saga-comp", true).await;
}
test_on_all_databases!(killed_mid_saga_compensates, SCHEMAS);

/// The coordinator is killed while a step's action is in flight (the participant still
/// completes it: a lost response), and the saga's deadline passes before the lease lets a new
/// process take over. The step was sent, so the new process must compensate it, not skip it.
async fn killed_with_an_action_in_flight_past_the_deadline<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let xid = "crash-saga-in-flight";
    let (faults, bank) = alice_with_a_slow_step(db, "s1", Duration::from_millis(1000)).await;
    // Lease (5 s) longer than the saga's deadline (3 s): recovery finds it past the deadline.
    let lease = ["--lease", "5s"];
    let first = Process::start(BIN, &db.url, &lease).await;
    first
        .client()
        .await
        .saga()
        .xid(xid)
        .timeout(Duration::from_secs(3))
        .step(debit_alice("s1", bank.url(), 7))
        .submit()
        .await
        .unwrap();
    while faults.calls("s1", Action::Action) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.kill().await;
    let (second, done) = finish_in_a_new_process(db, &lease, xid).await;
    assert_eq!(done.status(), TxStatus::Compensated, "{done:?}");
    assert_eq!(ledger::effects(&db.pool, xid, "s1", "action").await, 1);
    assert_eq!(
        ledger::effects(&db.pool, xid, "s1", "compensate").await,
        1,
        "the action ran, so it is compensated: {done:?}"
    );
    assert_eq!(ledger::account(&db.pool, "alice").await, (START, 0));
    second.kill().await;
}
test_on_all_databases!(killed_with_an_action_in_flight_past_the_deadline, SCHEMAS);
