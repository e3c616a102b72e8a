//! The coordinator calls only allowed targets: a name allowed where it enters is checked again
//! against what it resolves to when the call is made (the DNS-rebinding check). Here the rules
//! allow the name `localhost` but no internal network, so `localhost` resolving to 127.0.0.1
//! stands for a name that now points inside: the saga's step is not called (the saga fails
//! without any effect) and a TCC's Confirm parks the transaction with the reason.

use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::client::{SagaStep, TccBranch, TccOptions};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestDb, with_db};
use dtx_tests::participant::payload;
use dtx_tests::world::{SCHEMAS, START, bank};

type Sqlite = dtx_sql::sqlx::Sqlite;

#[tokio::test]
async fn a_name_that_resolves_outside_the_rules_is_not_called() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let (_faults, bank_server) = bank(db).await;
        let by_name = format!("http://localhost:{}", bank_server.addr.port());
        let coordinator = InProcess::start(&db.url, &["--allow-target", "http://localhost"]).await;
        let client = coordinator.client().await;

        // Entering by address is refused at once; by name it is accepted.
        let refused = client
            .saga()
            .xid("by-address")
            .step(SagaStep::new("s1", bank_server.url(), "debit").payload(payload("alice", 1)))
            .submit()
            .await
            .err()
            .expect("a target by address outside the rules is refused");
        assert!(refused.to_string().contains("--allow-target"), "{refused}");

        let saga = client
            .saga()
            .xid("by-name")
            .step(SagaStep::new("s1", &by_name, "debit").payload(payload("alice", 1)))
            .run(Duration::from_secs(10))
            .await
            .unwrap();
        assert_ne!(saga.status(), TxStatus::Succeeded);
        let step = &saga.steps()[0];
        assert!(
            step.last_error
                .contains("resolves to 127.0.0.1, outside the rules"),
            "{step:?}"
        );
        assert_eq!(
            dtx_tests::ledger::effects(&db.pool, "by-name", "s1", "action").await,
            0
        );

        // A TCC: the initiator's own Try reaches the bank; the coordinator's Confirm is not
        // sent, and the transaction parks saying why.
        let tx = client
            .begin(TccOptions {
                xid: Some("tcc-by-name".into()),
                ..TccOptions::default()
            })
            .await
            .unwrap();
        tx.call(TccBranch::new(&by_name, "transfer", payload("alice", 5)).id("b1"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let parked = client
            .wait("tcc-by-name", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(parked.status(), TxStatus::NeedsAttention, "{parked:?}");
        assert!(
            parked.branches[0].last_error.contains("outside the rules"),
            "{parked:?}"
        );
        let confirms = dtx_tests::ledger::effects(&db.pool, "tcc-by-name", "b1", "confirm").await;
        assert_eq!(confirms, 0);
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await,
            (START - 5, 5),
            "held by the Try, never confirmed"
        );
        coordinator.stop().await;
    })
    .await;
}

/// Where a target enters, its port and its network are checked against the rules: with only
/// the bank's address and port allowed, the same host on another port and a neighbouring
/// address on the bank's port are refused with PERMISSION_DENIED naming the rules, and the
/// refused saga or branch is stored nowhere.
#[tokio::test]
async fn a_denied_port_or_network_is_refused_where_it_enters() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let (_faults, bank_server) = bank(db).await;
        let port = bank_server.addr.port();
        let rule = format!("http://127.0.0.1/32:{port}");
        let coordinator = InProcess::start(&db.url, &["--allow-target", &rule]).await;
        let client = coordinator.client().await;

        let other_port = format!("http://127.0.0.1:{}", if port == 1 { 2 } else { port - 1 });
        let other_net = format!("http://127.0.0.2:{port}");
        for (case, target) in [("port", &other_port), ("network", &other_net)] {
            let xid = format!("saga-{case}");
            let refused = client
                .saga()
                .xid(&xid)
                .step(SagaStep::new("s1", target, "debit").payload(payload("alice", 1)))
                .submit()
                .await
                .err()
                .unwrap_or_else(|| panic!("a saga to another {case} was accepted"));
            assert_permission_denied(&refused, &rule);
            assert_not_stored(&client, &xid).await;

            let xid = format!("tcc-{case}");
            let tx = client
                .begin(TccOptions {
                    xid: Some(xid.clone()),
                    ..TccOptions::default()
                })
                .await
                .unwrap();
            let refused = tx
                .call(TccBranch::new(target, "transfer", payload("alice", 5)).id("b1"))
                .await
                .err()
                .unwrap_or_else(|| panic!("a branch at another {case} was registered"));
            assert_permission_denied(&refused, &rule);
            // The transaction begins with its first registered branch: none was.
            assert_not_stored(&client, &xid).await;
        }

        // The allowed address and port are called.
        let saga = client
            .saga()
            .xid("allowed")
            .step(SagaStep::new("s1", bank_server.url(), "debit").payload(payload("alice", 1)))
            .run(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(saga.status(), TxStatus::Succeeded);
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await,
            (START - 1, 0)
        );
        coordinator.stop().await;
    })
    .await;
}

fn assert_permission_denied(error: &dtx_sdk::Error, rule: &str) {
    let dtx_sdk::Error::Rpc(status) = error else {
        panic!("not a refusal by the coordinator: {error}");
    };
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("--allow-target"), "{status:?}");
    assert!(
        status.message().contains(rule),
        "the rules are not named: {status:?}"
    );
}

async fn assert_not_stored(client: &dtx_sdk::client::Coordinator, xid: &str) {
    let missing = client.get(xid).await.unwrap_err();
    assert!(
        matches!(missing, dtx_sdk::Error::Rpc(ref e) if e.code() == tonic::Code::NotFound),
        "{xid} was stored: {missing}"
    );
}
