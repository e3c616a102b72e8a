//! The SDK's metrics as a service's own exporter sees them: a global Prometheus recorder is
//! installed once for this test binary (as a service would in its main), the records and the
//! participant server are driven through every outcome on SQLite, PostgreSQL and MariaDB, and
//! the rendered text is read back. Each database's run uses its own scope and handler names,
//! so the runs (concurrent in one process) do not count into each other's series.

use std::sync::OnceLock;
use std::time::Duration;

use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest};
use dtx_sdk::barrier::Reply;
use dtx_sdk::idempotency::{
    Answer, Claim, Clock, Completion, Fact, Idempotency, Key, ManualClock, RequestHash,
    StoredResult, metrics as records, retention,
};
use dtx_sdk::metrics as barrier;
use dtx_sdk::server::{HandlerFn, ParticipantServer};
use dtx_sql::Schema;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::net::serve;
use dtx_tests::scrape::Scrape;
use dtx_tests::test_on_all_databases;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tonic::transport::Server;

const LEASE: Duration = Duration::from_secs(30);

/// The process's one recorder, installed by whichever test gets here first.
fn exporter() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("install the global recorder")
    })
}

fn scrape() -> Scrape {
    Scrape::parse(&exporter().render())
}

fn name<DB: TestBackend>(prefix: &str) -> String {
    format!("{prefix}_{:?}", DB::DIALECT).to_ascii_lowercase()
}

fn ok(code: &str) -> Completion {
    Completion::Succeeded(StoredResult::new(code))
}

async fn records_count_every_outcome<DB: TestBackend>(db: &'static TestDb<DB>) {
    exporter();
    let scope = name::<DB>("metrics.orders");
    let clock = ManualClock::at(1_000_000);
    // The fact check answers by business id: what a ledger lookup would say.
    let store = Idempotency::new(db.pool.clone())
        .lease(LEASE)
        .clock(clock.clone())
        .fact_check(|expired| {
            let id = expired.key.business_id().to_string();
            Box::pin(async move {
                Ok(match id.as_str() {
                    "happened" => Fact::Happened(StoredResult::new("201")),
                    "unknown" => Fact::Unknown("ledger unreachable".into()),
                    _ => Fact::NotHappened,
                })
            })
        });
    let key = |id: &str| Key::builder(&scope).business_id(id).build().unwrap();
    let (a, b) = (RequestHash::of_bytes(b"a"), RequestHash::of_bytes(b"b"));
    let run = |id: &'static str, hash: RequestHash, completion: Completion| {
        let (store, key) = (store.clone(), key(id));
        async move {
            store
                .run_in_transaction(&key, &hash, move |_conn| {
                    let completion = completion.clone();
                    Box::pin(async move { Ok(completion) })
                })
                .await
                .unwrap()
        }
    };

    // Same transaction: first, a replay, a conflict; a retryable failure, then its re-claim.
    assert!(matches!(
        run("one", a, ok("201")).await,
        Answer::Executed(_)
    ));
    assert!(matches!(
        run("one", a, ok("201")).await,
        Answer::Replayed { .. }
    ));
    assert_eq!(run("one", b, ok("201")).await, Answer::Conflict);
    let busy = Completion::FailedRetryable(StoredResult::new("503"));
    assert!(matches!(run("flaky", a, busy).await, Answer::Executed(_)));
    assert!(matches!(
        run("flaky", a, ok("201")).await,
        Answer::Executed(_)
    ));

    // Lease mode: a live lease is in progress; three owners die and their leases expire.
    let mut stale = Vec::new();
    for id in ["lost", "happened", "unknown"] {
        let Claim::Owned(lease) = store.claim(&key(id), &a).await.unwrap() else {
            panic!("{id}: the first claim owns the key")
        };
        stale.push(lease);
    }
    let Claim::Answered(Answer::InProgress { .. }) = store.claim(&key("lost"), &a).await.unwrap()
    else {
        panic!("the lease still lives")
    };
    clock.advance(LEASE + Duration::from_millis(1));
    let Claim::Owned(successor) = store.claim(&key("lost"), &a).await.unwrap() else {
        panic!("not happened: the successor runs it")
    };
    let Claim::Answered(Answer::Replayed { .. }) = store.claim(&key("happened"), &a).await.unwrap()
    else {
        panic!("happened: recorded and replayed")
    };
    let Claim::Answered(Answer::NeedsAttention { .. }) =
        store.claim(&key("unknown"), &a).await.unwrap()
    else {
        panic!("cannot tell: parked")
    };
    let late = stale.remove(0).complete(ok("201")).await;
    assert!(late.is_err(), "the stale owner is fenced out");
    successor.complete(ok("201")).await.unwrap();
    store.resolve(&key("unknown"), ok("201")).await.unwrap();
    // One that stays in flight, for the PROCESSING gauge and its age.
    let Claim::Owned(_open) = store.claim(&key("open"), &a).await.unwrap() else {
        panic!("first claim")
    };
    clock.advance(Duration::from_secs(7));

    let stats = store.export_stats(&scope).await.unwrap();
    assert_eq!((stats.processing, stats.succeeded), (1, 5), "{stats:?}");
    let s = scrape();
    let requests = |outcome: &str| {
        s.sum(
            records::REQUESTS,
            &[("scope", &scope), ("outcome", outcome)],
        )
    };
    let counts = [
        "first",
        "replayed",
        "conflict",
        "reclaimed",
        "in_progress",
        "taken_over",
        "parked",
    ]
    .map(|o| (o, requests(o)));
    assert_eq!(
        counts,
        [
            ("first", 6.0),
            ("replayed", 2.0),
            ("conflict", 1.0),
            ("reclaimed", 1.0),
            ("in_progress", 1.0),
            ("taken_over", 1.0),
            ("parked", 1.0),
        ],
        "{}",
        s.text
    );
    let completions = |status: &str| {
        s.sum(
            records::COMPLETIONS,
            &[("scope", &scope), ("status", status)],
        )
    };
    // one, flaky's second run, lost's successor, and the person's resolve.
    assert_eq!(completions("succeeded"), 4.0);
    assert_eq!(completions("failed_retryable"), 1.0);
    assert_eq!(completions("refused"), 1.0);
    let takeovers = |fact: &str| s.sum(records::TAKEOVERS, &[("scope", &scope), ("fact", fact)]);
    assert_eq!(
        [
            takeovers("not_happened"),
            takeovers("happened"),
            takeovers("unknown")
        ],
        [1.0, 1.0, 1.0]
    );
    let gauge = |status: &str| s.sum(records::RECORDS, &[("scope", &scope), ("status", status)]);
    assert_eq!(
        [gauge("processing"), gauge("succeeded"), gauge("parked")],
        [1.0, 5.0, 0.0]
    );
    assert_eq!(
        s.sum(records::OLDEST_PROCESSING_AGE, &[("scope", &scope)]),
        7.0
    );
    assert!(s.sum(records::OLDEST_FINISHED_AGE, &[("scope", &scope)]) >= 7.0);

    // Retention deletes the finished records and counts them.
    let purged = retention::purge_scope_at(&db.pool, &scope, Duration::ZERO, 2, clock.now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(purged, 5);
    let s = scrape();
    assert_eq!(s.sum(records::PURGED, &[("scope", &scope)]), 5.0);
    // Every name the dashboards are checked against is one really rendered (lock conflicts
    // need a real deadlock, which this run does not provoke).
    for name in records::METRIC_NAMES {
        assert!(
            *name == records::LOCK_CONFLICTS || s.names.contains(*name),
            "{name} is not rendered"
        );
    }
}

test_on_all_databases!(records_count_every_outcome, &[Schema::Idempotency]);

fn call(
    xid: &str,
    branch: &str,
    action: BranchAction,
    handler: &str,
    payload: &[u8],
) -> BranchRequest {
    BranchRequest {
        xid: xid.into(),
        branch_id: branch.into(),
        action: action as i32,
        handler: handler.into(),
        payload: payload.to_vec(),
        headers: Default::default(),
    }
}

/// A handler that fails (rolls back, answers RETRY) when its payload says so.
fn business<C: Send + 'static>() -> impl HandlerFn<C> {
    |_conn, call| {
        Box::pin(async move {
            if call.payload == b"boom" {
                Err("injected".into())
            } else {
                Ok(Reply::ok())
            }
        })
    }
}

async fn barrier_counts_every_verdict<DB: TestBackend>(db: &'static TestDb<DB>) {
    exporter();
    let handler = name::<DB>("reserve");
    let service = ParticipantServer::new(db.pool.clone())
        .tcc(&handler, business(), business(), business())
        .into_service();
    let server = serve(Server::builder().add_service(service)).await;
    let mut client = ParticipantClient::new(server.channel().await);
    let mut send = async |xid: &str, branch: &str, action: BranchAction, payload: &[u8]| {
        client
            .branch(call(xid, branch, action, &handler, payload))
            .await
            .unwrap();
    };
    use BranchAction::{Cancel, Confirm, Try};
    send("x1", "b1", Try, b"p").await; // executed
    send("x1", "b1", Try, b"p").await; // duplicate
    send("x1", "b1", Confirm, b"").await; // executed
    send("x1", "b1", Cancel, b"").await; // conflict: cancel after confirm
    send("x2", "b1", Cancel, b"").await; // empty rollback
    send("x2", "b1", Try, b"p").await; // suspended
    send("x3", "b1", Try, b"boom").await; // rolled back
    send("x4", "b1", Confirm, b"").await; // out of order: confirm without try
    let s = scrape();
    let verdict = |action: &str, detail: &str| {
        s.sum(
            barrier::BARRIER_CALLS,
            &[
                ("handler", &handler),
                ("action", action),
                ("detail", detail),
            ],
        )
    };
    assert_eq!(
        [
            verdict("try", "executed"),
            verdict("try", "duplicate"),
            verdict("confirm", "executed"),
            verdict("cancel", "conflict"),
            verdict("cancel", "empty_rollback"),
            verdict("try", "suspended"),
            verdict("try", "rolled_back"),
            verdict("confirm", "out_of_order"),
        ],
        [1.0; 8],
        "{}",
        s.text
    );
    assert_eq!(s.sum(barrier::BARRIER_CALLS, &[("handler", &handler)]), 8.0);
    assert!(s.names.contains(barrier::BARRIER_CALLS));
}

test_on_all_databases!(barrier_counts_every_verdict, &[Schema::Barrier]);

/// The outbox's metrics: a relay publishes two events and parks one no stream takes, its
/// backlog gauges are exported, and a consumer dead-letters an event id that comes back with
/// other content. Every name the dashboard and rules are checked against is rendered.
async fn outbox_exports_every_metric<DB: TestBackend>(db: &'static TestDb<DB>) {
    use async_nats::jetstream::{self, consumer, stream};
    use dtx_outbox::metrics as outbox;
    use dtx_sdk::idempotency::consumer::{Consumer, Delivery};
    use dtx_tests::outbox::{config, credit, enqueue};
    use futures::StreamExt;
    exporter();
    let Some(client) = dtx_tests::idempotency::nats().await else {
        return;
    };
    dtx_tests::idempotency::create_tables(&db.pool).await;
    let js = jetstream::new(client);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let stream = js
        .create_stream(stream::Config {
            name: format!("DTX_METRICS_{run}"),
            subjects: vec![format!("metrics.{run}.>")],
            storage: stream::StorageType::Memory,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create stream");
    let topic = format!("metrics.{run}.orders");
    enqueue(&db.pool, &topic, "a", "a:0", true).await;
    enqueue(&db.pool, &topic, "b", "b:0", true).await;
    let stuck = enqueue(&db.pool, &format!("nowhere.{run}"), "c", "c:0", true).await;
    let relay = dtx_outbox::Relay::new(db.pool.clone(), dtx_outbox::JetStream::new(js.clone()))
        .with_config(config("metrics"));
    for _ in 0..500 {
        relay.round().await.unwrap();
        let status = dtx_outbox::status(&db.pool, &stuck).await.unwrap().unwrap();
        if status.0 == "PARKED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.export_backlog().await;

    // An event id this consumer applied, delivered again with other content.
    let helper = Consumer::new(Idempotency::new(db.pool.clone()), "metrics", 1).unwrap();
    let event_id = uuid::Uuid::new_v4().to_string();
    let first = RequestHash::of_bytes(b"first");
    let applied = helper.handle(&event_id, &first, credit(&event_id)).await;
    assert_eq!(applied.unwrap(), Delivery::Processed);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", event_id.as_str());
    let subject = format!("metrics.{run}.conflict");
    let ack = js
        .publish_with_headers(subject.clone(), headers, "second".into())
        .await
        .unwrap();
    ack.await.unwrap();
    let pull = stream
        .create_consumer(consumer::pull::Config {
            filter_subject: subject,
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let message = pull
        .messages()
        .await
        .unwrap()
        .next()
        .await
        .unwrap()
        .unwrap();
    let apply = credit(&event_id);
    let delivery = dtx_outbox::consume::jetstream(&helper, &message, move |conn, _| apply(conn));
    assert_eq!(delivery.await.unwrap(), Delivery::Conflict);
    assert_eq!(
        dtx_tests::idempotency::credits_for(&db.pool, &event_id).await,
        1,
        "the first processing stands"
    );

    // Counters only grow (the databases' runs share them); the gauges are this run's or a
    // concurrent run's, each with one parked row.
    let s = scrape();
    assert!(s.sum(outbox::PUBLISHED, &[]) >= 2.0, "{}", s.text);
    assert!(s.sum(outbox::PUBLISH_FAILURES, &[]) >= 3.0);
    assert!(s.sum(outbox::PARKED_TOTAL, &[]) >= 1.0);
    assert!(s.sum(outbox::CONSUMER_CONFLICTS, &[]) >= 1.0);
    assert_eq!(s.sum(outbox::PARKED, &[]), 1.0);
    for name in outbox::METRIC_NAMES {
        assert!(s.names.contains(*name), "{name} is not rendered");
    }
}

test_on_all_databases!(
    outbox_exports_every_metric,
    &[Schema::Outbox, Schema::Idempotency]
);

/// The payment callbacks' counter, by provider and outcome: an unsigned callback is refused
/// and counted as `bad_signature`.
async fn payment_callbacks_are_counted<DB: TestBackend>(db: &'static TestDb<DB>) {
    use dtx_payments::metrics::CALLBACKS;
    exporter();
    let provider = name::<DB>("pay");
    let verifier = dtx_payments::HmacSha256::new(
        dtx_payments::http::HeaderName::from_static("x-pay-signature"),
        "secret",
    );
    let callbacks = dtx_payments::Callbacks::builder(
        db.pool.clone(),
        &provider,
        "shop-1",
        verifier,
        dtx_tests::shop::orders(),
    )
    .event("payment.succeeded", "PAID", "order.paid")
    .build()
    .unwrap();
    let answered = callbacks.answer(&Default::default(), b"{}").await;
    assert!(matches!(
        answered.handled,
        dtx_payments::Handled::BadSignature(_)
    ));
    let s = scrape();
    let labels = [
        ("provider", provider.as_str()),
        ("outcome", "bad_signature"),
    ];
    assert_eq!(s.sum(CALLBACKS, &labels), 1.0, "{}", s.text);
    for name in dtx_payments::metrics::METRIC_NAMES {
        assert!(s.names.contains(*name), "{name} is not rendered");
    }
}

test_on_all_databases!(payment_callbacks_are_counted, &[Schema::Payments]);
