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
