//! Idempotency records on SQLite, PostgreSQL and MariaDB: concurrent repeats, conflicts, lease
//! expiry with fact checks and fencing, retryable and final failures, unknown outcomes,
//! recovery sweeps and retention. "Exactly once" is asserted from the business table
//! (`orders`, unique only on its request key), not from the records themselves.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use dtx_sdk::barrier::HandlerError;
use dtx_sdk::idempotency::{
    Answer, Claim, Clock, Completion, Error, Expired, Fact, Idempotency, Key, ManualClock,
    RequestHash, Status, StoredResult, retention,
};
use dtx_sql::sqlx::Pool;
use dtx_sql::{Conn, Schema};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{
    create_tables, find_order, insert_order, insert_order_committed, orders_for,
};
use dtx_tests::test_on_all_databases;
use futures::future::BoxFuture;
use serde_json::json;

const SCHEMAS: &[Schema] = &[Schema::Idempotency];

fn key(business_id: &str) -> Key {
    Key::builder("order.create")
        .tenant("tenant-1")
        .business_id(business_id)
        .build()
        .unwrap()
}

fn hash(text: &str) -> RequestHash {
    RequestHash::of_json(&serde_json::from_str(text).unwrap())
}

fn created(order_id: &str) -> StoredResult {
    StoredResult::new("201")
        .resource(order_id)
        .body(json!({ "id": order_id }).to_string())
}

/// Same-transaction business: places an order in the caller's transaction, counts its runs,
/// and ends as `outcome(runs before this one, order id)` says.
fn order_then<C: Conn>(
    request_key: &str,
    runs: &Arc<AtomicUsize>,
    outcome: fn(usize, String) -> Result<Completion, HandlerError>,
) -> impl for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<Completion, HandlerError>> + Send + Sync {
    let request_key = request_key.to_string();
    let runs = runs.clone();
    move |conn| {
        let (request_key, runs) = (request_key.clone(), runs.clone());
        Box::pin(async move {
            let id = insert_order(conn, &request_key, 10).await?;
            // Keep the claim open a little so concurrent repeats really overlap.
            tokio::time::sleep(Duration::from_millis(20)).await;
            outcome(runs.fetch_add(1, SeqCst), id)
        })
    }
}

fn succeed(_: usize, id: String) -> Result<Completion, HandlerError> {
    Ok(Completion::Succeeded(created(&id)))
}

/// Lease-mode business: places the order in its own transaction (it could be anywhere).
async fn place_order_elsewhere<DB: TestBackend>(
    pool: &Pool<DB>,
    request_key: &str,
    runs: &AtomicUsize,
) -> Result<Completion, HandlerError> {
    runs.fetch_add(1, SeqCst);
    let id = insert_order_committed(pool, request_key, 10).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(Completion::Succeeded(created(&id)))
}

/// The result every caller got, checking that exactly one caller executed.
fn single_result(answers: Vec<Answer>) -> StoredResult {
    let mut executed = 0;
    let mut results = Vec::new();
    for answer in answers {
        match answer {
            Answer::Executed(Completion::Succeeded(r)) => {
                executed += 1;
                results.push(r);
            }
            Answer::Replayed {
                status: Status::Succeeded,
                result,
            } => results.push(result),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(executed, 1, "exactly one caller runs the business");
    let first = results[0].clone();
    assert!(
        results.iter().all(|r| *r == first),
        "every caller gets the first result"
    );
    first
}

/// Sends `n` requests for `k` at once (`request` is one of them) and checks the business ran
/// once and every caller got the order it placed.
async fn all_at_once<DB, F, Fut>(db: &'static TestDb<DB>, k: &Key, n: usize, request: F)
where
    DB: TestBackend,
    F: Fn(Arc<AtomicUsize>) -> Fut,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(request(runs.clone())))
        .collect();
    let answers = futures::future::try_join_all(tasks).await.unwrap();
    let result = single_result(answers);
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(orders_for(&db.pool, k.idem_key()).await, 1);
    assert_eq!(result.resource_id, find_order(&db.pool, k.idem_key()).await);
}

async fn concurrent_requests<DB: TestBackend>(db: &'static TestDb<DB>, n: usize) {
    create_tables(&db.pool).await;
    let store = Idempotency::new(db.pool.clone()).wait(Duration::from_secs(30));
    let body = hash(r#"{"amount":10}"#);

    // Same-transaction mode: the repeats wait on the first one's key.
    let k = key(&format!("same-tx-{n}"));
    all_at_once(db, &k, n, |runs| {
        let (store, k) = (store.clone(), k.clone());
        async move {
            let business = order_then(k.idem_key(), &runs, succeed);
            store.run_in_transaction(&k, &body, business).await.unwrap()
        }
    })
    .await;

    // Lease mode: the repeats find a live lease and wait for the result.
    let k = key(&format!("lease-{n}"));
    all_at_once(db, &k, n, |runs| {
        let (store, k) = (store.clone(), k.clone());
        async move {
            let business = || place_order_elsewhere(&db.pool, k.idem_key(), &runs);
            store.run_with_lease(&k, &body, business).await.unwrap()
        }
    })
    .await;
}

async fn twenty_concurrent_requests_run_the_business_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    concurrent_requests(db, 20).await;
}
test_on_all_databases!(twenty_concurrent_requests_run_the_business_once, SCHEMAS);

async fn hundred_concurrent_requests_run_the_business_once<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    concurrent_requests(db, 100).await;
}
test_on_all_databases!(hundred_concurrent_requests_run_the_business_once, SCHEMAS);

async fn same_key_with_another_body_conflicts_and_field_order_does_not<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    create_tables(&db.pool).await;
    let store = Idempotency::new(db.pool.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key("R1001");
    let first_body = r#"{"amount": 100, "currency": "EUR", "note": null}"#;
    let first = store
        .run_in_transaction(
            &k,
            &hash(first_body),
            order_then(k.idem_key(), &runs, succeed),
        )
        .await
        .unwrap();
    let Answer::Executed(Completion::Succeeded(first_result)) = first else {
        panic!("first request executes: {first:?}")
    };

    // Same key, different amount: conflict, nothing runs, the record is untouched.
    let before = store.record(&k).await.unwrap().unwrap();
    let conflict = store
        .run_in_transaction(
            &k,
            &hash(r#"{"amount": 1000, "currency": "EUR"}"#),
            order_then(k.idem_key(), &runs, succeed),
        )
        .await
        .unwrap();
    assert_eq!(conflict, Answer::Conflict);
    assert_eq!(store.record(&k).await.unwrap().unwrap(), before);
    // The lease path answers the same.
    let Claim::Answered(Answer::Conflict) = store
        .claim(&k, &hash(r#"{"amount": 1000, "currency": "EUR"}"#))
        .await
        .unwrap()
    else {
        panic!("lease-mode claim must conflict too")
    };

    // Same key, same body in another field order, number format and without the null: replay.
    let replay = store
        .run_in_transaction(
            &k,
            &hash(r#"{"currency":"EUR","amount":100.0}"#),
            order_then(k.idem_key(), &runs, succeed),
        )
        .await
        .unwrap();
    assert_eq!(
        replay,
        Answer::Replayed {
            status: Status::Succeeded,
            result: first_result
        }
    );
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(orders_for(&db.pool, k.idem_key()).await, 1);
}
test_on_all_databases!(
    same_key_with_another_body_conflicts_and_field_order_does_not,
    SCHEMAS
);

/// A fact check that looks the order up: there -> happened, not there -> not happened.
fn order_lookup<DB: TestBackend>(
    pool: &Pool<DB>,
    checks: &Arc<AtomicUsize>,
) -> impl Fn(Expired) -> BoxFuture<'static, Result<Fact, HandlerError>> + Send + Sync + 'static {
    let (pool, checks) = (pool.clone(), checks.clone());
    move |expired: Expired| {
        let (pool, checks) = (pool.clone(), checks.clone());
        Box::pin(async move {
            checks.fetch_add(1, SeqCst);
            Ok(match find_order(&pool, expired.key.idem_key()).await {
                Some(id) => Fact::Happened(created(&id)),
                None => Fact::NotHappened,
            })
        })
    }
}

// Leases lapse only when a test advances the store's manual clock; the lease length still
// paces the real-time renewals of `Lease::keep_alive` (every third of it).
const LEASE: Duration = Duration::from_millis(500);
// How far a test moves the clock to let a lease lapse.
const PAST_LEASE: Duration = Duration::from_millis(600);

fn replayed_success(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Replayed {
            status: Status::Succeeded,
            ..
        }
    )
}

/// A store with a short lease on a manual clock whose fact check looks the order up; counts
/// the checks.
async fn short_lease_store<DB: TestBackend>(
    db: &'static TestDb<DB>,
) -> (Idempotency<DB>, Arc<AtomicUsize>, ManualClock) {
    create_tables(&db.pool).await;
    let checks = Arc::new(AtomicUsize::new(0));
    let clock = ManualClock::starting_now();
    let store = Idempotency::new(db.pool.clone())
        .lease(LEASE)
        .clock(clock.clone())
        .fact_check(order_lookup(&db.pool, &checks));
    (store, checks, clock)
}

async fn expired_lease_asks_the_fact_check_and_fences_the_stale_owner<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let (store, checks, clock) = short_lease_store(db).await;
    let body = hash(r#"{"amount":10}"#);

    // 1. The owner placed the order, then stalled before completing.
    let k = key("stalled-after-effect");
    let Claim::Owned(stale) = store.claim(&k, &body).await.unwrap() else {
        panic!("first claim owns the key")
    };
    let order = insert_order_committed(&db.pool, k.idem_key(), 10).await;
    // While the lease lives, a repeat is told "in progress" and no fact check runs.
    let Claim::Answered(Answer::InProgress { retry_after }) = store.claim(&k, &body).await.unwrap()
    else {
        panic!("a live lease means in progress")
    };
    assert!(retry_after <= LEASE);
    assert_eq!(checks.load(SeqCst), 0);
    clock.advance(PAST_LEASE);
    let Claim::Answered(answer) = store.claim(&k, &body).await.unwrap() else {
        panic!("the effect exists: nothing to run")
    };
    assert_eq!(
        answer,
        Answer::Replayed {
            status: Status::Succeeded,
            result: created(&order)
        }
    );
    assert_eq!(checks.load(SeqCst), 1);
    // The stale owner wakes up and tries to record something else: refused.
    let late = stale
        .complete(Completion::Succeeded(created("O-stale")))
        .await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    let record = store.record(&k).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Succeeded);
    assert_eq!(record.result, Some(created(&order)));
    assert_eq!(record.retry_count, 1);
    assert_eq!(orders_for(&db.pool, k.idem_key()).await, 1);

    // 2. The owner crashed before any effect: the next request takes over and runs it.
    let k = key("crashed-before-effect");
    let Claim::Owned(stale) = store.claim(&k, &body).await.unwrap() else {
        panic!("first claim owns the key")
    };
    clock.advance(PAST_LEASE);
    let Claim::Owned(fresh) = store.claim(&k, &body).await.unwrap() else {
        panic!("no effect: the request re-claims")
    };
    assert_ne!(fresh.token(), stale.token());
    assert_eq!(checks.load(SeqCst), 2);
    let order = insert_order_committed(&db.pool, k.idem_key(), 10).await;
    fresh
        .complete(Completion::Succeeded(created(&order)))
        .await
        .unwrap();
    let late = stale
        .complete(Completion::FailedFinal(StoredResult::new("422")))
        .await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    let record = store.record(&k).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.result),
        (Status::Succeeded, Some(created(&order)))
    );

    // 3. The fact check cannot tell: parked for a person, repeats don't re-run or re-check.
    let unsure = Arc::new(AtomicUsize::new(0));
    let counter = unsure.clone();
    let store = store.fact_check(move |_| {
        counter.fetch_add(1, SeqCst);
        Box::pin(async { Ok(Fact::Unknown("payment provider unreachable".into())) })
    });
    let k = key("cannot-tell");
    let Claim::Owned(stale) = store.claim(&k, &body).await.unwrap() else {
        panic!("first claim owns the key")
    };
    clock.advance(PAST_LEASE);
    for _ in 0..3 {
        let Claim::Answered(answer) = store.claim(&k, &body).await.unwrap() else {
            panic!("a parked record is not re-run")
        };
        assert_eq!(
            answer,
            Answer::NeedsAttention {
                reason: "payment provider unreachable".into()
            }
        );
    }
    assert_eq!(unsure.load(SeqCst), 1, "the fact check ran once");
    let late = stale
        .complete(Completion::Succeeded(created("O-late")))
        .await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    // A person finds the payment and records it.
    store
        .resolve(&k, Completion::Succeeded(created("O-found")))
        .await
        .unwrap();
    let Claim::Answered(answer) = store.claim(&k, &body).await.unwrap() else {
        panic!("resolved: replay")
    };
    assert_eq!(
        answer,
        Answer::Replayed {
            status: Status::Succeeded,
            result: created("O-found")
        }
    );
    assert!(
        store
            .resolve(&k, Completion::Succeeded(created("again")))
            .await
            .is_err(),
        "only parked records can be resolved"
    );
}
test_on_all_databases!(
    expired_lease_asks_the_fact_check_and_fences_the_stale_owner,
    SCHEMAS
);

async fn failed_retryable_is_reclaimed_and_failed_final_is_replayed<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    create_tables(&db.pool).await;
    let store = Idempotency::new(db.pool.clone());
    let body = hash(r#"{"amount":10}"#);

    // Lease mode: a retryable failure is re-claimed atomically, by exactly one of many repeats,
    // with a new owner token; the first owner can no longer complete.
    let k = key("retryable-lease");
    let Claim::Owned(first) = store.claim(&k, &body).await.unwrap() else {
        panic!("first claim owns the key")
    };
    let first_token = first.token().to_string();
    let busy = StoredResult::new("503").body("downstream busy");
    // Keep a second handle on the first owner's token to try a late completion.
    let answer = first
        .complete(Completion::FailedRetryable(busy.clone()))
        .await
        .unwrap();
    assert_eq!(answer, Answer::Executed(Completion::FailedRetryable(busy)));
    assert_eq!(
        store.record(&k).await.unwrap().unwrap().status,
        Status::FailedRetryable
    );
    let claims = futures::future::join_all((0..10).map(|_| store.claim(&k, &body))).await;
    let mut owners = Vec::new();
    for claim in claims {
        match claim.unwrap() {
            Claim::Owned(lease) => owners.push(lease),
            Claim::Answered(Answer::InProgress { .. }) => {}
            Claim::Answered(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(owners.len(), 1, "exactly one repeat re-claims");
    let owner = owners.pop().unwrap();
    assert_ne!(owner.token(), first_token);
    let record = store.record(&k).await.unwrap().unwrap();
    assert_eq!(
        (
            record.status,
            record.retry_count,
            record.owner_token.as_str()
        ),
        (Status::Processing, 1, owner.token())
    );
    owner
        .complete(Completion::Succeeded(created("O-retried")))
        .await
        .unwrap();
    let Claim::Answered(Answer::Replayed { status, result }) =
        store.claim(&k, &body).await.unwrap()
    else {
        panic!("succeeded: replay")
    };
    assert_eq!((status, result), (Status::Succeeded, created("O-retried")));

    // Same-transaction mode: a retryable failure's writes roll back; the repeat runs again.
    let k = key("retryable-tx");
    let runs = Arc::new(AtomicUsize::new(0));
    let flaky = order_then(k.idem_key(), &runs, |before, id| {
        Ok(if before == 0 {
            Completion::FailedRetryable(StoredResult::new("DEADLOCK"))
        } else {
            Completion::Succeeded(created(&id))
        })
    });
    let first = store.run_in_transaction(&k, &body, &flaky).await.unwrap();
    assert!(matches!(
        first,
        Answer::Executed(Completion::FailedRetryable(_))
    ));
    assert_eq!(orders_for(&db.pool, k.idem_key()).await, 0, "rolled back");
    let second = store.run_in_transaction(&k, &body, &flaky).await.unwrap();
    assert!(matches!(second, Answer::Executed(Completion::Succeeded(_))));
    assert_eq!(runs.load(SeqCst), 2);
    assert_eq!(orders_for(&db.pool, k.idem_key()).await, 1);
    assert_eq!(store.record(&k).await.unwrap().unwrap().retry_count, 1);

    // A final failure is recorded once and replayed; the business does not run again.
    let k = key("final");
    let runs = Arc::new(AtomicUsize::new(0));
    let refuse = order_then(k.idem_key(), &runs, |_, _| {
        Ok(Completion::FailedFinal(
            StoredResult::new("INSUFFICIENT_FUNDS").body("balance 3 < 10"),
        ))
    });
    let refused = StoredResult::new("INSUFFICIENT_FUNDS").body("balance 3 < 10");
    let first = store.run_in_transaction(&k, &body, &refuse).await.unwrap();
    assert_eq!(
        first,
        Answer::Executed(Completion::FailedFinal(refused.clone()))
    );
    for _ in 0..3 {
        let again = store.run_in_transaction(&k, &body, &refuse).await.unwrap();
        assert_eq!(
            again,
            Answer::Replayed {
                status: Status::FailedFinal,
                result: refused.clone()
            }
        );
        let Claim::Answered(Answer::Replayed { status, .. }) =
            store.claim(&k, &body).await.unwrap()
        else {
            panic!("lease mode replays the final failure too")
        };
        assert_eq!(status, Status::FailedFinal);
    }
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(
        orders_for(&db.pool, k.idem_key()).await,
        0,
        "refusal undone"
    );
}
test_on_all_databases!(
    failed_retryable_is_reclaimed_and_failed_final_is_replayed,
    SCHEMAS
);

async fn unknown_outcomes_are_kept_and_errors_roll_back<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (store, checks, clock) = short_lease_store(db).await;
    let body = hash(r#"{"amount":10}"#);

    // Lease mode: the business fails half-way (the order exists, the error hides it).
    let k = key("unknown-lease");
    let request_key = k.idem_key().to_string();
    let answer = store
        .run_with_lease(&k, &body, || async {
            insert_order_committed(&db.pool, &request_key, 10).await;
            Err::<Completion, HandlerError>("connection reset after the insert".into())
        })
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Executed(Completion::Unknown(_))));
    // Kept as PROCESSING, not deleted, not re-run while the lease lives.
    let record = store.record(&k).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Processing);
    let runs = AtomicUsize::new(0);
    let again = store
        .run_with_lease(&k, &body, || {
            place_order_elsewhere(&db.pool, &request_key, &runs)
        })
        .await
        .unwrap();
    assert!(matches!(again, Answer::InProgress { .. }), "{again:?}");
    // After the lease, the fact check finds the order: recorded, never run twice.
    clock.advance(PAST_LEASE);
    let after = store
        .run_with_lease(&k, &body, || {
            place_order_elsewhere(&db.pool, &request_key, &runs)
        })
        .await
        .unwrap();
    assert!(replayed_success(&after), "{after:?}");
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(orders_for(&db.pool, &request_key).await, 1);

    // Same-transaction mode: an error means nothing happened; all of it rolls back.
    let k = key("error-tx");
    let request_key = k.idem_key().to_string();
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = order_then(&request_key, &runs, |_, _| {
        Err("validation of the stock failed".into())
    });
    let err = store
        .run_in_transaction(&k, &body, failing)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Handler(_)), "{err}");
    assert_eq!(store.record(&k).await.unwrap(), None);
    assert_eq!(orders_for(&db.pool, &request_key).await, 0);
    // Same-transaction mode, unknown: the local writes and the PROCESSING record commit.
    let k = key("unknown-tx");
    let request_key = k.idem_key().to_string();
    let unsure = order_then(&request_key, &runs, |_, _| {
        Ok(Completion::Unknown("payment call timed out".into()))
    });
    let answer = store.run_in_transaction(&k, &body, &unsure).await.unwrap();
    assert!(matches!(answer, Answer::Executed(Completion::Unknown(_))));
    assert_eq!(
        store.record(&k).await.unwrap().unwrap().status,
        Status::Processing
    );
    assert!(matches!(
        store.run_in_transaction(&k, &body, &unsure).await.unwrap(),
        Answer::InProgress { .. }
    ));
    clock.advance(PAST_LEASE);
    let checked_before = checks.load(SeqCst);
    let after = store.run_in_transaction(&k, &body, &unsure).await.unwrap();
    assert!(replayed_success(&after), "{after:?}");
    assert_eq!(checks.load(SeqCst), checked_before + 1);
    assert_eq!(orders_for(&db.pool, &request_key).await, 1);
}
test_on_all_databases!(unknown_outcomes_are_kept_and_errors_roll_back, SCHEMAS);

async fn recovery_sweeps_expired_leases<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (store, checks, clock) = short_lease_store(db).await;
    let body = hash("{}");
    let done = key("sweep-done");
    let not_done = key("sweep-not-done");
    let live = key("sweep-live");
    for k in [&done, &not_done] {
        assert!(matches!(
            store.claim(k, &body).await.unwrap(),
            Claim::Owned(_)
        ));
    }
    insert_order_committed(&db.pool, done.idem_key(), 10).await;
    clock.advance(PAST_LEASE);
    assert!(matches!(
        store.claim(&live, &body).await.unwrap(),
        Claim::Owned(_)
    ));

    let recovered = store.recover_expired("order.create", 100).await.unwrap();
    assert_eq!(
        (recovered.succeeded, recovered.released, recovered.parked),
        (1, 1, 0)
    );
    assert_eq!(
        checks.load(SeqCst),
        2,
        "only the expired leases were checked"
    );
    let status = |k: &Key| {
        let store = store.clone();
        let k = k.clone();
        async move { store.record(&k).await.unwrap().unwrap().status }
    };
    assert_eq!(status(&done).await, Status::Succeeded);
    assert_eq!(status(&not_done).await, Status::FailedRetryable);
    assert_eq!(
        status(&live).await,
        Status::Processing,
        "live leases are left alone"
    );
    // The released intent runs on the client's next retry.
    assert!(matches!(
        store.claim(&not_done, &body).await.unwrap(),
        Claim::Owned(_)
    ));
}
test_on_all_databases!(recovery_sweeps_expired_leases, SCHEMAS);

async fn retention_deletes_old_finished_records_in_batches<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let clock = ManualClock::starting_now();
    let store = Idempotency::new(db.pool.clone()).clock(clock.clone());
    let body = hash("{}");
    let in_scope = |scope: &str, id: &str| Key::builder(scope).business_id(id).build().unwrap();
    let finish = |k: Key, completion: Completion| {
        let store = store.clone();
        async move {
            let Claim::Owned(lease) = store.claim(&k, &body).await.unwrap() else {
                panic!("fresh key")
            };
            lease.complete(completion).await.unwrap();
        }
    };
    for i in 0..5 {
        finish(
            in_scope("http.create", &format!("old-{i}")),
            Completion::Succeeded(StoredResult::new("201")),
        )
        .await;
    }
    finish(
        in_scope("http.create", "old-final"),
        Completion::FailedFinal(StoredResult::new("422")),
    )
    .await;
    // Old but unresolved: never deleted.
    let stuck = in_scope("http.create", "old-processing");
    assert!(matches!(
        store.claim(&stuck, &body).await.unwrap(),
        Claim::Owned(_)
    ));
    finish(
        in_scope("http.create", "old-unknown"),
        Completion::Unknown("timeout".into()),
    )
    .await;
    // Another scope with its own (here: no) window.
    finish(
        in_scope("payment.callback", "old"),
        Completion::Succeeded(StoredResult::new("OK")),
    )
    .await;
    clock.advance(Duration::from_millis(300));
    finish(
        in_scope("http.create", "recent"),
        Completion::Succeeded(StoredResult::new("201")),
    )
    .await;

    let deleted = retention::Retention::new()
        .scope("http.create", Duration::from_millis(150))
        .batch(2)
        .clock(clock.clone())
        .run(&db.pool)
        .await
        .unwrap();
    assert_eq!(deleted, 6, "five succeeded and one final failure");
    let stats = store.stats("http.create").await.unwrap();
    assert_eq!(stats.succeeded, 1, "the recent one stays");
    assert_eq!((stats.failed_final, stats.processing), (0, 2));
    assert!(stats.oldest_processing_update.is_some());
    for k in [stuck.clone(), in_scope("payment.callback", "old")] {
        assert!(store.record(&k).await.unwrap().is_some());
    }
    // Nothing left to delete: a second run is a no-op.
    assert_eq!(
        retention::purge_scope_at(
            &db.pool,
            "http.create",
            Duration::from_millis(150),
            2,
            clock.now_ms()
        )
        .await
        .unwrap(),
        0
    );
}
test_on_all_databases!(retention_deletes_old_finished_records_in_batches, SCHEMAS);

async fn results_with_and_without_resource_ids_share_one_connection<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    // One connection, so the second completion reuses the statement the first one prepared:
    // the first binds "no resource" as a NULL, the second a resource id, on the same PostgreSQL
    // prepared statement (dtx_sql types its NULLs, so the parameter stays text).
    let pool = DB::connect(&db.url, 1).await.unwrap();
    let store = Idempotency::new(pool.clone());
    let body = hash("{}");
    let results = [
        StoredResult::new("202"),
        created("O-1"),
        StoredResult::new("204"),
    ];
    for (i, result) in results.iter().enumerate() {
        let k = key(&format!("resource-{i}"));
        let Claim::Owned(lease) = store.claim(&k, &body).await.unwrap() else {
            panic!("fresh key")
        };
        lease
            .complete(Completion::Succeeded(result.clone()))
            .await
            .unwrap();
        let stored = store.record(&k).await.unwrap().unwrap().result;
        assert_eq!(stored.as_ref(), Some(result));
    }
    pool.close().await;
}
test_on_all_databases!(
    results_with_and_without_resource_ids_share_one_connection,
    SCHEMAS
);

async fn renewed_leases_are_not_taken_over<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (store, checks, clock) = short_lease_store(db).await;
    let body = hash("{}");
    let k = key("long-work");
    let Claim::Owned(long) = store.claim(&k, &body).await.unwrap() else {
        panic!("fresh key")
    };
    // Past the original lease end, but renewed half-way: still in progress, nobody checks.
    clock.advance(LEASE * 3 / 5);
    long.renew().await.unwrap();
    clock.advance(LEASE * 3 / 5);
    assert!(matches!(
        store.claim(&k, &body).await.unwrap(),
        Claim::Answered(Answer::InProgress { .. })
    ));
    assert_eq!(checks.load(SeqCst), 0);
    // Not renewed again: taken over, and the old owner learns it when it renews.
    clock.advance(LEASE);
    assert!(matches!(
        store.claim(&k, &body).await.unwrap(),
        Claim::Owned(_)
    ));
    assert_eq!(checks.load(SeqCst), 1);
    assert!(matches!(long.renew().await, Err(Error::LeaseLost)));
}
test_on_all_databases!(renewed_leases_are_not_taken_over, SCHEMAS);
