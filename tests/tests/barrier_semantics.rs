//! The branch barrier's cases, each asserted through the business ledger (balances and the
//! effect log), on SQLite, PostgreSQL and MariaDB.
//!
//! The ledger: account `acct` starts at 100. Try holds 10 (balance 90, held 10), Confirm
//! releases the hold (held 0), Cancel returns it (balance 100, held 0); a saga Action takes 10,
//! its Compensate returns it.

use dtx_sdk::Error;
use dtx_sdk::barrier::{Action, Answer, Detail, Reply};
use dtx_sql::{Dialect, Schema};
use dtx_tests::barrier;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Behave, direct};
use dtx_tests::{ledger, test_on_all_databases};

const SCHEMAS: &[Schema] = &[Schema::Barrier];

async fn setup<DB: TestBackend>(db: &TestDb<DB>) {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "acct", 100).await;
}

/// One delivery through the barrier with the given behaviour; the call itself must succeed.
async fn run<DB: TestBackend>(
    db: &TestDb<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    behave: Behave,
    tag: &str,
) -> Answer {
    direct(&db.pool, xid, branch, action, behave, tag)
        .await
        .unwrap()
}

/// One delivery whose handler behaves; the call itself must succeed.
async fn ok<DB: TestBackend>(
    db: &TestDb<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    tag: &str,
) -> Answer {
    run(db, xid, branch, action, Behave::Ok, tag).await
}

/// One behaving delivery that carries a request body.
async fn call<DB: TestBackend>(
    db: &TestDb<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    tag: &str,
    request: Option<&[u8]>,
) -> Answer {
    barrier::call(&db.pool, xid, branch, action, Behave::Ok, tag, request)
        .await
        .unwrap()
}

/// The account's (balance, held).
async fn balance<DB: TestBackend>(db: &TestDb<DB>) -> (i64, i64) {
    ledger::account(&db.pool, "acct").await
}

fn text(reply: &Reply) -> String {
    match reply {
        Reply::Success(r) | Reply::Failure(r) => String::from_utf8_lossy(r).into_owned(),
    }
}

async fn duplicate_try_returns_the_stored_first_result<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    let first = ok(db, "x1", "b1", Action::Try, "first").await;
    assert_eq!(first.detail, Detail::Executed);
    assert_eq!(text(&first.reply), "try:first");
    // The repeat would produce "try:second" if its handler ran; it must not run.
    let again = ok(db, "x1", "b1", Action::Try, "second").await;
    assert_eq!(again.detail, Detail::Duplicate);
    assert_eq!(again.reply, Reply::Success(b"try:first".to_vec()));
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "try").await, 1);
    assert_eq!(balance(db).await, (90, 10));
}
test_on_all_databases!(duplicate_try_returns_the_stored_first_result, SCHEMAS);

async fn duplicate_confirm_and_cancel_have_no_effect<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    ok(db, "x1", "b1", Action::Try, "t").await;
    for i in 0..3 {
        let answer = ok(db, "x1", "b1", Action::Confirm, "c").await;
        assert!(answer.is_success());
        let expected = if i == 0 {
            Detail::Executed
        } else {
            Detail::Duplicate
        };
        assert_eq!(answer.detail, expected);
    }
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "confirm").await, 1);
    assert_eq!(balance(db).await, (90, 0));

    ok(db, "x2", "b1", Action::Try, "t").await;
    for _ in 0..3 {
        let answer = ok(db, "x2", "b1", Action::Cancel, "k").await;
        assert!(answer.is_success());
    }
    assert_eq!(ledger::effects(&db.pool, "x2", "b1", "cancel").await, 1);
    assert_eq!(balance(db).await, (90, 0));

    ok(db, "x3", "s1", Action::Action, "a").await;
    for _ in 0..3 {
        let answer = ok(db, "x3", "s1", Action::Compensate, "c").await;
        assert!(answer.is_success());
    }
    assert_eq!(ledger::effects(&db.pool, "x3", "s1", "compensate").await, 1);
    assert_eq!(balance(db).await, (90, 0));
}
test_on_all_databases!(duplicate_confirm_and_cancel_have_no_effect, SCHEMAS);

async fn cancel_before_try_is_an_empty_rollback_and_blocks_the_late_try<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    let cancel = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(cancel.detail, Detail::EmptyRollback);
    assert!(cancel.is_success());
    assert_eq!(
        ledger::effects(&db.pool, "x1", "b1", "cancel").await,
        0,
        "nothing to undo"
    );

    let late_try = ok(db, "x1", "b1", Action::Try, "t").await;
    assert_eq!(late_try.detail, Detail::Suspended);
    assert!(matches!(late_try.reply, Reply::Failure(_)));
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "try").await, 0);

    let again = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(again.detail, Detail::Duplicate);
    assert_eq!(balance(db).await, (100, 0));

    // The same for a saga step.
    let comp = ok(db, "x2", "s1", Action::Compensate, "c").await;
    assert_eq!(comp.detail, Detail::EmptyRollback);
    let late = ok(db, "x2", "s1", Action::Action, "a").await;
    assert_eq!(late.detail, Detail::Suspended);
    assert_eq!(ledger::effects(&db.pool, "x2", "s1", "action").await, 0);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(
    cancel_before_try_is_an_empty_rollback_and_blocks_the_late_try,
    SCHEMAS
);

async fn handler_error_rolls_back_business_change_and_barrier_row<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    let err = direct(&db.pool, "x1", "b1", Action::Try, Behave::Error, "boom")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Handler(_)), "{err}");
    assert_eq!(ledger::barrier_rows(&db.pool, "x1", "b1").await, 0);
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "try").await, 0);
    assert_eq!(balance(db).await, (100, 0));

    // The retry runs again.
    let retry = ok(db, "x1", "b1", Action::Try, "retry").await;
    assert_eq!(retry.detail, Detail::Executed);
    assert_eq!(balance(db).await, (90, 10));

    // A failing Cancel also leaves nothing, so it runs on the next delivery.
    direct(&db.pool, "x1", "b1", Action::Cancel, Behave::Error, "boom")
        .await
        .unwrap_err();
    assert_eq!(balance(db).await, (90, 10));
    let cancel = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(cancel.detail, Detail::Executed);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(
    handler_error_rolls_back_business_change_and_barrier_row,
    SCHEMAS
);

async fn refused_try_is_replayed_and_its_cancel_has_nothing_to_undo<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    let refused = run(db, "x1", "b1", Action::Try, Behave::Refuse, "no").await;
    assert_eq!(refused.detail, Detail::Executed);
    assert_eq!(refused.reply, Reply::Failure(b"refused:no".to_vec()));
    // The handler's change before refusing was undone.
    assert_eq!(balance(db).await, (100, 0));
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "try").await, 0);

    let again = ok(db, "x1", "b1", Action::Try, "yes").await;
    assert_eq!(again.detail, Detail::Duplicate);
    assert_eq!(again.reply, Reply::Failure(b"refused:no".to_vec()));

    let cancel = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(cancel.detail, Detail::NothingToUndo);
    assert_eq!(balance(db).await, (100, 0));
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "cancel").await, 0);
}
test_on_all_databases!(
    refused_try_is_replayed_and_its_cancel_has_nothing_to_undo,
    SCHEMAS
);

async fn refused_cancel_keeps_nothing_so_it_can_run_again<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    ok(db, "x1", "b1", Action::Try, "t").await;
    let refused = run(db, "x1", "b1", Action::Cancel, Behave::Refuse, "no").await;
    assert!(matches!(refused.reply, Reply::Failure(_)));
    assert_eq!(balance(db).await, (90, 10));
    assert_eq!(
        ledger::barrier_rows(&db.pool, "x1", "b1").await,
        1,
        "only the try row"
    );
    let cancel = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(cancel.detail, Detail::Executed);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(refused_cancel_keeps_nothing_so_it_can_run_again, SCHEMAS);

async fn confirm_without_a_successful_try_is_refused<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    let confirm = ok(db, "x1", "b1", Action::Confirm, "c").await;
    assert_eq!(confirm.detail, Detail::OutOfOrder);
    assert!(
        text(&confirm.reply).contains("never ran"),
        "{}",
        text(&confirm.reply)
    );
    assert_eq!(ledger::barrier_rows(&db.pool, "x1", "b1").await, 0);

    run(db, "x2", "b1", Action::Try, Behave::Refuse, "no").await;
    let confirm = ok(db, "x2", "b1", Action::Confirm, "c").await;
    assert_eq!(confirm.detail, Detail::OutOfOrder);
    assert_eq!(ledger::effects(&db.pool, "x2", "b1", "confirm").await, 0);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(confirm_without_a_successful_try_is_refused, SCHEMAS);

async fn ids_are_validated_before_touching_the_database<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    let long = "x".repeat(129);
    let err = direct(&db.pool, &long, "b1", Action::Try, Behave::Ok, "t")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("limit of 128 bytes"), "{err}");
    let err = direct(&db.pool, "x1", "bad id", Action::Try, Behave::Ok, "t")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("charset"), "{err}");
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(ids_are_validated_before_touching_the_database, SCHEMAS);

async fn ids_are_case_sensitive<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    ok(db, "X1", "b1", Action::Try, "upper").await;
    let lower = ok(db, "x1", "b1", Action::Try, "lower").await;
    assert_eq!(
        lower.detail,
        Detail::Executed,
        "x1 and X1 are different transactions"
    );
    assert_eq!(balance(db).await, (80, 20));
}
test_on_all_databases!(ids_are_case_sensitive, SCHEMAS);

fn conflict(answer: &Answer, needle: &str) {
    assert_eq!(answer.detail, Detail::Conflict, "{answer:?}");
    assert!(matches!(answer.reply, Reply::Failure(_)), "{answer:?}");
    assert!(
        text(&answer.reply).contains(needle),
        "{}",
        text(&answer.reply)
    );
}

async fn cancel_after_confirm_is_a_conflict_and_runs_nothing<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    ok(db, "x1", "b1", Action::Try, "t").await;
    ok(db, "x1", "b1", Action::Confirm, "c").await;
    for _ in 0..2 {
        let cancel = ok(db, "x1", "b1", Action::Cancel, "k").await;
        conflict(
            &cancel,
            "cancel refused: branch x1/b1 was already confirmed",
        );
    }
    // Repeats of the op that ran stay quiet successes, before and after a conflict.
    let again = ok(db, "x1", "b1", Action::Confirm, "c").await;
    assert_eq!(
        (again.is_success(), again.detail),
        (true, Detail::Duplicate)
    );
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "cancel").await, 0);
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "confirm").await, 1);
    assert_eq!(balance(db).await, (90, 0));

    // A saga's compensation after its action is the normal path, not a conflict.
    ok(db, "x2", "s1", Action::Action, "a").await;
    let comp = ok(db, "x2", "s1", Action::Compensate, "c").await;
    assert_eq!((comp.is_success(), comp.detail), (true, Detail::Executed));
    assert_eq!(balance(db).await, (90, 0));
}
test_on_all_databases!(cancel_after_confirm_is_a_conflict_and_runs_nothing, SCHEMAS);

async fn confirm_after_cancel_is_a_conflict_and_runs_nothing<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    ok(db, "x1", "b1", Action::Try, "t").await;
    ok(db, "x1", "b1", Action::Cancel, "k").await;
    let confirm = ok(db, "x1", "b1", Action::Confirm, "c").await;
    conflict(
        &confirm,
        "confirm refused: branch x1/b1 was already cancelled",
    );
    let again = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(
        (again.is_success(), again.detail),
        (true, Detail::Duplicate)
    );
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "confirm").await, 0);
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "cancel").await, 1);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(confirm_after_cancel_is_a_conflict_and_runs_nothing, SCHEMAS);

async fn confirm_after_an_empty_rollback_is_a_conflict<DB: TestBackend>(db: &'static TestDb<DB>) {
    setup(db).await;
    let empty = ok(db, "x1", "b1", Action::Cancel, "k").await;
    assert_eq!(empty.detail, Detail::EmptyRollback);
    let confirm = ok(db, "x1", "b1", Action::Confirm, "c").await;
    conflict(
        &confirm,
        "confirm refused: branch x1/b1 was already cancelled",
    );
    // The same after a Cancel of a refused Try (nothing to undo, but decided).
    run(db, "x2", "b1", Action::Try, Behave::Refuse, "no").await;
    ok(db, "x2", "b1", Action::Cancel, "k").await;
    let confirm = ok(db, "x2", "b1", Action::Confirm, "c").await;
    conflict(
        &confirm,
        "confirm refused: branch x2/b1 was already cancelled",
    );
    assert_eq!(ledger::effects(&db.pool, "x1", "b1", "confirm").await, 0);
    assert_eq!(ledger::effects(&db.pool, "x2", "b1", "confirm").await, 0);
    assert_eq!(balance(db).await, (100, 0));
}
test_on_all_databases!(confirm_after_an_empty_rollback_is_a_conflict, SCHEMAS);

async fn a_try_repeated_with_another_request_is_a_conflict<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    for (xid, branch, action) in [("x1", "b1", Action::Try), ("x2", "s1", Action::Action)] {
        let first = call(db, xid, branch, action, "1", Some(b"a")).await;
        assert_eq!(first.detail, Detail::Executed);
        let other = call(db, xid, branch, action, "2", Some(b"b")).await;
        conflict(
            &other,
            &format!("{action} refused: branch {xid}/{branch} was tried with a different request"),
        );
        let same = call(db, xid, branch, action, "3", Some(b"a")).await;
        assert_eq!(same.detail, Detail::Duplicate);
        assert_eq!(
            same.reply,
            Reply::Success(format!("{action}:1").into_bytes())
        );
        assert_eq!(
            ledger::effects(&db.pool, xid, branch, action.as_str()).await,
            1
        );
    }
    assert_eq!(balance(db).await, (80, 10));
}
test_on_all_databases!(a_try_repeated_with_another_request_is_a_conflict, SCHEMAS);

/// A database the old barrier wrote (schema 0001 only, its rows without a request hash) is
/// migrated: its Try rows answer any repeat unchecked, its decided branches stay decided.
async fn rows_from_before_the_migration_are_accepted_and_stay_decided<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    setup(db).await;
    let v1 = match <DB as TestBackend>::DIALECT {
        Dialect::Postgres => include_str!("../../migrations/postgres/barrier/0001_barrier.sql"),
        Dialect::MySql => include_str!("../../migrations/mysql/barrier/0001_barrier.sql"),
        Dialect::Sqlite => include_str!("../../migrations/sqlite/barrier/0001_barrier.sql"),
    };
    DB::execute_script(&db.pool, v1.to_string()).await.unwrap();
    // What the old barrier left: a Try (x1), a confirmed branch (x2), a cancelled one (x3).
    DB::execute_script(
        &db.pool,
        "INSERT INTO dtx_barrier (xid, branch_id, action, written_by, outcome, result, created_ms) \
         VALUES ('x1', 'b1', 'try', 'try', 'success', NULL, 1), \
                ('x2', 'b1', 'try', 'try', 'success', NULL, 1), \
                ('x2', 'b1', 'confirm', 'confirm', 'success', NULL, 2), \
                ('x3', 'b1', 'try', 'try', 'success', NULL, 1), \
                ('x3', 'b1', 'cancel', 'cancel', 'success', NULL, 2)"
            .to_string(),
    )
    .await
    .unwrap();
    DB::migrate(&db.pool, Schema::Barrier).await.unwrap();

    let repeat = call(db, "x1", "b1", Action::Try, "r", Some(b"any")).await;
    assert_eq!(
        (repeat.is_success(), repeat.detail),
        (true, Detail::Duplicate)
    );
    let cancel = ok(db, "x2", "b1", Action::Cancel, "k").await;
    conflict(
        &cancel,
        "cancel refused: branch x2/b1 was already confirmed",
    );
    let confirm = ok(db, "x3", "b1", Action::Confirm, "c").await;
    conflict(
        &confirm,
        "confirm refused: branch x3/b1 was already cancelled",
    );

    // A row written without a request (hash NULL) by today's barrier is accepted the same way.
    ok(db, "x4", "b1", Action::Try, "t").await;
    let repeat = call(db, "x4", "b1", Action::Try, "r", Some(b"b")).await;
    assert_eq!(repeat.detail, Detail::Duplicate);
    assert_eq!(balance(db).await, (90, 10));
}
test_on_all_databases!(
    rows_from_before_the_migration_are_accepted_and_stay_decided,
    &[]
);
