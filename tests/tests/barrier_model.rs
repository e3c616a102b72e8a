//! Property test: random sequences of branch calls (try/confirm/cancel on a TCC branch,
//! action/compensate on a saga step), with duplicates, reorderings, refusals and handler errors,
//! run through the real barrier and compared call by call with a small reference model - the
//! answer, the detail, the replayed result, and the business ledger afterwards. Each call
//! carries one of two requests; the model knows that phase two is one-way (Confirm and Cancel
//! of one branch exclude each other) and that a Try/Action repeated with the other request is a
//! conflict.

use std::sync::atomic::{AtomicUsize, Ordering};

use dtx_sdk::barrier::{Action, Answer, Detail, Reply};
use dtx_sql::Schema;
use dtx_tests::barrier::{call, effect};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::ledger;
use dtx_tests::participant::Behave;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// What the model knows about the forward action's barrier row.
#[derive(Debug, Clone, PartialEq)]
enum Forward {
    Absent,
    Ran {
        ok: bool,
        result: Vec<u8>,
        request: u8,
    },
    /// Claimed by a Cancel/Compensate that came first.
    Blocked,
}

#[derive(Debug, Clone)]
struct Branch {
    forward: Forward,
    /// The TCC decision that holds the phase-two slot.
    decided: Option<Action>,
    undone: bool,
}

#[derive(Debug)]
struct Model {
    tcc: Branch,
    saga: Branch,
    balance: i64,
    held: i64,
}

type Expected = Result<(bool, Detail, Option<Vec<u8>>), ()>;

impl Model {
    fn new() -> Self {
        let fresh = Branch {
            forward: Forward::Absent,
            decided: None,
            undone: false,
        };
        Model {
            tcc: fresh.clone(),
            saga: fresh,
            balance: 0,
            held: 0,
        }
    }

    fn apply(&mut self, action: Action) {
        let (balance, held) = effect(action);
        self.balance += balance;
        self.held += held;
    }

    fn step(&mut self, action: Action, behave: Behave, tag: &str, request: u8) -> Expected {
        let is_tcc = matches!(action, Action::Try | Action::Confirm | Action::Cancel);
        let mut branch = if is_tcc {
            self.tcc.clone()
        } else {
            self.saga.clone()
        };
        let expected = match action {
            Action::CheckBack | Action::Message => unreachable!("the model draws branch calls"),
            Action::Try | Action::Action => match &branch.forward {
                Forward::Absent => match behave {
                    Behave::Ok => {
                        let result = format!("{action}:{tag}").into_bytes();
                        branch.forward = Forward::Ran {
                            ok: true,
                            result: result.clone(),
                            request,
                        };
                        self.apply(action);
                        Ok((true, Detail::Executed, Some(result)))
                    }
                    Behave::Refuse => {
                        let result = format!("refused:{tag}").into_bytes();
                        branch.forward = Forward::Ran {
                            ok: false,
                            result: result.clone(),
                            request,
                        };
                        Ok((false, Detail::Executed, Some(result)))
                    }
                    Behave::Error => Err(()),
                },
                Forward::Ran { request: first, .. } if *first != request => {
                    Ok((false, Detail::Conflict, None))
                }
                Forward::Ran { ok, result, .. } => {
                    Ok((*ok, Detail::Duplicate, Some(result.clone())))
                }
                Forward::Blocked => Ok((false, Detail::Suspended, None)),
            },
            Action::Confirm => {
                if branch.decided == Some(Action::Confirm) {
                    Ok((true, Detail::Duplicate, None))
                } else if branch.decided == Some(Action::Cancel) {
                    Ok((false, Detail::Conflict, None))
                } else if !matches!(branch.forward, Forward::Ran { ok: true, .. }) {
                    Ok((false, Detail::OutOfOrder, None))
                } else {
                    match behave {
                        Behave::Ok => {
                            branch.decided = Some(Action::Confirm);
                            self.apply(action);
                            Ok((true, Detail::Executed, None))
                        }
                        Behave::Refuse => Ok((false, Detail::Executed, None)),
                        Behave::Error => Err(()),
                    }
                }
            }
            Action::Cancel if branch.decided == Some(Action::Confirm) => {
                Ok((false, Detail::Conflict, None))
            }
            Action::Cancel | Action::Compensate => match (&branch.forward, branch.undone) {
                (Forward::Absent, _) => {
                    branch.forward = Forward::Blocked;
                    branch.undone = true;
                    Ok((true, Detail::EmptyRollback, None))
                }
                (_, true) => Ok((true, Detail::Duplicate, None)),
                (Forward::Ran { ok: false, .. }, false) => {
                    branch.undone = true;
                    Ok((true, Detail::NothingToUndo, None))
                }
                (Forward::Ran { ok: true, .. }, false) => match behave {
                    Behave::Ok => {
                        branch.undone = true;
                        self.apply(action);
                        Ok((true, Detail::Executed, None))
                    }
                    Behave::Refuse => Ok((false, Detail::Executed, None)),
                    Behave::Error => Err(()),
                },
                (Forward::Blocked, false) => unreachable!("a blocked row is written with its undo"),
            },
        };
        if action == Action::Cancel && branch.undone {
            branch.decided = Some(Action::Cancel);
        }
        if is_tcc {
            self.tcc = branch;
        } else {
            self.saga = branch;
        }
        expected
    }
}

fn call_strategy() -> impl Strategy<Value = (Action, Behave, u8)> {
    let action = prop_oneof![
        Just(Action::Try),
        Just(Action::Confirm),
        Just(Action::Cancel),
        Just(Action::Action),
        Just(Action::Compensate),
    ];
    // Mostly well-behaved handlers, so sequences get past the first call.
    let behave =
        prop_oneof![6 => Just(Behave::Ok), 1 => Just(Behave::Refuse), 1 => Just(Behave::Error)];
    // Mostly the first request, so repeats are mostly true repeats.
    let request = prop_oneof![4 => Just(0u8), 1 => Just(1u8)];
    (action, behave, request)
}

fn observed(answer: &Result<Answer, dtx_sdk::Error>) -> Result<(bool, Detail, Vec<u8>), ()> {
    match answer {
        Ok(a) => {
            let (ok, bytes) = match &a.reply {
                Reply::Success(b) => (true, b.clone()),
                Reply::Failure(b) => (false, b.clone()),
            };
            Ok((ok, a.detail, bytes))
        }
        Err(_) => Err(()),
    }
}

async fn check<DB: TestBackend>(
    db: &TestDb<DB>,
    xid: &str,
    calls: Vec<(Action, Behave, u8)>,
) -> Result<(), TestCaseError> {
    let (start_balance, start_held) = ledger::account(&db.pool, "acct").await;
    let mut model = Model::new();
    for (i, (action, behave, request)) in calls.iter().copied().enumerate() {
        let branch = if matches!(action, Action::Try | Action::Confirm | Action::Cancel) {
            "tcc"
        } else {
            "saga"
        };
        let tag = i.to_string();
        let expected = model.step(action, behave, &tag, request);
        let body = [b'r', request];
        let answer = call(&db.pool, xid, branch, action, behave, &tag, Some(&body)).await;
        let got = observed(&answer);
        match (&expected, &got) {
            (Err(()), Err(())) => {}
            (Ok((ok, detail, result)), Ok((got_ok, got_detail, got_result))) => {
                prop_assert_eq!(
                    (ok, detail),
                    (got_ok, got_detail),
                    "call {} {:?} {:?}",
                    i,
                    action,
                    behave
                );
                if let Some(result) = result {
                    prop_assert_eq!(result, got_result, "call {} result", i);
                }
            }
            _ => prop_assert!(
                false,
                "call {i} {action:?} {behave:?}: model {expected:?}, barrier {answer:?}"
            ),
        }
    }
    let (balance, held) = ledger::account(&db.pool, "acct").await;
    prop_assert_eq!(
        (balance - start_balance, held - start_held),
        (model.balance, model.held),
        "ledger after {:?}",
        calls
    );
    Ok(())
}

fn run_model<DB: TestBackend>(cases: u32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = rt.block_on(TestDb::<DB>::create(&[Schema::Barrier])) else {
        return;
    };
    rt.block_on(async {
        ledger::create_tables(&db.pool).await;
        ledger::open_account(&db.pool, "acct", 1_000_000).await;
    });
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(call_strategy(), 1..14), |calls| {
        let xid = format!("model-{}", case.fetch_add(1, Ordering::Relaxed));
        rt.block_on(check(&db, &xid, calls))
    });
    rt.block_on(db.drop_database());
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn sqlite() {
    run_model::<dtx_sql::sqlx::Sqlite>(256);
}

#[test]
fn postgres() {
    run_model::<dtx_sql::sqlx::Postgres>(96);
}

#[test]
fn mariadb() {
    run_model::<dtx_sql::sqlx::MySql>(96);
}
