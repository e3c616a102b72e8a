//! Only an explicit FAILURE proves "no effect" (README "What an answer proves"). A participant
//! behind a misrouted proxy (plain HTTP 404, no `grpc-status`) or in a rolling deploy (gRPC
//! `UNIMPLEMENTED`) - before or after the effect committed - must be retried, and a saga step
//! given up in doubt must be compensated.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use dtx_proto::v1::{BranchStatus, TxStatus};
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{RetryPolicy, SagaStep, TccBranch, TccOptions};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::ledger;
use dtx_tests::net::{RunningServer, serve};
use dtx_tests::participant::{Bank, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START};
use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::transport::Server;

/// What the proxy answers instead of the participant's response.
#[derive(Debug, Clone, Copy)]
enum Bad {
    /// Plain HTTP 404 without `grpc-status`, the call never reaching the participant.
    Http404Before,
    /// The call reaches the participant (its effect commits), the answer is replaced by a
    /// plain HTTP 404.
    Http404After,
    /// gRPC `UNIMPLEMENTED` after the effect committed.
    UnimplementedAfter,
}

/// A proxy in front of the participant: the next `bad` calls get `how` instead of the answer.
#[derive(Clone)]
struct Proxy<S> {
    inner: S,
    bad: Arc<AtomicUsize>,
    how: Bad,
}

impl<S: NamedService> NamedService for Proxy<S> {
    const NAME: &'static str = S::NAME;
}

fn bad_answer(how: Bad) -> http::Response<Body> {
    match how {
        Bad::Http404Before | Bad::Http404After => http::Response::builder()
            .status(404)
            .body(Body::empty())
            .unwrap(),
        Bad::UnimplementedAfter => {
            tonic::Status::unimplemented("dtx.v1.Participant is not served here").into_http()
        }
    }
}

impl<S> Service<http::Request<Body>> for Proxy<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let misroute = self
            .bad
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let how = self.how;
        let answer = self.inner.call(request);
        Box::pin(async move {
            if !misroute {
                return answer.await;
            }
            if !matches!(how, Bad::Http404Before) {
                // The participant runs the call (its effect commits); its answer is lost.
                let _ = answer.await;
            }
            Ok(bad_answer(how))
        })
    }
}

struct Setup<DB: TestBackend> {
    db: &'static TestDb<DB>,
    faults: Faults,
    bad: Arc<AtomicUsize>,
    bank: RunningServer,
    coordinator: InProcess,
}

async fn setup<DB: TestBackend>(db: &'static TestDb<DB>, how: Bad) -> Setup<DB>
where
    DB::Conn: 'static,
{
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "alice", START).await;
    let faults = Faults::default();
    let bad = Arc::new(AtomicUsize::new(0));
    let proxy = Proxy {
        inner: Bank::new(db.pool.clone(), faults.clone()).into_service(),
        bad: bad.clone(),
        how,
    };
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

fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        call_timeout: Duration::from_secs(2),
    }
}

/// A saga step whose first two answers are lost behind a status: retried, then done once.
async fn saga_step<DB: TestBackend>(db: &'static TestDb<DB>, how: Bad, xid: &str)
where
    DB::Conn: 'static,
{
    let s = setup(db, how).await;
    s.bad.store(2, Ordering::SeqCst);
    let done = s
        .coordinator
        .client()
        .await
        .saga()
        .xid(xid)
        .retry(quick_retries(5))
        .step(SagaStep::new("s1", s.bank.url(), "debit").payload(payload("alice", 7)))
        .submit()
        .await
        .unwrap()
        .await_outcome(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.status(), TxStatus::Succeeded, "{:?}", done.0);
    assert_eq!(ledger::effects(&s.db.pool, xid, "s1", "action").await, 1);
    assert_eq!(ledger::account(&s.db.pool, "alice").await, (START - 7, 0));
    assert!(s.faults.calls("s1", Action::Action) >= 2 || matches!(how, Bad::Http404Before));
    s.coordinator.stop().await;
}

async fn a_saga_step_behind_a_404_after_its_effect_is_retried<DB: TestBackend>(
    db: &'static TestDb<DB>,
) where
    DB::Conn: 'static,
{
    saga_step(db, Bad::Http404After, "status-404-after").await;
}
test_on_all_databases!(
    a_saga_step_behind_a_404_after_its_effect_is_retried,
    SCHEMAS
);

async fn a_saga_step_behind_a_404_before_the_participant_is_retried<DB: TestBackend>(
    db: &'static TestDb<DB>,
) where
    DB::Conn: 'static,
{
    saga_step(db, Bad::Http404Before, "status-404-before").await;
}
test_on_all_databases!(
    a_saga_step_behind_a_404_before_the_participant_is_retried,
    SCHEMAS
);

/// Every attempt of the action runs and is answered UNIMPLEMENTED: the saga gives up on the
/// step in doubt and compensates it, so nothing stands.
async fn a_saga_step_given_up_in_doubt_is_compensated<DB: TestBackend>(db: &'static TestDb<DB>)
where
    DB::Conn: 'static,
{
    let xid = "status-unimplemented";
    let s = setup(db, Bad::UnimplementedAfter).await;
    s.bad.store(3, Ordering::SeqCst);
    let done = s
        .coordinator
        .client()
        .await
        .saga()
        .xid(xid)
        .retry(quick_retries(3))
        .step(SagaStep::new("s1", s.bank.url(), "debit").payload(payload("alice", 7)))
        .submit()
        .await
        .unwrap()
        .await_outcome(Duration::from_secs(20))
        .await
        .unwrap();
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
async fn a_confirm_behind_a_404_is_retried_not_parked<DB: TestBackend>(db: &'static TestDb<DB>)
where
    DB::Conn: 'static,
{
    let xid = "status-confirm";
    let s = setup(db, Bad::Http404Before).await;
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
