//! Barrier retention: rows older than the window are deleted in bounded batches; younger rows
//! stay and keep answering repeats. On SQLite, PostgreSQL and MariaDB.

use std::time::Duration;

use dtx_sdk::barrier::{self, Action, Detail};
use dtx_sql::{Schema, now_ms};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::{Behave, direct};
use dtx_tests::{ledger, test_on_all_databases};

async fn old_rows_are_purged_in_batches<DB: TestBackend>(db: &'static TestDb<DB>) {
    ledger::create_tables(&db.pool).await;
    ledger::open_account(&db.pool, "acct", 1_000).await;
    for i in 0..25 {
        direct(
            &db.pool,
            &format!("old-{i}"),
            "b1",
            Action::Try,
            Behave::Ok,
            "t",
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    direct(&db.pool, "young", "b1", Action::Try, Behave::Ok, "t")
        .await
        .unwrap();

    // 25 old rows in batches of 10: three statements, all old rows gone.
    let deleted = barrier::purge_older_than::<DB>(&db.pool, cutoff, 10)
        .await
        .unwrap();
    assert_eq!(deleted, 25);
    for i in 0..25 {
        assert_eq!(
            ledger::barrier_rows(&db.pool, &format!("old-{i}"), "b1").await,
            0
        );
    }
    // The young row still answers its repeat from the barrier.
    let repeat = direct(&db.pool, "young", "b1", Action::Try, Behave::Ok, "again")
        .await
        .unwrap();
    assert_eq!(repeat.detail, Detail::Duplicate);

    // A window that covers everything deletes nothing.
    let none = barrier::purge::<DB>(&db.pool, Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(none, 0);
    assert_eq!(ledger::barrier_rows(&db.pool, "young", "b1").await, 1);
}
test_on_all_databases!(old_rows_are_purged_in_batches, &[Schema::Barrier]);
