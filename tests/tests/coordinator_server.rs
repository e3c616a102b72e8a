//! The coordinator as a service: gRPC health and reflection (v1 and v1alpha) answer, SIGTERM
//! shuts a process down gracefully - in-flight calls finish and its transactions are handed
//! back to the store, so another process continues them at once instead of after the lease -
//! and a burst of thousands of calls on one client connection is served.

use std::time::{Duration, Instant};

use dtx_proto::v1::TxStatus;
use dtx_sdk::barrier::Action;
use dtx_sql::{Schema, sqlx};
use dtx_tests::coordinator::{InProcess, Process};
use dtx_tests::db::{TestDb, with_db};
use dtx_tests::ledger;
use dtx_tests::world::{SCHEMAS, alice_with_a_slow_step, debit_alice};
use futures::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

#[tokio::test]
async fn health_and_reflection_answer() {
    with_db::<sqlx::Sqlite, _, _>(
        &[Schema::Coordinator],
        |db: &'static TestDb<sqlx::Sqlite>| async move {
            let coordinator = InProcess::start(&db.url, &[]).await;
            let channel = Channel::from_shared(coordinator.url.clone())
                .unwrap()
                .connect()
                .await
                .unwrap();
            for service in ["", "dtx.v1.Coordinator", "dtx.v1.Admin"] {
                let health = HealthClient::new(channel.clone())
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("health of {service:?}: {e}"))
                    .into_inner();
                assert_eq!(health.status(), ServingStatus::Serving, "{service:?}");
            }

            let mut reflection = ServerReflectionClient::new(channel.clone());
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut answers = reflection
                .server_reflection_info(futures::stream::iter([request]))
                .await
                .unwrap()
                .into_inner();
            let Some(Ok(answer)) = answers.next().await else {
                panic!("no reflection answer")
            };
            let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
                panic!("{answer:?}")
            };
            let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            assert!(
                names.contains(&"dtx.v1.Coordinator".to_string()),
                "{names:?}"
            );
            assert!(
                names.contains(&"dtx.v1.Participant".to_string()),
                "{names:?}"
            );

            // v1alpha too: older grpcurl and grpcio-reflection clients speak only that.
            use tonic_reflection::pb::v1alpha;
            let mut reflection =
                v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
            let request = v1alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(
                    v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
                ),
            };
            let mut answers = reflection
                .server_reflection_info(futures::stream::iter([request]))
                .await
                .expect("v1alpha reflection is served")
                .into_inner();
            let Some(Ok(answer)) = answers.next().await else {
                panic!("no v1alpha reflection answer")
            };
            let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(
                list,
            )) = answer.message_response
            else {
                panic!("{answer:?}")
            };
            let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            assert!(
                names.contains(&"dtx.v1.Coordinator".to_string()),
                "{names:?}"
            );
            coordinator.stop().await;
        },
    )
    .await;
}

/// SIGTERM while a saga step hangs: the process exits cleanly within its grace period, and a
/// second process finishes the saga right away - well before the 30 s lease would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_hands_transactions_over_at_once() {
    with_db::<sqlx::Postgres, _, _>(SCHEMAS, |db: &'static TestDb<sqlx::Postgres>| async move {
        let (faults, bank) = alice_with_a_slow_step(db, "s1", Duration::from_millis(300)).await;
        let long_lease = ["--lease", "30s"];
        let first = Process::start(BIN, &db.url, &long_lease).await;
        let client = first.client().await;
        client
            .saga()
            .xid("handover")
            .step(debit_alice("s1", bank.url(), 1))
            .step(debit_alice("s2", bank.url(), 2))
            .submit()
            .await
            .unwrap();
        while faults.calls("s1", Action::Action) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let status = first.terminate().await;
        assert!(status.success(), "exit status {status:?}");

        let second = Process::start(BIN, &db.url, &long_lease).await;
        let started = Instant::now();
        let done = second
            .client()
            .await
            .wait("handover", Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(done.status(), TxStatus::Succeeded, "{done:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "taken over after {:?}",
            started.elapsed()
        );
        assert_eq!(
            ledger::effects(&db.pool, "handover", "s1", "action").await,
            1
        );
        assert_eq!(
            ledger::effects(&db.pool, "handover", "s2", "action").await,
            1
        );
        second.kill().await;
    })
    .await;
}

/// One client connection carries every call of an SDK client. A burst of thousands of small
/// calls on it must be served, not refused at hyper's default of 200 streams nor answered by
/// h2 closing the connection for too many small unread DATA frames (ENHANCE_YOUR_CALM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_calls_on_one_connection_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let coordinator = InProcess::start(&store, &[]).await;
    let client = coordinator.client().await;
    const BURST: usize = 10_000;
    let calls: Vec<_> = (0..BURST)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let tx = client
                    .begin(dtx_sdk::client::TccOptions {
                        xid: Some(format!("burst-{i}")),
                        ..Default::default()
                    })
                    .await?;
                tx.rollback().await
            })
        })
        .collect();
    let mut failures = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(TxStatus::RolledBack) => {}
            other => failures.push(format!("{other:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {BURST} calls failed, first: {}",
        failures.len(),
        failures[0]
    );
    coordinator.stop().await;
}
