//! One saga across languages: a Rust initiator (the SDK's saga builder) and coordinator, one
//! step at the Rust bank participant and the others at a Python participant process
//! (`sdk-python/tests/participant_app.py`, the `dtx` package's barrier on its own SQLite file).
//! Effects are read from both ledgers; the Python-migrated file is then migrated by the Rust
//! SDK, which accepts it only if the two keep the same migration ledger and checksums.

use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::client::SagaStep;
use dtx_sql::sqlx::{self, SqlitePool};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::python::{PythonParticipant, python};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World, debit_alice};

const WAIT: Duration = Duration::from_secs(20);

/// `(branch_id, action)` rows the Python handlers wrote for `xid`, in order.
async fn python_effects(pool: &SqlitePool, xid: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT branch_id, action FROM ledger WHERE xid = ? ORDER BY rowid")
        .bind(xid)
        .fetch_all(pool)
        .await
        .expect("read the Python participant's ledger")
}

async fn a_saga_spans_a_rust_and_a_python_participant<DB: TestBackend>(db: &'static TestDb<DB>) {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("python-participant.db");
    let py = PythonParticipant::start(&python, &file);
    let w = World::start(db, &[]).await;

    // Both steps succeed.
    let outcome = w
        .client
        .saga()
        .xid("cross-ok")
        .step(debit_alice("debit", &w.bank, 10))
        .step(SagaStep::new("ship", &py.url, "ship").payload(b"parcel".to_vec()))
        .run(WAIT)
        .await
        .unwrap();
    assert_eq!(outcome.status(), TxStatus::Succeeded, "{outcome:?}");
    assert_eq!(w.account("alice").await.0, START - 10);

    // A third (Python) step refuses: the Python and the Rust step are compensated.
    let outcome = w
        .client
        .saga()
        .xid("cross-undo")
        .step(debit_alice("debit", &w.bank, 10))
        .step(SagaStep::new("ship", &py.url, "ship").payload(b"parcel".to_vec()))
        .step(SagaStep::new("charge", &py.url, "fail").payload(b"card".to_vec()))
        .run(WAIT)
        .await
        .unwrap();
    assert_eq!(outcome.status(), TxStatus::Compensated, "{outcome:?}");
    assert_eq!(w.effects("cross-undo", "debit", "compensate").await, 1);
    assert_eq!(
        w.account("alice").await.0,
        START - 10,
        "only cross-ok's debit stands"
    );

    let pool = SqlitePool::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let rows = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(b, a)| (b.to_string(), a.to_string()))
            .collect()
    };
    assert_eq!(
        python_effects(&pool, "cross-ok").await,
        rows(&[("ship", "action")])
    );
    // charge's refused action wrote nothing that stands, and a refused step is not compensated.
    assert_eq!(
        python_effects(&pool, "cross-undo").await,
        rows(&[("ship", "action"), ("ship", "compensate")])
    );
    dtx_sdk::migrate_barrier(&pool)
        .await
        .expect("the Rust SDK accepts the barrier tables the Python package migrated");
}
test_on_all_databases!(a_saga_spans_a_rust_and_a_python_participant, SCHEMAS);

/// Runs the Python package's migrator on `url` (`dtx.from_url(url).migrate()`).
fn python_migrate(python: &std::path::Path, url: &str) {
    let status = std::process::Command::new(python)
        .args([
            "-c",
            "import sys, dtx; dtx.from_url(sys.argv[1]).migrate()",
            url,
        ])
        .status()
        .expect("run the Python migrator");
    assert!(
        status.success(),
        "the Python migrator failed on {url}: {status}"
    );
}

/// Either SDK may migrate a shared database first, and the other accepts it: the same files,
/// the same ledger table and the same sqlx checksums, on every database.
async fn rust_and_python_migrate_one_database<DB: TestBackend>(db: &'static TestDb<DB>) {
    let Some(python) = python() else { return };
    python_migrate(&python, &db.url);
    dtx_sdk::migrate_barrier(&db.pool)
        .await
        .expect("the Rust SDK accepts the barrier the Python package migrated");
    python_migrate(&python, &db.url);
}
test_on_all_databases!(rust_and_python_migrate_one_database, &[]);
