//! Forward-only transitions (`dtx-state`) on SQLite, PostgreSQL and MariaDB: every kind of event
//! gets its answer (moved, a repeat by the same fact, a late event, a conflict with the current
//! state), and in many rounds of the same events delivered out of order, repeated and at once -
//! each retried while it cannot apply yet, as a provider retries - no order ever moves
//! backwards (a watcher reads it throughout), no forward move is lost, and each state is
//! entered exactly once.

use std::time::Duration;

use dtx_sql::{Backend, Schema, SqlRow};
use dtx_state::{EntityId, Error, Outcome};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::shop::{self, PATH};
use dtx_tests::test_on_all_databases;

const SCHEMAS: &[Schema] = &[Schema::Transitions];

async fn apply<DB: Backend>(
    db: &TestDb<DB>,
    id: &str,
    to: &str,
    fact: Option<&str>,
) -> Result<Outcome, Error> {
    let mut tx = DB::begin(&db.pool).await.unwrap();
    let outcome = shop::orders()
        .apply(DB::conn(&mut tx), &EntityId::from(id), to, fact)
        .await;
    tx.commit().await.unwrap();
    outcome
}

async fn every_event_gets_its_answer<DB: TestBackend>(db: &'static TestDb<DB>) {
    shop::create_table(&db.pool).await;
    shop::place(&db.pool, "o1", 1999, "WAIT_PAY").await;
    let moved = |from: &str, version| Outcome::Moved {
        from: from.into(),
        version,
    };
    assert_eq!(
        apply(db, "o1", "PAID", Some("T1")).await.unwrap(),
        moved("WAIT_PAY", 1)
    );
    assert_eq!(
        apply(db, "o1", "PAID", Some("T1")).await.unwrap(),
        Outcome::AlreadyThere
    );
    assert_eq!(
        apply(db, "o1", "PAID", None).await.unwrap(),
        Outcome::AlreadyThere
    );
    let other_trade = apply(db, "o1", "PAID", Some("T2")).await.unwrap();
    assert!(
        matches!(&other_trade, Outcome::Conflict { current, reason }
            if current == "PAID" && reason.contains("\"T1\"")),
        "{other_trade:?}"
    );
    assert_eq!(
        apply(db, "o1", "SHIPPED", None).await.unwrap(),
        moved("PAID", 2)
    );
    assert_eq!(
        apply(db, "o1", "PAID", Some("T1")).await.unwrap(),
        Outcome::Stale {
            current: "SHIPPED".into()
        },
        "a late repeat of the payment"
    );
    assert!(
        matches!(
            apply(db, "o1", "PAID", Some("T2")).await.unwrap(),
            Outcome::Conflict { .. }
        ),
        "a second payment for a shipped order is no late event"
    );
    let closed = apply(db, "o1", "CLOSED", None).await.unwrap();
    assert!(
        matches!(&closed, Outcome::Conflict { current, reason }
            if current == "SHIPPED" && reason.contains("no transition from SHIPPED to CLOSED")),
        "{closed:?}"
    );
    assert_eq!(shop::state(&db.pool, "o1").await, ("SHIPPED".into(), 2));

    // Not reachable yet: an event ahead of its predecessor.
    shop::place(&db.pool, "o2", 500, "WAIT_PAY").await;
    let early = apply(db, "o2", "DELIVERED", None).await.unwrap();
    assert!(matches!(early, Outcome::Conflict { .. }), "{early:?}");
    // A move in a transaction that rolls back leaves neither the state nor the log.
    let mut tx = DB::begin(&db.pool).await.unwrap();
    let orders = shop::orders();
    let id = EntityId::from("o2");
    orders
        .apply(DB::conn(&mut tx), &id, "PAID", Some("T5"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(shop::state(&db.pool, "o2").await, ("WAIT_PAY".into(), 0));
    assert_eq!(
        apply(db, "o2", "PAID", Some("T6")).await.unwrap(),
        moved("WAIT_PAY", 1)
    );

    // Mistakes say what they are.
    let unknown = apply(db, "o2", "LOST", None).await.unwrap_err();
    assert!(matches!(unknown, Error::UnknownState { .. }), "{unknown}");
    let missing = apply(db, "o9", "PAID", None).await.unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
    let long = "f".repeat(256);
    let too_long = apply(db, "o2", "SHIPPED", Some(&long)).await.unwrap_err();
    assert!(too_long.to_string().contains("255"), "{too_long}");
    assert_eq!(shop::state(&db.pool, "o2").await, ("PAID".into(), 1));
}

/// One round's events: the payment three times, the shipment and the delivery twice each.
fn events() -> Vec<(&'static str, Option<&'static str>)> {
    let mut events = vec![("PAID", Some("T1")); 3];
    events.extend([("SHIPPED", None); 2]);
    events.extend([("DELIVERED", None); 2]);
    events
}

async fn out_of_order_concurrent_events_never_move_an_order_back<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    shop::create_table(&db.pool).await;
    let rank = |state: &str| PATH.iter().position(|s| *s == state).expect("a path state");
    for round in 0..25 {
        let id = format!("r{round}");
        shop::place(&db.pool, &id, 100, "WAIT_PAY").await;
        let mut events = events();
        // A different order each round.
        for i in (1..events.len()).rev() {
            events.swap(i, rand::random_range(0..=i));
        }
        let watcher = {
            let id = id.clone();
            tokio::spawn(async move {
                let mut highest = 0;
                loop {
                    let (state, _) = shop::state(&db.pool, &id).await;
                    let now = rank(&state);
                    assert!(
                        now >= highest,
                        "{id} went back from {} to {state}",
                        PATH[highest]
                    );
                    highest = now;
                    if state == "DELIVERED" {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        let senders: Vec<_> = events
            .into_iter()
            .map(|(to, fact)| {
                let id = id.clone();
                tokio::spawn(async move {
                    // Retried while it cannot apply yet (its predecessor has not arrived).
                    for _ in 0..2000 {
                        match apply(db, &id, to, fact).await.unwrap() {
                            Outcome::Conflict { .. } => {
                                tokio::time::sleep(Duration::from_millis(2)).await
                            }
                            done => return done,
                        }
                    }
                    panic!("{id}: {to} never applied");
                })
            })
            .collect();
        let mut moved = Vec::new();
        for sender in senders {
            if let Outcome::Moved { from, .. } = sender.await.unwrap() {
                moved.push(from);
            }
        }
        tokio::time::timeout(Duration::from_secs(30), watcher)
            .await
            .expect("the watcher saw DELIVERED")
            .unwrap();
        moved.sort_by_key(|s| rank(s));
        assert_eq!(
            moved,
            ["WAIT_PAY", "PAID", "SHIPPED"],
            "{id}: each move once"
        );
        assert_eq!(shop::state(&db.pool, &id).await, ("DELIVERED".into(), 3));
    }
    // The log: three states entered per order, in version order along the path, the payment
    // by its trade.
    let rows = db
        .rows(
            "SELECT entity_id, state, from_state, version, fact FROM dtx_transitions \
             ORDER BY entity_id, version",
        )
        .await;
    assert_eq!(rows.len(), 25 * 3);
    for row in rows.chunks(3) {
        for (i, entered) in row.iter().enumerate() {
            assert_eq!(entered.text(1).unwrap(), PATH[i + 1]);
            assert_eq!(entered.text(2).unwrap(), PATH[i]);
            assert_eq!(entered.i64(3).unwrap(), i as i64 + 1);
        }
        assert_eq!(row[0].opt_text(4).unwrap().as_deref(), Some("T1"));
    }
}

test_on_all_databases!(every_event_gets_its_answer, SCHEMAS);
test_on_all_databases!(
    out_of_order_concurrent_events_never_move_an_order_back,
    SCHEMAS
);
