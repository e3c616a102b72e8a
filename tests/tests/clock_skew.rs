//! One clock: two coordinators on one database, one of them under libfaketime at +30 s or
//! -30 s. Leases, due times and deadlines are compared on the database's time, so the skewed
//! instance takes over no live lease, decides no transaction before its deadline, skips no
//! step, and when it is SIGKILLed its work is taken over within lease + poll, not lease + skew.
//!
//! Needs `faketime` (Debian package; `.ci/run` installs it). Multi-instance, so PostgreSQL
//! and MariaDB only (a SQLite file has one coordinator).

use std::time::{Duration, Instant};

use dtx_proto::v1::{BranchStatus, TxStatus};
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{Coordinator, SagaStep, TccBranch, TccOptions};
use dtx_sql::sqlx;
use dtx_tests::coordinator::{Process, faketime_or_skip};
use dtx_tests::db::{TestBackend, TestDb, with_db};
use dtx_tests::ledger;
use dtx_tests::net::serve;
use dtx_tests::participant::{Bank, Fault, Faults, payload};
use dtx_tests::world::{SCHEMAS, START};
use tonic::transport::Server;

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// Lease 3 s (renewed every second), poll 100 ms.
const FLAGS: &[&str] = &["--lease", "3s", "--poll", "100ms"];
const LEASE_AND_POLL: Duration = Duration::from_millis(3100);

/// A two-step saga whose first action takes `slow` at the participant.
async fn submit_saga(
    client: &Coordinator,
    bank: &str,
    faults: &Faults,
    name: &str,
    slow: Duration,
) {
    faults.push(&format!("{name}-a"), Action::Action, [Fault::Delay(slow)]);
    client
        .saga()
        .xid(name)
        .timeout(Duration::from_secs(30))
        .step(SagaStep::new(format!("{name}-a"), bank, "debit").payload(payload("alice", 1)))
        .step(SagaStep::new(format!("{name}-b"), bank, "credit").payload(payload("bob", 1)))
        .submit()
        .await
        .unwrap();
}

async fn one_clock<DB: TestBackend>(db: &'static TestDb<DB>, skew: &'static str) {
    if !faketime_or_skip("clock_skew") {
        return;
    }
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "alice", START).await;
    ledger::open_account(&db.pool, "bob", START).await;
    let faults = Faults::default();
    let bank = serve(
        Server::builder().add_service(Bank::new(db.pool.clone(), faults.clone()).into_service()),
    )
    .await;
    let bank_url = bank.url();
    let honest = Process::start(BIN, &db.url, FLAGS).await;
    let skewed = Process::start_skewed(BIN, &db.url, FLAGS, skew).await;
    let (a, b) = (honest.client().await, skewed.client().await);

    // Sagas on both instances, each with an action slower than a lease renewal period: a
    // takeover of a live lease shows as a second delivery of that action.
    let sagas: Vec<String> = (0..12).map(|i| format!("skew-saga-{i}")).collect();
    for (i, name) in sagas.iter().enumerate() {
        let client = if i % 2 == 0 { &a } else { &b };
        submit_saga(
            client,
            &bank_url,
            &faults,
            name,
            Duration::from_millis(2500),
        )
        .await;
    }

    // TCC transactions begun on either instance with a 6 s timeout and committed after 1 s:
    // on the database's clock their deadline has not passed.
    let mut tccs = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let bank = bank_url.clone();
        tccs.push(tokio::spawn(async move {
            let xid = format!("skew-tcc-{i}");
            let options = TccOptions {
                xid: Some(xid.clone()),
                timeout: Duration::from_secs(6),
                ..TccOptions::default()
            };
            let result = client
                .tcc(options, |tx| async move {
                    tx.call(TccBranch::new(&bank, "transfer", payload("alice", 1)))
                        .await?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, Error>(())
                })
                .await;
            (xid, result)
        }));
    }
    for t in tccs {
        let (xid, result) = t.await.unwrap();
        result.unwrap_or_else(|e| panic!("{xid} committed 5 s before its deadline: {e}"));
        let done = a.wait(&xid, Duration::from_secs(20)).await.unwrap();
        assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
    }
    for name in &sagas {
        let done = a.wait(name, Duration::from_secs(30)).await.unwrap();
        assert_eq!(done.status(), TxStatus::Succeeded, "{done:?}");
        assert!(
            done.branches
                .iter()
                .all(|s| s.status() != BranchStatus::Skipped),
            "{done:?}"
        );
        assert_eq!(
            faults.calls(&format!("{name}-a"), Action::Action),
            1,
            "{name}: its live lease was taken over (the slow action was delivered twice)"
        );
    }

    // The skewed instance dies with sagas in flight: the honest one takes them over after
    // lease + poll on the database's clock.
    let orphans: Vec<String> = (0..4).map(|i| format!("skew-orphan-{i}")).collect();
    for name in &orphans {
        submit_saga(&b, &bank_url, &faults, name, Duration::from_millis(500)).await;
    }
    for name in &orphans {
        while faults.calls(&format!("{name}-a"), Action::Action) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let killed = Instant::now();
    skewed.kill().await;
    for name in &orphans {
        let done = a.wait(name, Duration::from_secs(60)).await.unwrap();
        assert_eq!(done.status(), TxStatus::Succeeded, "{done:?}");
    }
    let took = killed.elapsed();
    assert!(
        took < LEASE_AND_POLL + Duration::from_secs(3),
        "takeover of a killed {skew} instance took {took:?}; lease + poll is {LEASE_AND_POLL:?}"
    );
    // Money only moved as the transactions said: 12 + 4 saga debits and credits, 6 transfers.
    let (alice, held) = ledger::account(&db.pool, "alice").await;
    assert_eq!((alice, held), (START - 16 - 6, 0));
    assert_eq!(ledger::account(&db.pool, "bob").await, (START + 16, 0));
    honest.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_ahead() {
    with_db::<sqlx::Postgres, _, _>(SCHEMAS, |db| one_clock(db, "+30s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_behind() {
    with_db::<sqlx::Postgres, _, _>(SCHEMAS, |db| one_clock(db, "-30s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_ahead() {
    with_db::<sqlx::MySql, _, _>(SCHEMAS, |db| one_clock(db, "+30s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_behind() {
    with_db::<sqlx::MySql, _, _>(SCHEMAS, |db| one_clock(db, "-30s")).await;
}
