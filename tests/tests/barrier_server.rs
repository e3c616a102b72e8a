//! The participant server helper over a real tonic server on port 0, driven by a real gRPC
//! client, on SQLite, PostgreSQL and MariaDB: outcome mapping, barrier answers on the wire,
//! and the error codes for malformed calls (with nothing written).

use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest, BranchResponse, Outcome, OutcomeDetail};
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::net::serve;
use dtx_tests::participant::{Bank, Fault, Faults, payload};
use dtx_tests::{ledger, test_on_all_databases};
use tonic::Code;
use tonic::transport::{Channel, Server};

const SCHEMAS: &[Schema] = &[Schema::Barrier];

fn request(xid: &str, branch: &str, action: i32, handler: &str) -> BranchRequest {
    BranchRequest {
        xid: xid.into(),
        branch_id: branch.into(),
        action,
        handler: handler.into(),
        payload: payload("acct", 10),
        headers: Default::default(),
    }
}

/// One delivery over gRPC; the call must be answered (not a gRPC error).
async fn answer(client: &mut ParticipantClient<Channel>, req: BranchRequest) -> BranchResponse {
    client.branch(req).await.unwrap().into_inner()
}

async fn participant_over_grpc<DB: TestBackend>(db: &'static TestDb<DB>) {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "acct", 100).await;
    let faults = Faults::default();
    let bank = Bank::new(db.pool.clone(), faults.clone());
    let server = serve(Server::builder().add_service(bank.into_service())).await;
    let mut client = ParticipantClient::new(server.channel().await);
    let try_ = BranchAction::Try as i32;

    // Try, then its repeat: same bytes, one effect.
    let first = answer(&mut client, request("x1", "b1", try_, "transfer")).await;
    assert_eq!(
        (first.outcome(), first.detail()),
        (Outcome::Success, OutcomeDetail::Executed)
    );
    let again = answer(&mut client, request("x1", "b1", try_, "transfer")).await;
    assert_eq!(
        (again.outcome(), again.detail()),
        (Outcome::Success, OutcomeDetail::Duplicate)
    );
    assert_eq!(again.result, first.result);

    // Confirm twice: one effect.
    for detail in [OutcomeDetail::Executed, OutcomeDetail::Duplicate] {
        let c = answer(
            &mut client,
            request("x1", "b1", BranchAction::Confirm as i32, "transfer"),
        )
        .await;
        assert_eq!((c.outcome(), c.detail()), (Outcome::Success, detail));
    }
    assert_eq!(ledger::account(&db.pool, "acct").await, (90, 0));

    // Cancel before Try: empty rollback on the wire; the late Try is FAILURE/SUSPENDED.
    let cancel = answer(
        &mut client,
        request("x2", "b1", BranchAction::Cancel as i32, "transfer"),
    )
    .await;
    assert_eq!(
        (cancel.outcome(), cancel.detail()),
        (Outcome::Success, OutcomeDetail::EmptyRollback)
    );
    let late = answer(&mut client, request("x2", "b1", try_, "transfer")).await;
    assert_eq!(
        (late.outcome(), late.detail()),
        (Outcome::Failure, OutcomeDetail::Suspended)
    );

    // A business refusal (balance too low) is FAILURE with a message, and replayed.
    let mut big = request("x3", "b1", try_, "transfer");
    big.payload = payload("acct", 1_000);
    let refused = client.branch(big.clone()).await.unwrap().into_inner();
    assert_eq!(refused.outcome(), Outcome::Failure);
    assert!(
        refused.message.contains("balance too low"),
        "{}",
        refused.message
    );
    let replay = client.branch(big).await.unwrap().into_inner();
    assert_eq!(
        (replay.outcome(), replay.detail()),
        (Outcome::Failure, OutcomeDetail::Duplicate)
    );

    // A handler error is RETRY, rolled back; the next delivery runs.
    faults.push(
        "b1",
        dtx_sdk::barrier::Action::Action,
        [Fault::HandlerError],
    );
    let retry = answer(
        &mut client,
        request("x4", "b1", BranchAction::Action as i32, "debit"),
    )
    .await;
    assert_eq!(retry.outcome(), Outcome::Retry);
    assert!(
        retry.message.contains("injected handler error"),
        "{}",
        retry.message
    );
    assert_eq!(ledger::barrier_rows(&db.pool, "x4", "b1").await, 0);
    let ran = answer(
        &mut client,
        request("x4", "b1", BranchAction::Action as i32, "debit"),
    )
    .await;
    assert_eq!(
        (ran.outcome(), ran.detail()),
        (Outcome::Success, OutcomeDetail::Executed)
    );
    assert_eq!(ledger::account(&db.pool, "acct").await, (80, 0));

    // Malformed calls: the right code, and nothing written.
    let cases: Vec<(BranchRequest, Code, &str)> = vec![
        (
            request("x5", "b1", 0, "transfer"),
            Code::InvalidArgument,
            "action",
        ),
        (
            request("x5", "b1", 42, "transfer"),
            Code::InvalidArgument,
            "action",
        ),
        (
            request("x5", "b1", try_, "nope"),
            Code::NotFound,
            "no handler named",
        ),
        (
            request("x5", "b1", BranchAction::Action as i32, "transfer"),
            Code::FailedPrecondition,
            "has no action",
        ),
        (
            request("x5", "b1", try_, "debit"),
            Code::FailedPrecondition,
            "has no try",
        ),
        (
            request("", "b1", try_, "transfer"),
            Code::InvalidArgument,
            "xid must not be empty",
        ),
        (
            request(&"x".repeat(129), "b1", try_, "transfer"),
            Code::InvalidArgument,
            "limit of 128",
        ),
        (
            request("x5", "b 1", try_, "transfer"),
            Code::InvalidArgument,
            "charset",
        ),
        (
            BranchRequest {
                payload: vec![b'a'; 64 * 1024 + 1],
                ..request("x5", "b1", try_, "transfer")
            },
            Code::InvalidArgument,
            "limit of 65536 bytes",
        ),
    ];
    for (req, code, needle) in cases {
        let status = client.branch(req).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
    assert_eq!(ledger::barrier_rows(&db.pool, "x5", "b1").await, 0);
    assert_eq!(ledger::account(&db.pool, "acct").await, (80, 0));
    server.stop().await;
}
test_on_all_databases!(participant_over_grpc, SCHEMAS);

/// Conflicts are well-formed FAILURE answers with the reason, not gRPC errors.
async fn conflicts_are_failure_answers_with_a_reason<DB: TestBackend>(db: &'static TestDb<DB>) {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "acct", 100).await;
    let server = serve(
        Server::builder().add_service(Bank::new(db.pool.clone(), Faults::default()).into_service()),
    )
    .await;
    let mut client = ParticipantClient::new(server.channel().await);
    let mut call = async |req: BranchRequest| client.branch(req).await.unwrap().into_inner();
    call(request("x1", "b1", BranchAction::Try as i32, "transfer")).await;
    call(request(
        "x1",
        "b1",
        BranchAction::Confirm as i32,
        "transfer",
    ))
    .await;
    let cancel = call(request("x1", "b1", BranchAction::Cancel as i32, "transfer")).await;
    assert_eq!(
        (cancel.outcome(), cancel.detail()),
        (Outcome::Failure, OutcomeDetail::Conflict)
    );
    assert_eq!(
        cancel.message,
        "cancel refused: branch x1/b1 was already confirmed"
    );
    let mut other = request("x1", "b1", BranchAction::Try as i32, "transfer");
    other.payload = payload("acct", 20);
    let other = call(other).await;
    assert_eq!(
        (other.outcome(), other.detail()),
        (Outcome::Failure, OutcomeDetail::Conflict)
    );
    assert!(
        other.message.contains("was tried with a different request"),
        "{}",
        other.message
    );
    assert_eq!(ledger::account(&db.pool, "acct").await, (90, 0));
    server.stop().await;
}
test_on_all_databases!(conflicts_are_failure_answers_with_a_reason, SCHEMAS);
