//! Coordinator processes killed with SIGKILL mid-flight: another process on the same database
//! finishes their work, every effect exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_sql::sqlx;
use dtx_tests::coordinator::Process;
use dtx_tests::db::{TestBackend, TestDb, with_db};
use dtx_tests::ledger;
use dtx_tests::net::serve;
use dtx_tests::participant::{Bank, Fault, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START};
use tonic::transport::Server;

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

async fn bank<DB: TestBackend>(
    db: &'static TestDb<DB>,
    faults: Faults,
) -> dtx_tests::net::RunningServer {
    ledger::create_tables(&db.pool).await;
    for account in ["alice", "bob"] {
        ledger::open_account(&db.pool, account, START).await;
    }
    serve(Server::builder().add_service(Bank::new(db.pool.clone(), faults).into_service())).await
}

/// SIGKILL after the Commit decision is durable and before any Confirm was delivered; a new
/// process on the same database delivers them, exactly once.
async fn killed_after_commit_a_new_process_confirms_exactly_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let faults = Faults::default();
    let bank = bank(db, faults.clone()).await;
    // The first Confirm deliveries hang, so the kill lands before any is applied.
    for b in ["b1", "b2"] {
        faults.push(b, Action::Confirm, [Fault::Delay(Duration::from_secs(30))]);
    }
    let first = Process::start(BIN, &db.url, &[]).await;
    let client = first.client().await;
    let tx = client
        .begin(TccOptions {
            xid: Some("crash-1".into()),
            wait_phase_two: None,
            ..TccOptions::default()
        })
        .await
        .unwrap();
    tx.call(TccBranch::new(bank.url(), "transfer", payload("alice", 10)))
        .await
        .unwrap();
    tx.call(TccBranch::new(bank.url(), "transfer", payload("bob", 20)))
        .await
        .unwrap();
    assert_eq!(
        tx.commit().await.unwrap(),
        TxStatus::Committing,
        "decision durable, phase two running"
    );
    // Wait until the Confirms are in flight (hanging at the bank), then kill.
    for _ in 0..100 {
        if faults.calls("b1", Action::Confirm) + faults.calls("b2", Action::Confirm) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().await;
    assert_eq!(
        ledger::effects(&db.pool, "crash-1", "b1", "confirm").await,
        0
    );

    let second = Process::start(BIN, &db.url, &[]).await;
    let done = second
        .client()
        .await
        .wait("crash-1", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
    assert_eq!(
        ledger::effects(&db.pool, "crash-1", "b1", "confirm").await,
        1
    );
    assert_eq!(
        ledger::effects(&db.pool, "crash-1", "b2", "confirm").await,
        1
    );
    assert_eq!(ledger::account(&db.pool, "alice").await, (START - 10, 0));
    assert_eq!(ledger::account(&db.pool, "bob").await, (START - 20, 0));
    second.kill().await;
}
test_on_all_databases!(
    killed_after_commit_a_new_process_confirms_exactly_once,
    SCHEMAS
);

/// Two coordinator processes on one database share 200 concurrent transactions; one is
/// SIGKILLed midway. Every transaction ends terminal, each effect once, the ledger balances.
async fn two_processes_one_killed_midway<DB: TestBackend>(db: &'static TestDb<DB>) {
    const TXS: usize = 200;
    let faults = Faults::default();
    // Confirms take a while, so the kill finds decided transactions with phase two in flight.
    faults.push(
        "*",
        Action::Confirm,
        (0..2 * TXS).map(|_| Fault::Delay(Duration::from_millis(100))),
    );
    let bank = Arc::new(bank(db, faults).await);
    let a = Process::start(BIN, &db.url, &["--instance", "a"]).await;
    let b = Process::start(BIN, &db.url, &["--instance", "b"]).await;
    let clients = [a.client().await, b.client().await];
    let done = Arc::new(AtomicUsize::new(0));
    // 32 transactions at a time, so they spread over the kill.
    let slots = Arc::new(tokio::sync::Semaphore::new(32));

    let mut tasks = Vec::new();
    for i in 0..TXS {
        let client = clients[i % 2].clone();
        let bank = bank.clone();
        let done = done.clone();
        let slots = slots.clone();
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire().await.unwrap();
            let xid = format!("pair-{i}");
            let options = TccOptions {
                xid: Some(xid.clone()),
                timeout: Duration::from_secs(5),
                call_timeout: Duration::from_secs(2),
                wait_phase_two: None,
                ..TccOptions::default()
            };
            let _ = client
                .tcc(options, |tx| async move {
                    tx.call(TccBranch::new(bank.url(), "transfer", payload("alice", 1)))
                        .await?;
                    tx.call(TccBranch::new(bank.url(), "transfer", payload("bob", 1)))
                        .await?;
                    Ok::<_, Error>(())
                })
                .await;
            done.fetch_add(1, Ordering::Relaxed);
            xid
        }));
    }
    // Kill `a` when about a third of the transactions are through.
    while done.load(Ordering::Relaxed) < TXS / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill().await;
    let mut xids = Vec::new();
    for t in tasks {
        xids.push(t.await.unwrap());
    }

    // The survivor finishes everything: decided work after the dead one's lease expires,
    // undecided work at its deadline.
    let survivor = clients[1].clone();
    let (mut committed, mut rolled_back, mut never_begun) = (0i64, 0i64, 0i64);
    for xid in &xids {
        let (try1, try2) = (
            ledger::effects(&db.pool, xid, "b1", "try").await,
            ledger::effects(&db.pool, xid, "b2", "try").await,
        );
        let tx = match survivor.wait(xid, Duration::from_secs(30)).await {
            Ok(tx) => tx,
            // Its Begin went to the killed process and never happened: nothing may exist.
            Err(Error::Rpc(s)) if s.code() == tonic::Code::NotFound => {
                assert_eq!((try1, try2), (0, 0), "{xid}");
                never_begun += 1;
                continue;
            }
            Err(e) => panic!("{xid}: {e}"),
        };
        match tx.status() {
            TxStatus::Committed => {
                committed += 1;
                assert_eq!((try1, try2), (1, 1), "{xid}");
                assert_eq!(
                    ledger::effects(&db.pool, xid, "b1", "confirm").await,
                    1,
                    "{xid}"
                );
                assert_eq!(
                    ledger::effects(&db.pool, xid, "b2", "confirm").await,
                    1,
                    "{xid}"
                );
            }
            TxStatus::RolledBack => {
                rolled_back += 1;
                assert_eq!(
                    ledger::effects(&db.pool, xid, "b1", "cancel").await,
                    try1,
                    "{xid}"
                );
                assert_eq!(
                    ledger::effects(&db.pool, xid, "b2", "cancel").await,
                    try2,
                    "{xid}"
                );
            }
            other => panic!("{xid} ended {other:?}: {tx:?}"),
        }
    }
    assert_eq!(committed + rolled_back + never_begun, TXS as i64);
    assert!(committed > 0, "some transactions commit");
    assert_eq!(
        ledger::account(&db.pool, "alice").await,
        (START - committed, 0)
    );
    assert_eq!(
        ledger::account(&db.pool, "bob").await,
        (START - committed, 0)
    );
    eprintln!(
        "{}: {committed} committed, {rolled_back} rolled back, {never_begun} never begun",
        DB::NAME
    );
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_one_killed_midway_postgres() {
    with_db::<sqlx::Postgres, _, _>(SCHEMAS, two_processes_one_killed_midway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_one_killed_midway_mariadb() {
    with_db::<sqlx::MySql, _, _>(SCHEMAS, two_processes_one_killed_midway).await;
}
