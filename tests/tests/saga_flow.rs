//! Sagas end to end - a real coordinator, the bank participant's `debit` step (action takes the
//! amount, compensation returns it) on a real gRPC port, the SDK's saga builder - on SQLite,
//! PostgreSQL and MariaDB. Effects are asserted from the business ledger and the bank's call log.

use std::time::Duration;

use dtx_proto::v1::{BranchStatus, OutcomeDetail, TxStatus};
use dtx_sdk::Error;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{RetryPolicy, SagaBuilder, SagaOutcome, SagaStep};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Fault, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World};
use tonic::Code;

fn step(name: &str, bank: &str, account: &str, amount: i64) -> SagaStep {
    SagaStep::new(name, bank, "debit").payload(payload(account, amount))
}

/// Quick retries, so tests that exercise them stay short.
fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        call_timeout: Duration::from_secs(5),
    }
}

const WAIT: Duration = Duration::from_secs(20);

/// Submits a saga and waits (up to [`WAIT`]) for its outcome; both must succeed.
trait Settle {
    async fn settle(self) -> SagaOutcome;
}

impl Settle for SagaBuilder {
    async fn settle(self) -> SagaOutcome {
        self.submit()
            .await
            .unwrap()
            .await_outcome(WAIT)
            .await
            .unwrap()
    }
}

async fn four_sequential_steps_succeed_once_each<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let outcome = w
        .client
        .saga()
        .xid("four")
        .step(step("s1", &w.bank, "alice", 1))
        .step(step("s2", &w.bank, "bob", 2))
        .step(step("s3", &w.bank, "carol", 3))
        .step(step("s4", &w.bank, "alice", 4))
        // Submit and wait in one round trip.
        .run(WAIT)
        .await
        .unwrap();
    assert!(outcome.succeeded(), "{outcome:?}");
    for (s, _) in [("s1", 1), ("s2", 2), ("s3", 3), ("s4", 4)] {
        assert_eq!(w.effects("four", s, "action").await, 1, "{s}");
        assert_eq!(w.effects("four", s, "compensate").await, 0, "{s}");
        let b = outcome.steps().iter().find(|b| b.branch_id == s).unwrap();
        assert_eq!((b.status(), b.attempts), (BranchStatus::Done, 1), "{s}");
        assert!(
            outcome
                .result(s)
                .unwrap()
                .starts_with(format!("action:{s}:").as_bytes())
        );
    }
    // Sequential means one after the other at the participant.
    let log = w.faults.call_log();
    let order: Vec<&str> = log.iter().map(|c| c.branch.as_str()).collect();
    assert_eq!(order, ["s1", "s2", "s3", "s4"]);
    for pair in log.windows(2) {
        assert!(pair[0].finished.unwrap() <= pair[1].started, "{pair:?}");
    }
    assert_eq!(w.account("alice").await, (START - 5, 0));
    assert_eq!(w.account("carol").await, (START - 3, 0));
}
test_on_all_databases!(four_sequential_steps_succeed_once_each, SCHEMAS);

async fn a_refused_step_compensates_the_earlier_ones_in_reverse<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let outcome = w
        .client
        .saga()
        .xid("refused")
        .step(step("s1", &w.bank, "alice", 1))
        .step(step("s2", &w.bank, "bob", 2))
        // More than carol has: refused.
        .step(step("s3", &w.bank, "carol", START + 1))
        .step(step("s4", &w.bank, "alice", 4))
        .settle()
        .await;
    assert_eq!(outcome.status(), TxStatus::Compensated, "{outcome:?}");
    let calls: Vec<(String, Action)> = w
        .faults
        .call_log()
        .into_iter()
        .map(|c| (c.branch, c.action))
        .collect();
    let expected = [
        ("s1", Action::Action),
        ("s2", Action::Action),
        ("s3", Action::Action),
        ("s2", Action::Compensate),
        ("s1", Action::Compensate),
    ];
    assert_eq!(
        calls,
        expected.map(|(b, a)| (b.to_string(), a)),
        "s4 never runs, s2 before s1"
    );
    for s in ["s1", "s2"] {
        assert_eq!(w.effects("refused", s, "compensate").await, 1, "{s}");
    }
    let status = |s: &str| {
        outcome
            .steps()
            .iter()
            .find(|b| b.branch_id == s)
            .unwrap()
            .status()
    };
    assert_eq!(
        [status("s1"), status("s2"), status("s3"), status("s4")],
        [
            BranchStatus::Compensated,
            BranchStatus::Compensated,
            BranchStatus::Refused,
            BranchStatus::Skipped
        ]
    );
    assert!(
        outcome.0.last_error.contains("s3"),
        "{}",
        outcome.0.last_error
    );
    for account in ["alice", "bob", "carol"] {
        assert_eq!(w.account(account).await, (START, 0), "{account}");
    }
}
test_on_all_databases!(
    a_refused_step_compensates_the_earlier_ones_in_reverse,
    SCHEMAS
);

async fn independent_steps_overlap_and_compensate_after_their_dependent<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    for s in ["a", "b"] {
        w.faults.push(
            s,
            Action::Action,
            [Fault::Delay(Duration::from_millis(300))],
        );
    }
    let outcome = w
        .client
        .saga()
        .xid("dag")
        .step(step("a", &w.bank, "alice", 1).after(Vec::<String>::new()))
        .step(step("b", &w.bank, "bob", 1))
        .step(step("c", &w.bank, "carol", START + 1).after(["a", "b"]))
        .settle()
        .await;
    assert_eq!(outcome.status(), TxStatus::Compensated, "{outcome:?}");
    let log = w.faults.call_log();
    let find = |b: &str, a: Action| {
        log.iter()
            .find(|c| c.branch == b && c.action == a)
            .unwrap()
            .clone()
    };
    let (a, b, c) = (
        find("a", Action::Action),
        find("b", Action::Action),
        find("c", Action::Action),
    );
    // A and B ran at the same time.
    assert!(
        a.started < b.finished.unwrap() && b.started < a.finished.unwrap(),
        "{a:?} {b:?}"
    );
    // C started after both; both were compensated after C's refusal.
    assert!(c.started >= a.finished.unwrap() && c.started >= b.finished.unwrap());
    for s in ["a", "b"] {
        let comp = find(s, Action::Compensate);
        assert!(comp.started >= c.finished.unwrap(), "{s}");
        assert_eq!(w.effects("dag", s, "compensate").await, 1);
    }
    let deps = &outcome
        .steps()
        .iter()
        .find(|s| s.branch_id == "c")
        .unwrap()
        .depends_on;
    assert_eq!(deps, &["a", "b"]);
    assert_eq!(w.account("alice").await, (START, 0));
    assert_eq!(w.account("bob").await, (START, 0));
}
test_on_all_databases!(
    independent_steps_overlap_and_compensate_after_their_dependent,
    SCHEMAS
);

async fn retried_action_and_compensation_take_effect_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    w.faults.push(
        "s1",
        Action::Action,
        [Fault::HandlerError, Fault::HandlerError],
    );
    w.faults.push(
        "s1",
        Action::Compensate,
        [
            Fault::UnavailableBefore,
            Fault::UnavailableBefore,
            Fault::UnavailableAfter,
            Fault::UnavailableBefore,
        ],
    );
    let outcome = w
        .client
        .saga()
        .xid("retries")
        .retry(fast_retry())
        .step(step("s1", &w.bank, "alice", 5))
        .step(step("s2", &w.bank, "bob", START + 1))
        .settle()
        .await;
    assert_eq!(outcome.status(), TxStatus::Compensated, "{outcome:?}");
    assert_eq!(
        w.faults.calls("s1", Action::Action),
        3,
        "RETRY twice, then success"
    );
    assert_eq!(w.faults.calls("s1", Action::Compensate), 5);
    assert_eq!(w.effects("retries", "s1", "action").await, 1);
    assert_eq!(w.effects("retries", "s1", "compensate").await, 1);
    assert_eq!(w.account("alice").await, (START, 0));
}
test_on_all_databases!(retried_action_and_compensation_take_effect_once, SCHEMAS);

async fn a_compensation_that_overtakes_its_action_blocks_it<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    // The action is stuck in the network past the saga's deadline.
    w.faults.push(
        "s1",
        Action::Action,
        [Fault::Delay(Duration::from_millis(1500))],
    );
    let outcome = w
        .client
        .saga()
        .xid("overtaken")
        .timeout(Duration::from_millis(400))
        .retry(RetryPolicy {
            max_attempts: 1,
            call_timeout: Duration::from_millis(200),
            ..fast_retry()
        })
        .step(step("s1", &w.bank, "alice", 5))
        .settle()
        .await;
    assert_eq!(outcome.status(), TxStatus::Compensated, "{outcome:?}");
    // Let the late action arrive.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let log = w.faults.call_log();
    let comp = log.iter().find(|c| c.action == Action::Compensate).unwrap();
    assert_eq!(
        comp.answer.as_ref().unwrap().detail(),
        OutcomeDetail::EmptyRollback
    );
    let action = log.iter().find(|c| c.action == Action::Action).unwrap();
    assert_eq!(
        action.answer.as_ref().unwrap().detail(),
        OutcomeDetail::Suspended,
        "{action:?}"
    );
    assert_eq!(w.effects("overtaken", "s1", "action").await, 0);
    assert_eq!(w.effects("overtaken", "s1", "compensate").await, 0);
    assert_eq!(w.account("alice").await, (START, 0));
}
test_on_all_databases!(a_compensation_that_overtakes_its_action_blocks_it, SCHEMAS);

async fn definitions_are_validated_and_idempotent_under_their_xid<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let bank = w.bank.clone();
    let base = |xid: &str| w.client.saga().xid(xid).step(step("s1", &bank, "alice", 1));
    let invalid: Vec<(&str, SagaBuilder, &str)> = vec![
        ("empty", w.client.saga().xid("empty"), "at least one step"),
        (
            "dup",
            base("dup").step(step("s1", &bank, "bob", 1)),
            "used by two steps",
        ),
        (
            "unknown-dep",
            base("unknown-dep").step(step("s2", &bank, "bob", 1).after(["zz"])),
            "not a step",
        ),
        (
            "cycle",
            w.client
                .saga()
                .xid("cycle")
                .step(step("a", &bank, "alice", 1).after(["c"]))
                .step(step("b", &bank, "alice", 1).after(["a"]))
                .step(step("c", &bank, "alice", 1).after(["b"])),
            "cycle",
        ),
        (
            "too-many",
            (0..65).fold(w.client.saga().xid("too-many"), |s, i| {
                s.step(step(&format!("s{i}"), &bank, "alice", 1))
            }),
            "limit of 64",
        ),
    ];
    for (xid, saga, needle) in invalid {
        let err = saga
            .submit()
            .await
            .err()
            .unwrap_or_else(|| panic!("{xid} accepted"));
        let Error::Rpc(status) = err else {
            panic!("{xid}: {err}")
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{xid}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{xid}: {}",
            status.message()
        );
        let Error::Rpc(missing) = w.client.get(xid).await.unwrap_err() else {
            panic!()
        };
        assert_eq!(missing.code(), Code::NotFound, "{xid}: nothing stored");
    }
    // The same definition twice: one saga, one effect. A different one: ALREADY_EXISTS.
    base("same").settle().await;
    let again = base("same").settle().await;
    assert!(again.succeeded());
    assert_eq!(w.effects("same", "s1", "action").await, 1);
    let different = w
        .client
        .saga()
        .xid("same")
        .step(step("s1", &bank, "alice", 2))
        .submit()
        .await;
    let Err(Error::Rpc(status)) = different else {
        panic!("{:?}", different.is_ok())
    };
    assert_eq!(status.code(), Code::AlreadyExists);
}
test_on_all_databases!(
    definitions_are_validated_and_idempotent_under_their_xid,
    SCHEMAS
);

async fn a_hundred_concurrent_sagas_with_random_failures<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    let mut rng_state: u64 = 0x5eed_1234_abcd_0001;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    let mut handles = Vec::new();
    for i in 0..100 {
        // About a third of the sagas have one step that is refused.
        let refuse = (next() % 3 == 0).then(|| (next() % 3) as usize);
        let mut saga = w.client.saga().xid(format!("many-{i}")).retry(fast_retry());
        for (k, account) in ["alice", "bob", "carol"].iter().enumerate() {
            let amount = if refuse == Some(k) { START * 10 } else { 1 };
            saga = saga.step(step(&format!("s{k}"), &w.bank, account, amount));
        }
        handles.push(tokio::spawn(async move { saga.settle().await }));
    }
    let mut succeeded = 0;
    for (i, h) in handles.into_iter().enumerate() {
        let outcome = h.await.unwrap();
        let xid = format!("many-{i}");
        match outcome.status() {
            TxStatus::Succeeded => {
                succeeded += 1;
                for s in ["s0", "s1", "s2"] {
                    assert_eq!(w.effects(&xid, s, "action").await, 1, "{xid} {s}");
                    assert_eq!(w.effects(&xid, s, "compensate").await, 0, "{xid} {s}");
                }
            }
            TxStatus::Compensated => {
                for s in ["s0", "s1", "s2"] {
                    let did = w.effects(&xid, s, "action").await;
                    assert_eq!(
                        w.effects(&xid, s, "compensate").await,
                        did,
                        "{xid} {s} nets to zero"
                    );
                }
            }
            other => panic!("{xid}: {other:?}"),
        }
    }
    assert!(succeeded > 30 && succeeded < 100, "{succeeded}");
    for account in ["alice", "bob", "carol"] {
        assert_eq!(
            w.account(account).await,
            (START - succeeded, 0),
            "{account}"
        );
    }
}
test_on_all_databases!(a_hundred_concurrent_sagas_with_random_failures, SCHEMAS);
