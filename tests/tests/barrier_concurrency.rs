//! Races the barrier must win through the unique key alone, on SQLite, PostgreSQL and MariaDB:
//! 50 concurrent identical Confirms, 50 concurrent identical Trys, and Try racing Cancel.
//! Calls go through the participant server helper (`ParticipantServer::handle`), which is what a
//! service runs, including its retry of transactions that lose a lock conflict.

use std::sync::Arc;

use dtx_proto::v1::{BranchAction, BranchRequest, BranchResponse, Outcome, OutcomeDetail};
use dtx_sdk::server::ParticipantServer;
use dtx_sql::{Backend, Schema};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Bank, Faults, payload};
use dtx_tests::{ledger, test_on_all_databases};
use futures::future::join_all;

const SCHEMAS: &[Schema] = &[Schema::Barrier];

fn request(xid: &str, branch: &str, action: BranchAction, handler: &str) -> BranchRequest {
    BranchRequest {
        xid: xid.into(),
        branch_id: branch.into(),
        action: action as i32,
        handler: handler.into(),
        payload: payload("acct", 10),
        headers: Default::default(),
    }
}

async fn setup<DB: TestBackend>(db: &TestDb<DB>) -> Arc<Bank<DB>> {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "acct", 1_000_000).await;
    Arc::new(Bank::new(db.pool.clone(), Faults::default()))
}

async fn send<DB: Backend>(bank: &Bank<DB>, req: BranchRequest) -> BranchResponse {
    use dtx_proto::v1::participant_server::Participant;
    bank.branch(tonic::Request::new(req))
        .await
        .expect("grpc ok")
        .into_inner()
}

async fn concurrently<DB: Backend>(
    bank: &Arc<Bank<DB>>,
    n: usize,
    req: BranchRequest,
) -> Vec<BranchResponse> {
    let calls = (0..n).map(|_| {
        let bank = bank.clone();
        let req = req.clone();
        tokio::spawn(async move { send(&bank, req).await })
    });
    join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect()
}

async fn fifty_concurrent_confirms_apply_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    let bank = setup(db).await;
    let tried = send(&bank, request("x1", "b1", BranchAction::Try, "transfer")).await;
    assert_eq!(tried.outcome(), Outcome::Success);
    let answers = concurrently(
        &bank,
        50,
        request("x1", "b1", BranchAction::Confirm, "transfer"),
    )
    .await;
    assert!(
        answers.iter().all(|a| a.outcome() == Outcome::Success),
        "{answers:?}"
    );
    let executed = answers
        .iter()
        .filter(|a| a.detail() == OutcomeDetail::Executed)
        .count();
    assert_eq!(executed, 1, "exactly one caller ran the confirm");
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "confirm").await, 1);
    assert_eq!(ledger::account(&db.pool, "acct").await, (999_990, 0));
}
test_on_all_databases!(fifty_concurrent_confirms_apply_once, SCHEMAS);

async fn fifty_concurrent_trys_apply_once_and_share_the_first_result<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let bank = setup(db).await;
    let answers = concurrently(
        &bank,
        50,
        request("x1", "b1", BranchAction::Try, "transfer"),
    )
    .await;
    assert!(
        answers.iter().all(|a| a.outcome() == Outcome::Success),
        "{answers:?}"
    );
    // The result carries a UUID made by the one execution: every caller must get those bytes.
    let first = &answers[0].result;
    assert!(!first.is_empty());
    assert!(
        answers.iter().all(|a| &a.result == first),
        "all callers see the first result"
    );
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "try").await, 1);
    assert_eq!(ledger::account(&db.pool, "acct").await, (999_990, 10));

    let actions = concurrently(
        &bank,
        50,
        request("x2", "s1", BranchAction::Action, "debit"),
    )
    .await;
    let first = &actions[0].result;
    assert!(
        actions
            .iter()
            .all(|a| a.outcome() == Outcome::Success && &a.result == first)
    );
    assert_eq!(ledger::effects(&db.pool, "x2", "s1", "action").await, 1);
}
test_on_all_databases!(
    fifty_concurrent_trys_apply_once_and_share_the_first_result,
    SCHEMAS
);

/// 200 rounds of a Try and its Cancel sent at the same moment. Either the Try ran and the
/// Cancel undid it, or the Cancel was an empty rollback and the Try was rejected: never a Try
/// effect standing after its Cancel succeeded.
async fn try_racing_cancel_never_leaves_a_try_standing<DB: TestBackend>(db: &'static TestDb<DB>) {
    let bank = setup(db).await;
    let (mut tried_then_cancelled, mut empty_rollbacks) = (0, 0);
    for round in 0..200 {
        let xid = format!("race-{round}");
        let (try_answer, cancel_answer) = tokio::join!(
            {
                let bank = bank.clone();
                let req = request(&xid, "b1", BranchAction::Try, "transfer");
                tokio::spawn(async move { send(&bank, req).await })
            },
            {
                let bank = bank.clone();
                let req = request(&xid, "b1", BranchAction::Cancel, "transfer");
                tokio::spawn(async move { send(&bank, req).await })
            }
        );
        let (try_answer, cancel_answer) = (try_answer.unwrap(), cancel_answer.unwrap());
        assert_eq!(
            cancel_answer.outcome(),
            Outcome::Success,
            "round {round}: {cancel_answer:?}"
        );
        let tries = ledger::effects(&db.pool, &xid, "b1", "try").await;
        let cancels = ledger::effects(&db.pool, &xid, "b1", "cancel").await;
        match cancel_answer.detail() {
            OutcomeDetail::EmptyRollback => {
                assert_eq!(try_answer.outcome(), Outcome::Failure, "round {round}");
                assert_eq!(
                    try_answer.detail(),
                    OutcomeDetail::Suspended,
                    "round {round}"
                );
                assert_eq!((tries, cancels), (0, 0), "round {round}");
                empty_rollbacks += 1;
            }
            OutcomeDetail::Executed => {
                assert_eq!(try_answer.outcome(), Outcome::Success, "round {round}");
                assert_eq!((tries, cancels), (1, 1), "round {round}");
                tried_then_cancelled += 1;
            }
            other => panic!("round {round}: unexpected cancel detail {other:?}"),
        }
    }
    assert_eq!(
        ledger::account(&db.pool, "acct").await,
        (1_000_000, 0),
        "every round nets to zero"
    );
    eprintln!(
        "{}: {tried_then_cancelled} tried-then-cancelled, {empty_rollbacks} empty rollbacks",
        DB::NAME
    );
}
test_on_all_databases!(try_racing_cancel_never_leaves_a_try_standing, SCHEMAS);

/// The helper's own server type is usable directly too (no fault wrapper).
async fn plain_server_handles_calls<DB: TestBackend>(db: &'static TestDb<DB>) {
    ledger::create_tables(&db.pool).await;
    let server = ParticipantServer::new(db.pool.clone()).saga(
        "noop",
        |_conn, _call| Box::pin(async { Ok(dtx_sdk::barrier::Reply::Success(b"done".to_vec())) }),
        |_conn, _call| Box::pin(async { Ok(dtx_sdk::barrier::Reply::ok()) }),
    );
    let answer = server
        .handle(request("x1", "s1", BranchAction::Action, "noop"))
        .await
        .unwrap();
    assert_eq!(
        (answer.outcome(), answer.result.as_slice()),
        (Outcome::Success, &b"done"[..])
    );
}
test_on_all_databases!(plain_server_handles_calls, SCHEMAS);

/// 50 Confirms and Cancels of one branch at once, in rounds: the phase-two slot lets exactly one
/// closure run; every call of the winning op succeeds, every call of the other one is refused.
async fn fifty_concurrent_mixed_confirms_and_cancels_decide_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let bank = setup(db).await;
    for round in 0..4 {
        let xid = format!("mixed-{round}");
        let tried = send(&bank, request(&xid, "b1", BranchAction::Try, "transfer")).await;
        assert_eq!(tried.outcome(), Outcome::Success);
        let calls = (0..50).map(|i| {
            let action = if i % 2 == 0 {
                BranchAction::Confirm
            } else {
                BranchAction::Cancel
            };
            let bank = bank.clone();
            let req = request(&xid, "b1", action, "transfer");
            tokio::spawn(async move { (action, send(&bank, req).await) })
        });
        let answers: Vec<_> = join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let executed: Vec<_> = answers
            .iter()
            .filter(|(_, a)| a.detail() == OutcomeDetail::Executed)
            .collect();
        assert_eq!(executed.len(), 1, "round {round}: {answers:?}");
        let winner = executed[0].0;
        for (action, answer) in &answers {
            if *action == winner {
                assert_eq!(
                    answer.outcome(),
                    Outcome::Success,
                    "round {round}: {answer:?}"
                );
            } else {
                assert_eq!(
                    (answer.outcome(), answer.detail()),
                    (Outcome::Failure, OutcomeDetail::Conflict),
                    "round {round}: {answer:?}"
                );
                assert!(answer.message.contains("refused"), "{}", answer.message);
            }
        }
        let confirms = ledger::effects(&db.pool, &xid, "b1", "confirm").await;
        let cancels = ledger::effects(&db.pool, &xid, "b1", "cancel").await;
        let expected = if winner == BranchAction::Confirm {
            (1, 0)
        } else {
            (0, 1)
        };
        assert_eq!((confirms, cancels), expected, "round {round}");
    }
    let (_, held) = ledger::account(&db.pool, "acct").await;
    assert_eq!(held, 0, "every hold released once, by one op");
}
test_on_all_databases!(
    fifty_concurrent_mixed_confirms_and_cancels_decide_once,
    SCHEMAS
);
