//! Two-phase messages at the initiator's barrier, on SQLite, PostgreSQL and MariaDB: the local
//! transaction takes the message's slot next to its business change; the coordinator's
//! check-back takes it when the local transaction did not commit. Whatever the timing, the
//! check-back says "deliver" exactly when the business change committed, and a local
//! transaction that lost the race cannot commit.

use std::time::Duration;

use dtx_proto::v1::{BranchAction, BranchRequest, Outcome, OutcomeDetail};
use dtx_sdk::Error;
use dtx_sdk::barrier::{self, MESSAGE_BRANCH, Prepared};
use dtx_sdk::server::ParticipantServer;
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{create_tables, insert_order, orders_for};
use dtx_tests::test_on_all_databases;

const SCHEMAS: &[Schema] = &[Schema::Barrier];

/// The local transaction of message `xid`: an order and the message's slot, committed unless a
/// check-back took the slot first (then rolled back). True if it committed. `hold` keeps the
/// transaction open that long before committing.
async fn local_transaction<DB: TestBackend>(
    db: &TestDb<DB>,
    xid: &str,
    hold: Duration,
) -> Result<bool, Error> {
    let mut tx = DB::begin(&db.pool).await?;
    insert_order(DB::conn(&mut tx), xid, 10).await?;
    match barrier::prepare_message(DB::conn(&mut tx), xid).await {
        Ok(Prepared::Fresh) => {}
        Ok(Prepared::AlreadyCommitted) => panic!("{xid} was committed before"),
        Err(Error::MessageDropped { .. }) => {
            tx.rollback().await?;
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    tokio::time::sleep(hold).await;
    tx.commit().await?;
    Ok(true)
}

/// The coordinator's check-back as the participant server answers it (gRPC handling without
/// the network): SUCCESS is "deliver".
async fn check_back<DB: TestBackend>(server: &ParticipantServer<DB>, xid: &str) -> (bool, i32) {
    let answer = server
        .handle(BranchRequest {
            xid: xid.into(),
            branch_id: MESSAGE_BRANCH.into(),
            action: BranchAction::CheckBack as i32,
            handler: "orders".into(),
            ..Default::default()
        })
        .await
        .expect("a check-back is answered");
    assert_ne!(answer.outcome(), Outcome::Retry, "{answer:?}");
    (answer.outcome() == Outcome::Success, answer.detail)
}

fn server<DB: TestBackend>(db: &TestDb<DB>) -> ParticipantServer<DB> {
    ParticipantServer::new(db.pool.clone()).message_check_back("orders")
}

async fn a_committed_message_is_delivered_and_not_run_twice<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    create_tables(&db.pool).await;
    let server = server(db);
    assert!(local_transaction(db, "m-1", Duration::ZERO).await.unwrap());
    assert_eq!(
        check_back(&server, "m-1").await,
        (true, OutcomeDetail::Duplicate as i32)
    );
    assert!(check_back(&server, "m-1").await.0, "a repeat agrees");
    // The initiator runs again (say, after a crash before submitting): the business is done.
    let mut tx = DB::begin(&db.pool).await.unwrap();
    let again = barrier::prepare_message(DB::conn(&mut tx), "m-1").await;
    assert_eq!(again.unwrap(), Prepared::AlreadyCommitted);
    tx.rollback().await.unwrap();
    assert_eq!(orders_for(&db.pool, "m-1").await, 1);
}
test_on_all_databases!(a_committed_message_is_delivered_and_not_run_twice, SCHEMAS);

async fn a_check_back_first_drops_the_message_and_the_late_commit<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    create_tables(&db.pool).await;
    let server = server(db);
    assert_eq!(
        check_back(&server, "m-2").await,
        (false, OutcomeDetail::EmptyRollback as i32)
    );
    assert!(
        !local_transaction(db, "m-2", Duration::ZERO).await.unwrap(),
        "the late local transaction committed"
    );
    assert_eq!(orders_for(&db.pool, "m-2").await, 0);
    assert_eq!(
        check_back(&server, "m-2").await,
        (false, OutcomeDetail::Duplicate as i32)
    );
    // A check-back is no branch call: the barrier refuses to treat it as one.
    let mut tx = DB::begin(&db.pool).await.unwrap();
    let key = barrier::BranchKey::new("m-2", MESSAGE_BRANCH, barrier::Action::CheckBack).unwrap();
    let misuse = barrier::call(DB::conn(&mut tx), key, |_| {
        Box::pin(async { Ok(barrier::Reply::ok()) })
    })
    .await;
    assert!(matches!(misuse, Err(Error::Barrier(_))), "{misuse:?}");
    tx.rollback().await.unwrap();
}
test_on_all_databases!(
    a_check_back_first_drops_the_message_and_the_late_commit,
    SCHEMAS
);

/// Many rounds of a local transaction racing its check-back, each side starting at a random
/// moment within a few milliseconds: delivered exactly when the order committed, never both
/// ways, never a committed order without delivery.
async fn a_local_transaction_racing_its_check_back_is_never_a_guess<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    create_tables(&db.pool).await;
    let server = std::sync::Arc::new(server(db));
    let (mut delivered, mut dropped) = (0, 0);
    for round in 0..60u64 {
        let xid = format!("race-{round}");
        let (local_start, check_start, hold) = (
            Duration::from_micros((round * 7919) % 4000),
            Duration::from_micros((round * 104_729) % 4000),
            Duration::from_micros((round * 1_299_709) % 3000),
        );
        let local = {
            let xid = xid.clone();
            tokio::spawn(async move {
                tokio::time::sleep(local_start).await;
                loop {
                    match local_transaction(db, &xid, hold).await {
                        Err(Error::Database(e)) if dtx_sql::is_lock_conflict(&e) => continue,
                        other => return other.expect("the local transaction"),
                    }
                }
            })
        };
        let checked = {
            let (server, xid) = (server.clone(), xid.clone());
            tokio::spawn(async move {
                tokio::time::sleep(check_start).await;
                check_back(&server, &xid).await.0
            })
        };
        let (committed, deliver) = (local.await.unwrap(), checked.await.unwrap());
        let orders = orders_for(&db.pool, &xid).await;
        assert_eq!(
            (committed, orders),
            (deliver, i64::from(deliver)),
            "round {round}: local transaction committed {committed}, check-back said deliver \
             {deliver}, {orders} order(s)"
        );
        assert_eq!(
            check_back(&server, &xid).await.0,
            deliver,
            "round {round}: a repeat"
        );
        if deliver {
            delivered += 1;
        } else {
            dropped += 1;
        }
    }
    // Both outcomes occur, or the race was not one.
    assert!(
        delivered > 0 && dropped > 0,
        "{delivered} delivered, {dropped} dropped"
    );
}
test_on_all_databases!(
    a_local_transaction_racing_its_check_back_is_never_a_guess,
    SCHEMAS
);
