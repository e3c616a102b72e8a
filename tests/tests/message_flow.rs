//! Two-phase messages end to end on SQLite, PostgreSQL and MariaDB: an order service (the
//! bank, which serves its own check-backs) commits an order together with the message's
//! barrier row, and the coordinator credits bob and then carol - exactly when the order
//! committed, each credit once, whatever the initiator, the check-back or the delivery target
//! do meanwhile.

use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::Error;
use dtx_sdk::barrier::{self, Action, Prepared};
use dtx_sdk::client::{Committed, MessageBuilder};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{create_tables, insert_order, orders_for};
use dtx_tests::participant::Fault;
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World, order_message};
use futures::future::BoxFuture;

fn message<DB: TestBackend>(w: &World<DB>, xid: &str) -> MessageBuilder {
    order_message(&w.client, &w.bank, xid)
}

/// The order's business change, as `do_and_submit` runs it in the local transaction.
fn order<C: dtx_sql::Conn>(
    xid: &str,
) -> impl for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<String, Error>> + use<C> {
    let xid = xid.to_string();
    move |conn| Box::pin(async move { Ok(insert_order(conn, &xid, 10).await?) })
}

/// The order's local transaction as an initiator runs it by hand: the order and the message's
/// barrier row; committed if `commit`, else rolled back (the process "died" before its commit).
async fn local_transaction<DB: TestBackend>(
    w: &World<DB>,
    branch_xid: &str,
    xid: &str,
    commit: bool,
) -> Result<(), Error> {
    let mut tx = DB::begin(&w.db.pool).await?;
    let prepared = barrier::prepare_message(DB::conn(&mut tx), branch_xid).await?;
    assert_eq!(prepared, Prepared::Fresh);
    insert_order(DB::conn(&mut tx), xid, 10).await?;
    if commit {
        tx.commit().await?;
    }
    Ok(())
}

async fn a_committed_order_delivers_each_branch_once<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    let ran = message(&w, "m-1")
        .do_and_submit(&db.pool, order("m-1"))
        .await;
    assert!(matches!(ran, Ok(Committed::Now(_))), "{ran:?}");
    w.assert_order_delivered("m-1").await;
    assert_eq!(w.account("bob").await.0, START + 5);
    assert_eq!(w.account("carol").await.0, START + 7);
    // The initiator runs again (say, its request was retried): the order is not made twice.
    let again = message(&w, "m-1")
        .do_and_submit(&db.pool, order("m-1"))
        .await;
    assert!(matches!(again, Ok(Committed::Earlier)), "{again:?}");
    w.assert_order_delivered("m-1").await;
}

async fn a_local_error_drops_the_message<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    let failed = message(&w, "m-2")
        .do_and_submit(&db.pool, |conn: &mut DB::Conn| {
            Box::pin(async move {
                insert_order(conn, "m-2", 10).await?;
                Err::<(), _>(Error::Barrier("out of stock".into()))
            })
        })
        .await;
    assert!(matches!(failed, Err(Error::Barrier(_))), "{failed:?}");
    w.assert_order_dropped("m-2").await;
    // A submit after the abort is refused: it contradicts the recorded decision.
    let prepared = message(&w, "m-2").prepare().await.unwrap();
    let refused = prepared.submit().await.unwrap_err();
    assert!(
        matches!(&refused, Error::Rpc(s) if s.code() == tonic::Code::Aborted && s.message().contains("dropped")),
        "{refused:?}"
    );
}

async fn a_silent_initiator_is_checked_back<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    // Committed, then silent (never submitted): the check-back finds the commit and delivers.
    let committed = message(&w, "m-3").prepare().await.unwrap();
    local_transaction(&w, committed.branch_xid(), "m-3", true)
        .await
        .unwrap();
    w.assert_order_delivered("m-3").await;
    let history = w.history("m-3").await;
    assert!(
        history.contains("check-back: the local transaction committed"),
        "{history}"
    );

    // Rolled back, then silent: the check-back drops it, and a late local transaction can no
    // longer commit the message's row.
    let rolled_back = message(&w, "m-4").prepare().await.unwrap();
    local_transaction(&w, rolled_back.branch_xid(), "m-4", false)
        .await
        .unwrap();
    w.assert_order_dropped("m-4").await;
    let late = local_transaction(&w, rolled_back.branch_xid(), "m-4", true).await;
    assert!(
        matches!(late, Err(Error::MessageDropped { .. })),
        "{late:?}"
    );
    assert_eq!(orders_for(&db.pool, "m-4").await, 0);
}

async fn a_check_back_without_an_answer_is_asked_again<DB: TestBackend>(db: &'static TestDb<DB>) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    // Statuses prove nothing, whatever their code: never read as "not committed".
    let unanswered = [
        Fault::UnavailableBefore,
        Fault::Status {
            how: dtx_tests::participant::StatusAnswer::Unimplemented,
            after: false,
        },
        Fault::UnavailableBefore,
    ];
    w.faults
        .push(barrier::MESSAGE_BRANCH, Action::CheckBack, unanswered);
    let prepared = message(&w, "m-5").prepare().await.unwrap();
    local_transaction(&w, prepared.branch_xid(), "m-5", true)
        .await
        .unwrap();
    w.assert_order_delivered("m-5").await;
    assert!(w.faults.calls(barrier::MESSAGE_BRANCH, Action::CheckBack) >= 4);
    let history = w.history("m-5").await;
    assert!(history.contains("Unavailable"), "{history}");
}

async fn a_delivery_target_that_is_down_for_a_while_gets_it_later<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    create_tables(&db.pool).await;
    let down = [
        Fault::UnavailableBefore,
        Fault::UnavailableBefore,
        Fault::UnavailableAfter,
    ];
    w.faults.push("credit-bob", Action::Action, down);
    message(&w, "m-6")
        .do_and_submit(&db.pool, order("m-6"))
        .await
        .unwrap();
    w.assert_order_delivered("m-6").await;
    let tx = w.settled("m-6").await;
    assert_eq!(tx.branches[0].attempts, 4, "{tx:?}");
    // carol's credit waited for bob's.
    assert_eq!(w.faults.calls("credit-carol", Action::Action), 1);
}

/// The local transaction racing its check-back, many times: the check-back is due at once
/// while the local transaction holds the message's row for a random while before it commits
/// (or rolls back). Either delivered with the order or dropped without it - never both, never
/// an order without its delivery.
async fn the_local_transaction_racing_the_check_back_is_never_split<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &["--poll", "20ms"]).await;
    create_tables(&db.pool).await;
    let (mut delivered, mut dropped) = (0, 0);
    for round in 0..12 {
        let xid = format!("race-{round}");
        let prepared = message(&w, &xid)
            .check_back_after(Duration::from_millis(1))
            .prepare()
            .await
            .unwrap();
        let hold = Duration::from_millis(rand::random_range(0..60));
        let commit = round % 4 != 3;
        let local = async {
            let mut tx = DB::begin(&w.db.pool).await?;
            barrier::prepare_message(DB::conn(&mut tx), prepared.branch_xid()).await?;
            insert_order(DB::conn(&mut tx), &xid, 10).await?;
            tokio::time::sleep(hold).await;
            if commit {
                tx.commit().await?;
            }
            Ok::<_, Error>(())
        };
        let committed = match local.await {
            Ok(()) => commit,
            Err(Error::MessageDropped { .. }) => false,
            Err(e) => panic!("{xid}: {e}"),
        };
        if committed {
            prepared.submit().await.ok();
        }
        let tx = w.settled(&xid).await;
        match tx.status() {
            TxStatus::Committed => {
                assert!(committed, "{xid}: delivered without its order");
                w.assert_order_delivered(&xid).await;
                delivered += 1;
            }
            TxStatus::RolledBack => {
                assert!(
                    !committed,
                    "{xid}: the order committed, the message was dropped"
                );
                w.assert_order_dropped(&xid).await;
                dropped += 1;
            }
            other => panic!("{xid} ended {other:?}"),
        }
    }
    assert!(
        delivered > 0 && dropped > 0,
        "{delivered} delivered, {dropped} dropped"
    );
}

test_on_all_databases!(a_committed_order_delivers_each_branch_once, SCHEMAS);
test_on_all_databases!(a_local_error_drops_the_message, SCHEMAS);
test_on_all_databases!(a_silent_initiator_is_checked_back, SCHEMAS);
test_on_all_databases!(a_check_back_without_an_answer_is_asked_again, SCHEMAS);
test_on_all_databases!(
    a_delivery_target_that_is_down_for_a_while_gets_it_later,
    SCHEMAS
);
test_on_all_databases!(
    the_local_transaction_racing_the_check_back_is_never_split,
    SCHEMAS
);
