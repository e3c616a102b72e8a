//! `/metrics` after a fault-injected run, on every database: each metric the README lists
//! moved as the run says it must (a clean commit, a Confirm that gets no answer twice, a
//! refused Confirm that parks, a saga, an undecided TCC rolled back at its deadline by
//! recovery, one left open) - and no series is labelled with an xid.

use std::time::Duration;

use dtx_coordinator::engine::METRIC_NAMES;
use dtx_proto::v1::TxStatus;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::net::free_addr;
use dtx_tests::participant::{Fault, payload};
use dtx_tests::scrape::{Scrape, scrape};
use dtx_tests::test_on_all_databases;
use dtx_tests::webhook::Receiver;
use dtx_tests::world::{SCHEMAS, World, debit_alice};

fn options(xid: &str, timeout: Duration) -> TccOptions {
    TccOptions {
        xid: Some(xid.into()),
        timeout,
        ..TccOptions::default()
    }
}

/// `after - before` of the sum of `name`'s series carrying `labels`.
fn moved(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.sum(name, labels) - before.sum(name, labels)
}

async fn a_faulted_run_moves_every_metric<DB: TestBackend>(db: &'static TestDb<DB>) {
    let receiver = Receiver::start().await;
    let addr = free_addr().await;
    let w = World::start(
        db,
        &[
            "--metrics-listen",
            &addr.to_string(),
            "--alert-webhook",
            &receiver.url,
        ],
    )
    .await;
    let before = scrape(addr).await;
    let long = Duration::from_secs(120);

    // A clean commit.
    let tx = w.client.begin(options("m-clean", long)).await.unwrap();
    tx.call(TccBranch::new(&w.bank, "transfer", payload("alice", 1)).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let clean = w
        .client
        .wait("m-clean", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(clean.status(), TxStatus::Committed);

    // A Confirm that runs but whose answer is lost twice: two unknown answers, two retries.
    w.faults
        .push("b2", Action::Confirm, vec![Fault::UnavailableAfter; 2]);
    let tx = w.client.begin(options("m-flaky", long)).await.unwrap();
    tx.call(TccBranch::new(&w.bank, "transfer", payload("bob", 1)).id("b2"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let flaky = w
        .client
        .wait("m-flaky", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(flaky.status(), TxStatus::Committed);

    // A refused Confirm: parked, and its alert delivered.
    let parked = w.park("m-parked", "carol", Fault::Refuse).await;
    assert_eq!(parked.status(), TxStatus::NeedsAttention);

    // A saga.
    let saga = w
        .client
        .saga()
        .xid("m-saga")
        .step(debit_alice("s1", &w.bank, 1))
        .submit()
        .await
        .unwrap()
        .await_outcome(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(saga.status(), TxStatus::Succeeded);

    // Undecided with a short timeout: recovery claims it at its deadline and rolls it back.
    let short = w
        .client
        .begin(options("m-deadline", Duration::from_millis(300)))
        .await
        .unwrap();
    short
        .call(TccBranch::new(&w.bank, "transfer", payload("alice", 1)).id("b3"))
        .await
        .unwrap();
    let expired = w
        .client
        .wait("m-deadline", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(expired.status(), TxStatus::RolledBack);

    // Undecided and open: the oldest open transaction.
    let open = w.client.begin(options("m-open", long)).await.unwrap();
    open.call(TccBranch::new(&w.bank, "transfer", payload("bob", 1)).id("b4"))
        .await
        .unwrap();
    receiver
        .until(Duration::from_secs(10), |r| {
            r.iter().any(|e| e.event["xid"] == "m-parked")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = scrape(addr).await;
    let moved = |name: &str, labels: &[(&str, &str)]| moved(&before, &after, name, labels);

    let started = "dtx_transactions_started_total";
    assert_eq!(moved(started, &[("kind", "tcc")]), 5.0, "{}", after.text);
    assert_eq!(moved(started, &[("kind", "saga")]), 1.0);
    let finished = "dtx_transactions_finished_total";
    assert_eq!(moved(finished, &[("status", "COMMITTED")]), 2.0);
    assert_eq!(moved(finished, &[("status", "NEEDS_ATTENTION")]), 1.0);
    assert_eq!(moved(finished, &[("status", "SUCCEEDED")]), 1.0);
    assert_eq!(moved(finished, &[("status", "ROLLED_BACK")]), 1.0);
    let duration = "dtx_transaction_duration_seconds_count";
    assert_eq!(
        moved(duration, &[("kind", "tcc"), ("outcome", "COMMITTED")]),
        2.0
    );
    assert_eq!(
        moved(duration, &[("kind", "saga"), ("outcome", "SUCCEEDED")]),
        1.0
    );
    assert!(moved("dtx_transaction_duration_seconds_sum", &[]) > 0.0);

    let calls = "dtx_branch_call_duration_seconds_count";
    let transfer = ("handler", "transfer");
    let confirm = [transfer, ("action", "CONFIRM")];
    assert_eq!(
        moved(calls, &[confirm[0], confirm[1], ("outcome", "success")]),
        2.0
    );
    assert_eq!(
        moved(calls, &[confirm[0], confirm[1], ("outcome", "unknown")]),
        2.0
    );
    assert_eq!(
        moved(calls, &[confirm[0], confirm[1], ("outcome", "failure")]),
        1.0
    );
    assert_eq!(
        moved(
            calls,
            &[transfer, ("action", "CANCEL"), ("outcome", "success")]
        ),
        1.0
    );
    assert_eq!(
        moved(calls, &[("handler", "debit"), ("action", "ACTION")]),
        1.0
    );
    assert_eq!(moved("dtx_branch_retries_total", &confirm), 2.0);

    assert_eq!(moved("dtx_needs_attention_total", &[]), 1.0);
    assert_eq!(after.sum("dtx_needs_attention", &[]), 1.0);
    assert_eq!(moved("dtx_takeovers_total", &[("status", "TRYING")]), 1.0);
    assert!(after.sum("dtx_oldest_open_transaction_age_seconds", &[]) > 0.0);
    assert_eq!(after.sum("dtx_drivers_active", &[]), 0.0);
    assert!(after.names.contains("dtx_clock_offset_ms"));
    assert!(moved("dtx_store_commits_total", &[]) >= 6.0);
    // Commits count recovery's claims too; writes only state changes (begin, register,
    // decide, final status: at least 12 here).
    assert!(moved("dtx_store_writes_total", &[]) >= 12.0);
    assert_eq!(moved("dtx_store_errors_total", &[]), 0.0);
    assert!(moved("dtx_alert_deliveries_total", &[("result", "delivered")]) >= 1.0);

    // Every metric the README lists is exported, and none is labelled with a transaction.
    for name in METRIC_NAMES {
        assert!(
            after.names.contains(*name),
            "{name} not exported:\n{}",
            after.text
        );
    }
    for xid in [
        "m-clean",
        "m-flaky",
        "m-parked",
        "m-saga",
        "m-deadline",
        "m-open",
    ] {
        assert!(
            !after.text.contains(xid),
            "{xid} in a label:\n{}",
            after.text
        );
    }
}
test_on_all_databases!(a_faulted_run_moves_every_metric, SCHEMAS);
