//! `dtx.v1.Admin` against a real coordinator and the bank participant on every database:
//! listing with every filter and across pages, the history of a fault-injected transaction,
//! and each operator action's preconditions and idempotence.

use std::time::Duration;

use dtx_proto::v1::admin_client::AdminClient;
use dtx_proto::v1::coordinator_client::CoordinatorClient;
use dtx_proto::v1::{
    AdminActionRequest, BeginRequest, DescribeTransactionRequest, HistoryKind,
    ListTransactionsRequest, StatsRequest, TransactionDetail, TxKind, TxStatus,
};
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{RetryPolicy, SagaStep, TccBranch, TccOptions};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Fault, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World, debit_alice};
use tonic::Code;
use tonic::transport::Channel;

async fn admin<DB: TestBackend>(w: &World<DB>) -> AdminClient<Channel> {
    AdminClient::connect(w.coordinator.url.clone())
        .await
        .unwrap()
}

fn options(xid: &str) -> TccOptions {
    TccOptions {
        xid: Some(xid.to_string()),
        ..TccOptions::default()
    }
}

fn transfer(bank: &str, account: &str) -> TccBranch {
    TccBranch::new(bank, "transfer", payload(account, 10))
}

/// An action by operator `ops-anna` with `reason`.
fn action(xid: &str, reason: &str) -> tonic::Request<AdminActionRequest> {
    let mut request = tonic::Request::new(AdminActionRequest {
        xid: xid.into(),
        reason: reason.into(),
    });
    request
        .metadata_mut()
        .insert("x-dtx-operator", "ops-anna".parse().unwrap());
    request
}

async fn describe(admin: &mut AdminClient<Channel>, xid: &str) -> TransactionDetail {
    admin
        .describe_transaction(DescribeTransactionRequest { xid: xid.into() })
        .await
        .unwrap()
        .into_inner()
}

/// Describes `xid` until it durably reached `status`: its history records it (ten seconds at
/// most; the live view may announce a certain outcome before it is written).
async fn until_status(
    admin: &mut AdminClient<Channel>,
    xid: &str,
    status: TxStatus,
) -> TransactionDetail {
    let name = status.as_str_name().trim_start_matches("TX_STATUS_");
    for _ in 0..200 {
        let d = describe(admin, xid).await;
        let recorded = d
            .history
            .iter()
            .any(|e| e.branch_id.is_empty() && e.status == name);
        if d.transaction.as_ref().unwrap().status() == status && recorded {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{xid} never became {status:?}: {:?}",
        describe(admin, xid).await
    );
}

/// The history as `(kind, branch, status)` triples, for comparing shapes.
fn shape(d: &TransactionDetail) -> Vec<(HistoryKind, String, String)> {
    d.history
        .iter()
        .map(|e| (e.kind(), e.branch_id.clone(), e.status.clone()))
        .collect()
}

fn operator_entries(d: &TransactionDetail) -> Vec<String> {
    d.history
        .iter()
        .filter(|e| e.kind() == HistoryKind::Operator)
        .map(|e| format!("{} {}", e.actor, e.detail))
        .collect()
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> (Code, String) {
    let status = result.unwrap_err();
    (status.code(), status.message().to_string())
}

async fn the_history_tells_what_happened_to_a_faulted_commit<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    w.faults.push(
        "b1",
        Action::Confirm,
        [Fault::UnavailableBefore, Fault::HandlerError],
    );
    let tx = w.client.begin(options("faulted")).await.unwrap();
    tx.call(transfer(&w.bank, "alice").id("b1")).await.unwrap();
    tx.call(transfer(&w.bank, "bob").id("b2")).await.unwrap();
    tx.commit().await.unwrap();
    let d = until_status(&mut admin, "faulted", TxStatus::Committed).await;

    let s = |kind, branch: &str, status: &str| (kind, branch.to_string(), status.to_string());
    // b2's Confirm succeeded at once: folded into the final status change.
    let got = shape(&d);
    assert_eq!(
        got,
        [
            s(HistoryKind::Created, "", "TRYING"),
            s(HistoryKind::Registered, "b1", "PENDING"),
            s(HistoryKind::Registered, "b2", "PENDING"),
            s(HistoryKind::Decided, "", "COMMITTING"),
            s(HistoryKind::AttemptUnknown, "b1", "PENDING"),
            s(HistoryKind::AttemptUnknown, "b1", "PENDING"),
            s(HistoryKind::Branch, "b1", "CONFIRMED"),
            s(HistoryKind::Status, "", "COMMITTED"),
        ],
        "{:#?}",
        d.history
    );
    let attempts: Vec<_> = d
        .history
        .iter()
        .filter(|e| e.branch_id == "b1" && e.kind() != HistoryKind::Registered)
        .map(|e| {
            (
                e.attempt,
                e.detail.is_empty(),
                e.actor.starts_with("coordinator-"),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(1, false, true), (2, false, true), (3, true, true)],
        "each attempt numbered, failures with their error, by the instance: {:#?}",
        d.history
    );
    assert!(
        d.history
            .windows(2)
            .all(|p| p[0].at_unix_ms <= p[1].at_unix_ms)
    );
    assert_eq!(d.owner, "", "settled: nobody drives it");
    assert_eq!(d.transaction.unwrap().branches.len(), 2);
}
test_on_all_databases!(the_history_tells_what_happened_to_a_faulted_commit, SCHEMAS);

async fn resume_brings_a_parked_transaction_home_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    w.faults.push("b1", Action::Confirm, [Fault::Refuse]);
    let tx = w.client.begin(options("parked")).await.unwrap();
    tx.call(transfer(&w.bank, "alice").id("b1")).await.unwrap();

    // Not parked yet: nothing was decided, so there is nothing to resume.
    let (c, m) = code(admin.resume(action("parked", "try")).await);
    assert_eq!(c, Code::FailedPrecondition, "{m}");
    assert!(m.contains("TRYING"), "{m}");

    tx.commit().await.unwrap();
    let parked = until_status(&mut admin, "parked", TxStatus::NeedsAttention).await;
    let failed = parked
        .history
        .iter()
        .find(|e| e.kind() == HistoryKind::AttemptFailed)
        .expect("the refused confirm is in the history");
    assert_eq!(
        (failed.branch_id.as_str(), failed.status.as_str()),
        ("b1", "STUCK")
    );
    assert!(failed.detail.contains("injected refusal"), "{failed:?}");
    let (c, m) = code(admin.retry_now(action("parked", "now")).await);
    assert_eq!(c, Code::FailedPrecondition, "{m}");
    assert!(m.contains("Resume"), "{m}");

    // Bad input: refused with the limit named, nothing recorded.
    let (c, m) = code(admin.resume(action("parked", "")).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("reason"), "{m}");
    let (c, m) = code(admin.resume(action("parked", &"x".repeat(513))).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("512"), "{m}");
    let mut bad_operator = action("parked", "fixed");
    bad_operator
        .metadata_mut()
        .insert("x-dtx-operator", "<script>".parse().unwrap());
    let (c, m) = code(admin.resume(bad_operator).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("x-dtx-operator"), "{m}");
    let (c, _) = code(admin.resume(action("nope", "fixed")).await);
    assert_eq!(c, Code::NotFound);
    assert!(operator_entries(&describe(&mut admin, "parked").await).is_empty());

    admin
        .resume(action("parked", "participant fixed"))
        .await
        .unwrap();
    let done = until_status(&mut admin, "parked", TxStatus::Committed).await;
    assert_eq!(w.effects("parked", "b1", "confirm").await, 1);
    assert_eq!(w.account("alice").await, (START - 10, 0));
    // A repeat is a no-op: answered with the transaction, nothing recorded again.
    let again = admin
        .resume(action("parked", "participant fixed"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.transaction.unwrap().status(), TxStatus::Committed);
    let entries = operator_entries(&describe(&mut admin, "parked").await);
    assert_eq!(entries, ["ops-anna resume: participant fixed"]);
    assert_eq!(operator_entries(&done), entries);
}
test_on_all_databases!(resume_brings_a_parked_transaction_home_once, SCHEMAS);

async fn force_rollback_cancels_an_undecided_transaction<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    let tx = w.client.begin(options("stuck-try")).await.unwrap();
    tx.call(transfer(&w.bank, "alice").id("b1")).await.unwrap();
    admin
        .force_rollback(action("stuck-try", "initiator is gone"))
        .await
        .unwrap();
    let d = until_status(&mut admin, "stuck-try", TxStatus::RolledBack).await;
    assert_eq!(w.effects("stuck-try", "b1", "cancel").await, 1);
    assert_eq!(w.account("alice").await, (START, 0));
    admin
        .force_rollback(action("stuck-try", "again"))
        .await
        .unwrap();
    assert_eq!(
        operator_entries(&describe(&mut admin, "stuck-try").await),
        ["ops-anna force rollback: initiator is gone"]
    );
    assert!(shape(&d).contains(&(HistoryKind::Operator, String::new(), "ROLLING_BACK".into())));
    // The initiator's late Commit learns the outcome.
    let err = tx.commit().await.unwrap_err();
    assert!(
        err.to_string().contains("rollback") || err.to_string().contains("ROLLED"),
        "{err}"
    );

    // Committed: too late.
    let tx = w.client.begin(options("done")).await.unwrap();
    tx.call(transfer(&w.bank, "bob").id("b1")).await.unwrap();
    tx.commit().await.unwrap();
    until_status(&mut admin, "done", TxStatus::Committed).await;
    let (c, m) = code(admin.force_rollback(action("done", "oops")).await);
    assert_eq!(c, Code::FailedPrecondition, "{m}");
    assert!(m.contains("COMMITTED"), "{m}");
    let (c, m) = code(admin.retry_now(action("done", "oops")).await);
    assert_eq!(c, Code::FailedPrecondition, "{m}");
}
test_on_all_databases!(force_rollback_cancels_an_undecided_transaction, SCHEMAS);

async fn force_rollback_compensates_a_running_saga<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    // s2's action is held in the network for a while: the saga is RUNNING when forced.
    let delay = Fault::Delay(Duration::from_millis(1500));
    w.faults.push("s2", Action::Action, [delay]);
    w.client
        .saga()
        .xid("forced")
        .step(debit_alice("s1", &w.bank, 5))
        .step(debit_alice("s2", &w.bank, 7).after(["s1"]))
        .submit()
        .await
        .unwrap();
    until_status(&mut admin, "forced", TxStatus::Running).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin
        .force_rollback(action("forced", "wrong amount"))
        .await
        .unwrap();
    let d = until_status(&mut admin, "forced", TxStatus::Compensated).await;
    // Whatever ran is undone; the late s2 action is stopped by the barrier or compensated.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.account("alice").await, (START, 0));
    assert_eq!(d.transaction.unwrap().decision, "compensate");
    // Decided and carried out: Resume has nothing to do, and records nothing.
    admin.resume(action("forced", "x")).await.unwrap();
    assert_eq!(
        operator_entries(&describe(&mut admin, "forced").await),
        ["ops-anna force rollback: wrong amount"]
    );
}
test_on_all_databases!(force_rollback_compensates_a_running_saga, SCHEMAS);

async fn retry_now_does_not_wait_for_the_backoff<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    // One unknown outcome, then a minute of backoff: handed back to the store.
    w.faults
        .push("s1", Action::Action, [Fault::UnavailableBefore]);
    let slow = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_secs(60),
        max_backoff: Duration::from_secs(60),
        call_timeout: Duration::from_secs(5),
    };
    w.client
        .saga()
        .xid("backoff")
        .step(
            SagaStep::new("s1", &w.bank, "debit")
                .payload(payload("alice", 3))
                .retry(slow),
        )
        .submit()
        .await
        .unwrap();
    let waiting = loop {
        let d = describe(&mut admin, "backoff").await;
        if d.owner.is_empty()
            && d.history
                .iter()
                .any(|e| e.kind() == HistoryKind::AttemptUnknown)
        {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The backoff is 60 s with equal jitter: the retry is due 30 s after the failure at the
    // earliest.
    let failed_at = waiting
        .history
        .iter()
        .find(|e| e.kind() == HistoryKind::AttemptUnknown)
        .unwrap()
        .at_unix_ms;
    let due = waiting.due_unix_ms;
    assert!(
        due >= failed_at + 30_000,
        "due {due}, failed at {failed_at}"
    );
    admin
        .retry_now(action("backoff", "participant is back"))
        .await
        .unwrap();
    let second = admin
        .retry_now(action("backoff", "participant is back"))
        .await;
    if let Err(s) = &second {
        assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    }
    let d = until_status(&mut admin, "backoff", TxStatus::Succeeded).await;
    let finished = d.history.last().unwrap().at_unix_ms;
    assert!(
        finished < failed_at + 25_000,
        "succeeded at {finished}, long before the retry due at {due} (failed at {failed_at})"
    );
    assert_eq!(
        operator_entries(&d),
        ["ops-anna retry now: participant is back"]
    );
    assert!(shape(&d).contains(&(HistoryKind::Takeover, String::new(), String::new())));
    assert_eq!(w.account("alice").await, (START - 3, 0));

    let tx = w.client.begin(options("undecided")).await.unwrap();
    tx.call(transfer(&w.bank, "bob").id("b1")).await.unwrap();
    let (c, m) = code(admin.retry_now(action(tx.xid(), "now")).await);
    assert_eq!(c, Code::FailedPrecondition, "{m}");
}
test_on_all_databases!(retry_now_does_not_wait_for_the_backoff, SCHEMAS);

fn list(f: impl FnOnce(&mut ListTransactionsRequest)) -> ListTransactionsRequest {
    let mut request = ListTransactionsRequest::default();
    f(&mut request);
    request
}

async fn xids(admin: &mut AdminClient<Channel>, request: ListTransactionsRequest) -> Vec<String> {
    let page = admin.list_transactions(request).await.unwrap().into_inner();
    page.transactions.into_iter().map(|t| t.xid).collect()
}

async fn listing_filters_and_pages_newest_first<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut admin = admin(&w).await;
    let mut created = Vec::new();
    let mut coordinator = CoordinatorClient::connect(w.coordinator.url.clone())
        .await
        .unwrap();
    for i in 0..7 {
        let xid = format!("page-{i}");
        let begin = BeginRequest {
            xid: xid.clone(),
            timeout_ms: 600_000,
        };
        coordinator.begin(begin).await.unwrap();
        created.push(xid);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let tx = w.client.begin(options("other-committed")).await.unwrap();
    tx.call(transfer(&w.bank, "alice").id("b1")).await.unwrap();
    tx.commit().await.unwrap();
    w.park("other-parked", "bob", Fault::Refuse).await;
    until_status(&mut admin, "other-parked", TxStatus::NeedsAttention).await;
    until_status(&mut admin, "other-committed", TxStatus::Committed).await;
    w.client
        .saga()
        .xid("other-saga")
        .step(debit_alice("s1", &w.bank, 1))
        .submit()
        .await
        .unwrap();
    until_status(&mut admin, "other-saga", TxStatus::Succeeded).await;

    // Pages of three, newest first, each xid once, across every page.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = admin
            .list_transactions(list(|r| {
                r.xid_prefix = "page-".into();
                r.limit = 3;
                r.page_token = token.clone();
            }))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.transactions.len() <= 3);
        assert!(page.transactions.iter().all(|t| t.branches.is_empty()));
        seen.extend(page.transactions.into_iter().map(|t| t.xid));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);

    let all = xids(&mut admin, list(|_| {})).await;
    assert_eq!(all.len(), 10);
    assert_eq!(all[0], "other-saga");
    let status = |s: TxStatus| list(move |r| r.statuses = vec![s as i32]);
    assert_eq!(
        xids(&mut admin, status(TxStatus::Committed)).await,
        ["other-committed"]
    );
    assert_eq!(
        xids(&mut admin, list(|r| r.needs_attention = true)).await,
        ["other-parked"]
    );
    let both = list(|r| {
        r.statuses = vec![TxStatus::Committed as i32, TxStatus::NeedsAttention as i32];
        r.needs_attention = true;
    });
    assert_eq!(
        xids(&mut admin, both).await,
        ["other-parked", "other-committed"]
    );
    assert_eq!(
        xids(&mut admin, status(TxStatus::Trying)).await,
        newest_first
    );
    let sagas = list(|r| r.kind = TxKind::Saga as i32);
    assert_eq!(xids(&mut admin, sagas).await, ["other-saga"]);
    let tcc_others = list(|r| {
        r.kind = TxKind::Tcc as i32;
        r.xid_prefix = "other-".into();
    });
    assert_eq!(
        xids(&mut admin, tcc_others).await,
        ["other-parked", "other-committed"]
    );

    // Time bounds: the creation times of page-2 ..= page-4.
    let listed = admin
        .list_transactions(list(|r| r.xid_prefix = "page-".into()))
        .await
        .unwrap()
        .into_inner()
        .transactions;
    let at = |xid: &str| {
        listed
            .iter()
            .find(|t| t.xid == xid)
            .unwrap()
            .created_unix_ms
    };
    let window = list(|r| {
        r.xid_prefix = "page-".into();
        r.created_from_unix_ms = at("page-2");
        r.created_to_unix_ms = at("page-4");
    });
    let got = xids(&mut admin, window).await;
    assert!(
        got.starts_with(&["page-4".to_string()]) && got.ends_with(&["page-2".to_string()]),
        "{got:?}"
    );
    let updated = list(|r| r.updated_from_unix_ms = at("page-6") + 1);
    assert!(
        !xids(&mut admin, updated)
            .await
            .contains(&"page-0".to_string())
    );
    let old = list(|r| r.older_than_ms = 3_600_000);
    assert!(xids(&mut admin, old).await.is_empty());
    let young = list(|r| r.older_than_ms = 1);
    let got = xids(&mut admin, young).await;
    assert!(got.len() >= 9, "{got:?}");

    // Bad input names the limit.
    for (request, what) in [
        (list(|r| r.limit = 501), "500"),
        (list(|r| r.page_token = "garbage".into()), "page_token"),
        (list(|r| r.xid_prefix = "a b".into()), "xid_prefix"),
        (list(|r| r.statuses = vec![99]), "statuses"),
    ] {
        let (c, m) = code(admin.list_transactions(request).await);
        assert_eq!(c, Code::InvalidArgument, "{m}");
        assert!(m.contains(what), "{m}");
    }

    let stats = admin.stats(StatsRequest {}).await.unwrap().into_inner();
    let count = |kind: TxKind, status: TxStatus| {
        stats
            .counts
            .iter()
            .find(|c| c.kind() == kind && c.status() == status)
            .map_or(0, |c| c.count)
    };
    assert_eq!(count(TxKind::Tcc, TxStatus::Trying), 7);
    assert_eq!(count(TxKind::Tcc, TxStatus::Committed), 1);
    assert_eq!(count(TxKind::Saga, TxStatus::Succeeded), 1);
    assert_eq!(stats.needs_attention, 1);
    assert!(stats.oldest_open_age_ms > 0);
}
test_on_all_databases!(listing_filters_and_pages_newest_first, SCHEMAS);
