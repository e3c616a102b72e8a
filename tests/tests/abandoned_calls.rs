//! Callers that go away mid-request (a deadline, a reset stream, a closed tab) while the
//! coordinator reads its store. A database connection dropped mid-read must not go back to the
//! pool out of step: with sqlx its return to the pool would wait forever, and after a few such
//! drops the coordinator could read nothing. The store is reached over a link that delivers
//! every answer in two pieces, so the drops land mid-read (see `dtx_tests::net::SplitLink`).

use std::time::Duration;

use dtx_sdk::Error;
use dtx_sdk::client::TccOptions;
use dtx_sql::{Schema, sqlx};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestBackend, with_db};
use dtx_tests::net::SplitLink;

async fn reads_abandoned_mid_query_leave_the_store_usable<DB: TestBackend>() {
    with_db::<DB, _, _>(&[Schema::Coordinator], |db| async move {
        let (url, _link) = SplitLink::to_database(&db.url).await;
        // Two connections: two lost to out-of-step returns would stop every read.
        let coordinator = InProcess::start(&url, &["--db-connections", "2"]).await;
        let client = coordinator.client().await;
        for i in 0..4 {
            let options = TccOptions {
                xid: Some(format!("done-{i}")),
                ..TccOptions::default()
            };
            client
                .tcc(options, |_| async { Ok::<_, Error>(()) })
                .await
                .expect("an empty TCC commits");
        }
        // Finished, so every Get reads the store. Each caller gives up within 6 ms.
        for k in 0..1000u64 {
            let within = Duration::from_micros((k * 7919) % 12000);
            let xid = format!("done-{}", k % 4);
            let _ = tokio::time::timeout(within, client.get(&xid)).await;
        }
        // Every read still gets its answer, well within the pool's 10 s acquire timeout.
        let reads = (0..8).map(|i| {
            let client = client.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    client.get(&format!("done-{}", i % 4)),
                )
                .await
            }
        });
        for read in futures::future::join_all(reads).await {
            let tx = read
                .expect("a read waited 5 s: the store's connections were lost to abandoned reads")
                .expect("a read failed");
            assert_eq!(tx.status(), dtx_proto::v1::TxStatus::Committed);
        }
        coordinator.stop().await;
    })
    .await;
}

#[tokio::test]
async fn reads_abandoned_mid_query_postgres() {
    reads_abandoned_mid_query_leave_the_store_usable::<sqlx::Postgres>().await;
}

#[tokio::test]
async fn reads_abandoned_mid_query_mariadb() {
    reads_abandoned_mid_query_leave_the_store_usable::<sqlx::MySql>().await;
}
