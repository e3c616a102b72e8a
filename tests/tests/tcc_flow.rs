//! TCC transactions end to end - a real coordinator, the bank participant on a real gRPC port,
//! the SDK client - on SQLite, PostgreSQL and MariaDB. Effects are asserted from the business
//! ledger.

use std::time::Duration;

use dtx_proto::v1::coordinator_client::CoordinatorClient;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{
    BranchAction, BranchRequest, BranchResponse, BranchStatus, Outcome, OutcomeDetail,
    RegisterBranchRequest, Transaction, TxStatus,
};
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Fault, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World};

fn options(xid: &str) -> TccOptions {
    TccOptions {
        xid: Some(xid.to_string()),
        ..TccOptions::default()
    }
}

/// The bank's `transfer` handler as a TCC branch.
fn transfer(bank: &str, payload: Vec<u8>) -> TccBranch {
    TccBranch::new(bank, "transfer", payload)
}

/// The transaction's final state, waited for up to ten seconds.
async fn settled<DB: TestBackend>(w: &World<DB>, xid: &str) -> Transaction {
    w.client.wait(xid, Duration::from_secs(10)).await.unwrap()
}

/// One `transfer` delivery straight to the bank, past the coordinator.
async fn deliver<DB: TestBackend>(
    w: &World<DB>,
    xid: &str,
    branch: &str,
    action: BranchAction,
    payload: Vec<u8>,
) -> BranchResponse {
    let mut bank = ParticipantClient::connect(w.bank.clone()).await.unwrap();
    bank.branch(BranchRequest {
        xid: xid.into(),
        branch_id: branch.into(),
        action: action as i32,
        handler: "transfer".into(),
        payload,
        headers: Default::default(),
    })
    .await
    .unwrap()
    .into_inner()
}

async fn two_branches_are_confirmed_exactly_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let tx = w.client.begin(options("happy")).await.unwrap();
    let r1 = tx
        .call(transfer(&w.bank, payload("alice", 10)))
        .await
        .unwrap();
    assert!(!r1.is_empty(), "the Try's result reaches the initiator");
    tx.call(transfer(&w.bank, payload("bob", 20)))
        .await
        .unwrap();
    assert_eq!(w.account("alice").await, (START - 10, 10), "held after Try");
    let status = tx.commit().await.unwrap();
    assert_eq!(status, TxStatus::Committed);

    assert_eq!(w.effects("happy", "b1", "confirm").await, 1);
    assert_eq!(w.effects("happy", "b2", "confirm").await, 1);
    assert_eq!(w.account("alice").await, (START - 10, 0));
    assert_eq!(w.account("bob").await, (START - 20, 0));
    let got = w.client.get("happy").await.unwrap();
    assert_eq!(got.status(), TxStatus::Committed);
    assert_eq!(got.decision, "commit");
    assert_eq!(got.branches.len(), 2);
    for b in &got.branches {
        assert_eq!(b.status(), BranchStatus::Confirmed, "{b:?}");
        assert_eq!(b.attempts, 1);
    }
    // Repeating Commit is harmless and reports the outcome.
    assert_eq!(tx.commit().await.unwrap(), TxStatus::Committed);
    assert_eq!(w.effects("happy", "b1", "confirm").await, 1);
}
test_on_all_databases!(two_branches_are_confirmed_exactly_once, SCHEMAS);

async fn a_refused_try_rolls_back_every_registered_branch<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let bank = w.bank.clone();
    let mut raw = CoordinatorClient::connect(w.coordinator.url.clone())
        .await
        .unwrap();
    let result = w
        .client
        .tcc(options("refused"), |tx| async move {
            // A branch registered whose Try never arrives (the initiator "crashed" before it).
            // It is the first branch, so it begins the transaction too.
            raw.register_branch(RegisterBranchRequest {
                xid: tx.xid().to_string(),
                branch_id: "never-tried".into(),
                target: bank.clone(),
                handler: "transfer".into(),
                payload: payload("carol", 5),
                begin_timeout_ms: 60_000,
                ..Default::default()
            })
            .await
            .map_err(Error::from)?;
            tx.call(transfer(&bank, payload("alice", 10))).await?;
            // More than bob has: the bank refuses.
            tx.call(transfer(&bank, payload("bob", START + 1))).await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(
        matches!(result, Err(Error::BranchRefused { .. })),
        "{result:?}"
    );
    let done = settled(&w, "refused").await;
    assert_eq!(done.status(), TxStatus::RolledBack);
    assert!(
        done.branches
            .iter()
            .all(|b| b.status() == BranchStatus::Cancelled),
        "{done:?}"
    );

    // b1 was tried and cancelled; the refused b2 had nothing to undo; never-tried got an empty
    // rollback. Every account is back where it started.
    assert_eq!(w.effects("refused", "b1", "cancel").await, 1);
    assert_eq!(w.effects("refused", "b2", "cancel").await, 0);
    assert_eq!(w.effects("refused", "never-tried", "cancel").await, 0);
    for account in ["alice", "bob", "carol"] {
        assert_eq!(w.account(account).await, (START, 0), "{account}");
    }
    // Cancel reached every branch.
    for branch in ["b1", "b2", "never-tried"] {
        assert_eq!(w.faults.calls(branch, Action::Cancel), 1, "{branch}");
    }
    // The Try of never-tried arriving now is rejected: its Cancel came first.
    let late = deliver(
        &w,
        "refused",
        "never-tried",
        BranchAction::Try,
        payload("carol", 5),
    )
    .await;
    assert_eq!(
        (late.outcome(), late.detail()),
        (Outcome::Failure, OutcomeDetail::Suspended)
    );
    assert_eq!(w.account("carol").await, (START, 0));
}
test_on_all_databases!(a_refused_try_rolls_back_every_registered_branch, SCHEMAS);

async fn confirm_is_retried_through_errors_until_it_succeeds_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    // b1's Confirm: the handler errors (RETRY), the call is UNAVAILABLE, then the effect is
    // applied but the response is lost; the fourth delivery is answered from the barrier.
    w.faults.push(
        "b1",
        Action::Confirm,
        [
            Fault::HandlerError,
            Fault::UnavailableBefore,
            Fault::UnavailableAfter,
        ],
    );
    let tx = w.client.begin(options("retried")).await.unwrap();
    tx.call(transfer(&w.bank, payload("alice", 10)))
        .await
        .unwrap();
    tx.call(transfer(&w.bank, payload("bob", 10)))
        .await
        .unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxStatus::Committed);

    assert_eq!(
        w.effects("retried", "b1", "confirm").await,
        1,
        "applied exactly once"
    );
    assert_eq!(w.faults.calls("b1", Action::Confirm), 4);
    assert_eq!(w.account("alice").await, (START - 10, 0));
    let got = w.client.get("retried").await.unwrap();
    let b1 = got.branches.iter().find(|b| b.branch_id == "b1").unwrap();
    assert_eq!((b1.status(), b1.attempts), (BranchStatus::Confirmed, 4));
}
test_on_all_databases!(
    confirm_is_retried_through_errors_until_it_succeeds_once,
    SCHEMAS
);

async fn an_undecided_transaction_is_rolled_back_at_its_deadline<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let tx = w
        .client
        .begin(TccOptions {
            timeout: Duration::from_millis(300),
            ..options("late")
        })
        .await
        .unwrap();
    tx.call(transfer(&w.bank, payload("alice", 10)))
        .await
        .unwrap();
    let done = settled(&w, "late").await;
    assert_eq!(done.status(), TxStatus::RolledBack);
    assert_eq!(done.decision, "rollback");
    assert_eq!(w.effects("late", "b1", "cancel").await, 1);
    assert_eq!(w.account("alice").await, (START, 0));

    // Commit after the automatic rollback: ABORTED, naming the outcome.
    let err = tx.commit().await.unwrap_err();
    let Error::Rpc(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code(), tonic::Code::Aborted);
    assert!(
        status.message().contains("rollback"),
        "{}",
        status.message()
    );
    assert_eq!(status.metadata().get("dtx-status").unwrap(), "ROLLED_BACK");
}
test_on_all_databases!(
    an_undecided_transaction_is_rolled_back_at_its_deadline,
    SCHEMAS
);

async fn a_refused_confirm_parks_the_transaction_until_resumed<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    w.faults.push("b1", Action::Confirm, [Fault::Refuse]);
    let tx = w.client.begin(options("parked")).await.unwrap();
    tx.call(transfer(&w.bank, payload("alice", 10)))
        .await
        .unwrap();
    tx.call(transfer(&w.bank, payload("bob", 10)))
        .await
        .unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxStatus::NeedsAttention);
    let got = w.client.get("parked").await.unwrap();
    assert_eq!(got.status(), TxStatus::NeedsAttention);
    assert!(
        got.last_error.contains("injected refusal"),
        "{}",
        got.last_error
    );
    let b1 = got.branches.iter().find(|b| b.branch_id == "b1").unwrap();
    assert_eq!(b1.status(), BranchStatus::Stuck);
    // The other branch was still confirmed; nothing retries the stuck one by itself.
    assert_eq!(w.effects("parked", "b2", "confirm").await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        w.faults.calls("b1", Action::Confirm),
        1,
        "no busy loop on a parked transaction"
    );

    // After the operator fixed the participant, Resume finishes the job.
    w.client.resume("parked").await.unwrap();
    let done = settled(&w, "parked").await;
    assert_eq!(done.status(), TxStatus::Committed);
    assert_eq!(w.effects("parked", "b1", "confirm").await, 1);
    assert_eq!(w.account("alice").await, (START - 10, 0));
}
test_on_all_databases!(
    a_refused_confirm_parks_the_transaction_until_resumed,
    SCHEMAS
);

async fn an_unknown_try_outcome_never_commits<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    // The Try is delayed past the client's call timeout: its outcome is unknown to the client.
    w.faults.push(
        "b1",
        Action::Try,
        [Fault::Delay(Duration::from_millis(800))],
    );
    let opts = TccOptions {
        call_timeout: Duration::from_millis(200),
        try_retries: 0,
        ..options("unknown")
    };
    let bank = w.bank.clone();
    let result = w
        .client
        .tcc(opts, |tx| async move {
            tx.call(transfer(&bank, payload("alice", 10))).await?;
            Ok::<_, Error>(())
        })
        .await;
    assert!(
        matches!(result, Err(Error::BranchInDoubt { .. })),
        "{result:?}"
    );
    let done = settled(&w, "unknown").await;
    assert_eq!(done.status(), TxStatus::RolledBack);
    // Whether the slow Try ran before or after its Cancel, nothing stands.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(w.account("alice").await, (START, 0));
}
test_on_all_databases!(an_unknown_try_outcome_never_commits, SCHEMAS);

/// A person cancels a branch at the participant (a forced decision), then the initiator
/// commits: the barrier refuses the Confirm with a conflict, the coordinator parks the
/// transaction, and the Confirm's business closure never ran.
async fn a_confirm_after_a_forced_cancel_parks_the_transaction<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let tx = w.client.begin(options("forced")).await.unwrap();
    tx.call(transfer(&w.bank, payload("alice", 10)))
        .await
        .unwrap();
    tx.call(transfer(&w.bank, payload("bob", 10)))
        .await
        .unwrap();
    let cancel = deliver(
        &w,
        "forced",
        "b1",
        BranchAction::Cancel,
        payload("alice", 10),
    )
    .await;
    assert_eq!(
        (cancel.outcome(), cancel.detail()),
        (Outcome::Success, OutcomeDetail::Executed)
    );
    assert_eq!(w.account("alice").await, (START, 0), "the hold went back");

    assert_eq!(tx.commit().await.unwrap(), TxStatus::NeedsAttention);
    let got = w.client.get("forced").await.unwrap();
    assert_eq!(got.status(), TxStatus::NeedsAttention);
    assert!(
        got.last_error
            .contains("confirm refused: branch forced/b1 was already cancelled"),
        "{}",
        got.last_error
    );
    assert_eq!(w.effects("forced", "b1", "confirm").await, 0);
    assert_eq!(
        w.account("alice").await,
        (START, 0),
        "the confirm never ran"
    );
    assert_eq!(w.effects("forced", "b2", "confirm").await, 1);
}
test_on_all_databases!(
    a_confirm_after_a_forced_cancel_parks_the_transaction,
    SCHEMAS
);
