//! Batched branch calls end to end - a real coordinator that lets one call at a time out to
//! the bank (`--branch-batch-in-flight 1`), so calls that come due while one is out leave
//! together as one `BranchBatch`; the bank runs a batch in one local transaction - on SQLite,
//! PostgreSQL and MariaDB. Each item must get the answer it would get alone: effects are
//! asserted from the business ledger, once per step, whatever its neighbours in the batch did.

use std::time::Duration;

use dtx_proto::auth::{Call, CallSigner};
use dtx_proto::v1::{
    BranchAction, BranchBatchItem, BranchBatchRequest, BranchRequest, Outcome, OutcomeDetail,
    TxStatus,
};
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{SagaOutcome, SagaStep};
use dtx_sdk::server::ParticipantServer;
use dtx_tests::auth::AuthKeys;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::ledger::barrier_rows;
use dtx_tests::participant::{Fault, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, World};
use futures::future::join_all;
use tonic::Code;

const SAGAS: usize = 12;
/// One call or batch out to a participant at a time; the others wait for it to come back.
const ONE_AT_A_TIME: &[&str] = &["--branch-batch-in-flight", "1", "--branch-batch-wait", "2s"];
const WAIT: Duration = Duration::from_secs(30);

/// `SAGAS` two-step sagas submitted at once; their outcomes by xid. The first call to reach
/// the bank is held for 300 ms, so the other sagas' first steps queue behind it.
async fn run_sagas<DB: TestBackend>(w: &World<DB>, tag: &str) -> Vec<(String, SagaOutcome)> {
    let sagas = (0..SAGAS).map(|i| async move {
        let xid = format!("{tag}-{i}");
        let handle = w
            .client
            .saga()
            .xid(&xid)
            .step(SagaStep::new("s1", &w.bank, "debit").payload(payload("alice", 1)))
            .step(SagaStep::new("s2", &w.bank, "credit").payload(payload("bob", 1)))
            .submit()
            .await
            .unwrap();
        let outcome = handle.await_outcome(WAIT).await.unwrap();
        (xid, outcome)
    });
    join_all(sagas).await
}

/// A world whose coordinator lets one call at a time out to the bank, which takes batches and
/// holds the first `s1` action 300 ms, then meets `faults` on the next ones.
async fn batching_world<DB: TestBackend>(
    db: &'static TestDb<DB>,
    faults: impl IntoIterator<Item = Fault>,
) -> World<DB> {
    let w = World::start(db, ONE_AT_A_TIME).await;
    w.faults.take_batches();
    let held = std::iter::once(Fault::Delay(Duration::from_millis(300)));
    w.faults.push("s1", Action::Action, held.chain(faults));
    w
}

/// The largest batch the bank took: more than one call, or the test proved nothing.
fn largest_batch(sizes: &[usize]) -> usize {
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(largest > 1, "no call went in a batch: {sizes:?}");
    largest
}

async fn calls_due_together_leave_as_one_batch_and_each_runs_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = batching_world(db, []).await;
    for (xid, outcome) in run_sagas(&w, "together").await {
        assert!(outcome.succeeded(), "{xid}: {outcome:?}");
        assert_eq!(w.effects(&xid, "s1", "action").await, 1, "{xid}");
        assert_eq!(w.effects(&xid, "s2", "action").await, 1, "{xid}");
    }
    let largest = largest_batch(&w.faults.batch_sizes());
    assert!(
        largest >= SAGAS / 2,
        "the queued first steps went apart: {largest}"
    );
    // Every call reached the bank once: nothing was sent twice.
    assert_eq!(w.faults.call_log().len(), 2 * SAGAS);
}
test_on_all_databases!(
    calls_due_together_leave_as_one_batch_and_each_runs_once,
    SCHEMAS
);

async fn one_refusing_item_leaves_the_rest_of_its_batch_alone<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    // The first item of the batch behind the held call refuses.
    let w = batching_world(db, [Fault::Refuse]).await;
    let outcomes = run_sagas(&w, "refuse").await;
    let compensated: Vec<&String> = outcomes
        .iter()
        .filter(|(_, o)| o.status() == TxStatus::Compensated)
        .map(|(xid, _)| xid)
        .collect();
    assert_eq!(compensated.len(), 1, "{outcomes:?}");
    for (xid, outcome) in &outcomes {
        let refused = compensated.contains(&xid);
        assert!(refused || outcome.succeeded(), "{xid}: {outcome:?}");
        // The refusal undid its own change and nothing else.
        let expected = if refused { 0 } else { 1 };
        assert_eq!(w.effects(xid, "s1", "action").await, expected, "{xid}");
        assert_eq!(w.effects(xid, "s2", "action").await, expected, "{xid}");
    }
    largest_batch(&w.faults.batch_sizes());
}
test_on_all_databases!(
    one_refusing_item_leaves_the_rest_of_its_batch_alone,
    SCHEMAS
);

async fn an_erring_item_sends_its_batch_to_run_alone_and_nothing_runs_twice<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    // The first item of the batch behind the held call errs: the batch's transaction rolls
    // back and every item runs alone, each once for good (the injected error is spent).
    let w = batching_world(db, [Fault::HandlerError]).await;
    for (xid, outcome) in run_sagas(&w, "err").await {
        assert!(outcome.succeeded(), "{xid}: {outcome:?}");
        assert_eq!(w.effects(&xid, "s1", "action").await, 1, "{xid}");
        assert_eq!(w.effects(&xid, "s2", "action").await, 1, "{xid}");
    }
    largest_batch(&w.faults.batch_sizes());
    assert_eq!(w.faults.scripted_left(), 0, "the error was met");
    // No item answered from a half-kept batch: each ran alone after the rollback and says so.
    for call in w.faults.call_log().iter().filter(|c| c.branch == "s1") {
        let answer = call.answer.as_ref().expect("answered");
        let seen = (answer.outcome(), answer.detail());
        assert_eq!(
            seen,
            (Outcome::Success, OutcomeDetail::Executed),
            "{call:?}"
        );
    }
}
test_on_all_databases!(
    an_erring_item_sends_its_batch_to_run_alone_and_nothing_runs_twice,
    SCHEMAS
);

async fn a_participant_dying_mid_batch_loses_the_whole_batch_and_each_item_runs_once<
    DB: TestBackend,
>(
    db: &'static TestDb<DB>,
) {
    dtx_tests::participant::quiet_deaths();
    // The first item of the batch behind the held call makes its change and then the
    // participant dies: the batch's open transaction (every item's change, the barrier rows)
    // is rolled back by the database, the coordinator sees UNAVAILABLE for each item and
    // sends them again.
    let w = batching_world(db, [Fault::Die]).await;
    for (xid, outcome) in run_sagas(&w, "die").await {
        assert!(outcome.succeeded(), "{xid}: {outcome:?}");
        assert_eq!(w.effects(&xid, "s1", "action").await, 1, "{xid}");
        assert_eq!(w.effects(&xid, "s2", "action").await, 1, "{xid}");
    }
    assert_eq!(w.faults.scripted_left(), 0, "the participant died");
    let sizes = w.faults.batch_sizes();
    largest_batch(&sizes);
    // The lost batch's items arrived again: more s1 calls than sagas.
    assert!(w.faults.calls("s1", Action::Action) > SAGAS, "{sizes:?}");
}
test_on_all_databases!(
    a_participant_dying_mid_batch_loses_the_whole_batch_and_each_item_runs_once,
    SCHEMAS
);

async fn a_participant_without_batches_gets_single_calls<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, ONE_AT_A_TIME).await;
    w.faults.push(
        "s1",
        Action::Action,
        [Fault::Delay(Duration::from_millis(300))],
    );
    for (xid, outcome) in run_sagas(&w, "old").await {
        assert!(outcome.succeeded(), "{xid}: {outcome:?}");
        assert_eq!(w.effects(&xid, "s1", "action").await, 1, "{xid}");
    }
    assert!(w.faults.batch_sizes().is_empty());
    assert_eq!(w.faults.call_log().len(), 2 * SAGAS);
}
test_on_all_databases!(a_participant_without_batches_gets_single_calls, SCHEMAS);

/// Each item of a batch carries its own call token: a forged or missing one refuses that item
/// alone, before its barrier runs; the others run.
async fn each_item_is_checked_against_its_own_call_token<DB: TestBackend>(db: &'static TestDb<DB>) {
    let dir = tempfile::tempdir().unwrap();
    let keys = AuthKeys::new(dir.path());
    let target = "http://127.0.0.1:1";
    dtx_tests::world::bank(db).await;
    let server = ParticipantServer::new(db.pool.clone())
        .saga(
            "debit",
            |_conn, _call| Box::pin(async { Ok(dtx_sdk::barrier::Reply::ok()) }),
            |_conn, _call| Box::pin(async { Ok(dtx_sdk::barrier::Reply::ok()) }),
        )
        .verify_calls(keys.verifier(&[target]));
    let signer =
        CallSigner::from_pem(&std::fs::read_to_string(&keys.signing_key).unwrap()).unwrap();
    let request = |xid: &str| BranchRequest {
        xid: xid.into(),
        branch_id: "s1".into(),
        action: BranchAction::Action as i32,
        handler: "debit".into(),
        payload: payload("alice", 1),
        headers: Default::default(),
    };
    let signed = |r: &BranchRequest| signer.sign(target, Call::of(r)).unwrap();
    let items = vec![
        BranchBatchItem {
            call_token: signed(&request("good")),
            request: Some(request("good")),
        },
        // Signed for another transaction.
        BranchBatchItem {
            call_token: signed(&request("other")),
            request: Some(request("forged")),
        },
        BranchBatchItem {
            call_token: String::new(),
            request: Some(request("unsigned")),
        },
    ];
    let admitted = server
        .admit_batch(tonic::Request::new(BranchBatchRequest { items }))
        .unwrap();
    let answers = server.handle_batch(admitted).await.answers;
    let codes: Vec<Code> = answers.iter().map(|a| Code::from(a.code)).collect();
    assert_eq!(
        codes,
        [Code::Ok, Code::Unauthenticated, Code::Unauthenticated]
    );
    assert_eq!(
        answers[0].response.as_ref().unwrap().outcome(),
        Outcome::Success
    );
    for (xid, rows) in [("good", 1), ("forged", 0), ("unsigned", 0)] {
        assert_eq!(barrier_rows(&db.pool, xid, "s1").await, rows, "{xid}");
    }
}
test_on_all_databases!(each_item_is_checked_against_its_own_call_token, SCHEMAS);
