//! Only an explicit FAILURE proves "no effect" (README "What an answer proves"). A participant
//! behind a misrouted proxy (plain HTTP 404, no `grpc-status`) or in a rolling deploy (gRPC
//! `UNIMPLEMENTED`) - before or after the effect committed - must be retried, and a saga step
//! given up in doubt must be compensated.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dtx_proto::v1::{BranchStatus, TxStatus};
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{RetryPolicy, SagaOutcome, SagaStep, TccBranch, TccOptions};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::ledger;
use dtx_tests::net::{Misroute, MisrouteProxy, RunningServer, serve};
use dtx_tests::participant::{Bank, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START};
use tonic::transport::Server;

/// What the proxy answers instead of the participant's response.
struct Setup<DB: TestBackend> {
    db: &'static TestDb<DB>,
    faults: Faults,
    bad: Arc<AtomicUsize>,
    bank: RunningServer,
    coordinator: InProcess,
}

async fn setup<DB: TestBackend>(db: &'static TestDb<DB>, how: Misroute) -> Setup<DB> {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "alice", START).await;
    let faults = Faults::default();
    let bad = Arc::new(AtomicUsize::new(0));
    let next_bad = bad.clone();
    let proxy = MisrouteProxy::new(
        Bank::new(db.pool.clone(), faults.clone()).into_service(),
        Arc::new(move || {
            let misroute = next_bad
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            misroute.then_some(how)
        }),
    );
    let bank = serve(Server::builder().add_service(proxy)).await;
    let coordinator = InProcess::start(&db.url, &[]).await;
    Setup {
        db,
        faults,
        bad,
        bank,
        coordinator,
    }
}

impl<DB: TestBackend> Setup<DB> {
    /// Runs the saga `xid` of one step, `s1` debiting alice 7, with `attempts` tries per call;
    /// the proxy misroutes the first `bad` answers.
    async fn debit_saga(&self, xid: &str, bad: usize, attempts: u32) -> SagaOutcome {
        self.bad.store(bad, Ordering::SeqCst);
        self.coordinator
            .client()
            .await
            .saga()
            .xid(xid)
            .retry(quick_retries(attempts))
            .step(SagaStep::new("s1", self.bank.url(), "debit").payload(payload("alice", 7)))
            .submit()
            .await
            .unwrap()
            .await_outcome(Duration::from_secs(20))
            .await
            .unwrap()
    }
}

fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        call_timeout: Duration::from_secs(2),
    }
}

/// A saga step whose first two answers are lost behind a status: retried, then done once.
async fn saga_step<DB: TestBackend>(db: &'static TestDb<DB>, how: Misroute, xid: &str) {
    let s = setup(db, how).await;
    let done = s.debit_saga(xid, 2, 5).await;
    assert_eq!(done.status(), TxStatus::Succeeded, "{:?}", done.0);
    assert_eq!(ledger::effects(&s.db.pool, xid, "s1", "action").await, 1);
    assert_eq!(ledger::account(&s.db.pool, "alice").await, (START - 7, 0));
    assert!(s.faults.calls("s1", Action::Action) >= 2 || matches!(how, Misroute::Http404Before));
    s.coordinator.stop().await;
}

async fn a_saga_step_behind_a_404_after_its_effect_is_retried<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    saga_step(db, Misroute::Http404After, "status-404-after").await;
}
test_on_all_databases!(
    a_saga_step_behind_a_404_after_its_effect_is_retried,
    SCHEMAS
);

async fn a_saga_step_behind_a_404_before_the_participant_is_retried<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    saga_step(db, Misroute::Http404Before, "status-404-before").await;
}
test_on_all_databases!(
    a_saga_step_behind_a_404_before_the_participant_is_retried,
    SCHEMAS
);

/// Every attempt of the action runs and is answered UNIMPLEMENTED: the saga gives up on the
/// step in doubt and compensates it, so nothing stands.
async fn a_saga_step_given_up_in_doubt_is_compensated<DB: TestBackend>(db: &'static TestDb<DB>) {
    let xid = "status-unimplemented";
    let s = setup(db, Misroute::UnimplementedAfter).await;
    let done = s.debit_saga(xid, 3, 3).await;
    assert_eq!(done.status(), TxStatus::Compensated, "{:?}", done.0);
    assert_eq!(done.steps()[0].status(), BranchStatus::Compensated);
    assert_eq!(s.faults.calls("s1", Action::Action), 3);
    assert_eq!(ledger::effects(&s.db.pool, xid, "s1", "action").await, 1);
    assert_eq!(
        ledger::effects(&s.db.pool, xid, "s1", "compensate").await,
        1
    );
    assert_eq!(ledger::account(&s.db.pool, "alice").await, (START, 0));
    s.coordinator.stop().await;
}
test_on_all_databases!(a_saga_step_given_up_in_doubt_is_compensated, SCHEMAS);

/// A Confirm answered by a misrouted proxy is retried until it lands; the transaction commits
/// instead of parking.
async fn a_confirm_behind_a_404_is_retried_not_parked<DB: TestBackend>(db: &'static TestDb<DB>) {
    let xid = "status-confirm";
    let s = setup(db, Misroute::Http404Before).await;
    let client = s.coordinator.client().await;
    let bank = s.bank.url();
    let bad = s.bad.clone();
    let options = TccOptions {
        xid: Some(xid.into()),
        call_timeout: Duration::from_secs(2),
        ..TccOptions::default()
    };
    client
        .tcc(options, |tx| async move {
            tx.call(TccBranch::new(&bank, "transfer", payload("alice", 5)))
                .await?;
            // The Try went through; the Confirms meet the proxy.
            bad.store(2, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    let done = client.wait(xid, Duration::from_secs(10)).await.unwrap();
    assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
    assert_eq!(s.bad.load(Ordering::SeqCst), 0, "both bad answers were met");
    assert_eq!(ledger::effects(&s.db.pool, xid, "b1", "confirm").await, 1);
    s.coordinator.stop().await;
}
test_on_all_databases!(a_confirm_behind_a_404_is_retried_not_parked, SCHEMAS);
