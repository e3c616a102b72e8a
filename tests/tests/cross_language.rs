//! One saga and two-phase messages across languages: a Rust initiator (the SDK's saga builder)
//! and coordinator, one step at the Rust bank participant and the others at a Python
//! participant process
//! (`sdk-python/tests/participant_app.py`, the `dtx` package's barrier on its own SQLite file).
//! Effects are read from both ledgers; the Python-migrated file is then migrated by the Rust
//! SDK, which accepts it only if the two keep the same migration ledger and checksums.

use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::client::{MessageBranch, SagaStep};
use dtx_sql::sqlx::{self, SqlitePool};
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::ORDERS_CHECK_BACK;
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

/// A two-phase message each way: the Rust bank's order message delivered to a Python
/// participant, and a Python initiator's message (its order on the Python participant's file,
/// which answers the check-backs) delivered to the Rust bank.
async fn a_message_crosses_languages_both_ways<DB: TestBackend>(db: &'static TestDb<DB>) {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("python-participant.db");
    let py = PythonParticipant::start(&python, &file);
    let w = World::start(db, &[]).await;
    dtx_tests::idempotency::create_tables(&db.pool).await;

    let ran = w
        .client
        .message(&w.bank, ORDERS_CHECK_BACK)
        .xid("cross-msg")
        .branch(MessageBranch::new("ship", &py.url, "ship").payload(b"parcel".to_vec()))
        .do_and_submit(&db.pool, |conn: &mut DB::Conn| {
            Box::pin(async move {
                dtx_tests::idempotency::insert_order(conn, "cross-msg", 10).await?;
                Ok::<_, dtx_sdk::Error>(())
            })
        })
        .await;
    assert!(ran.is_ok(), "{ran:?}");
    let done = w.client.wait("cross-msg", WAIT).await.unwrap();
    assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
    let pool = SqlitePool::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    let shipped = vec![("ship".to_string(), "action".to_string())];
    assert_eq!(python_effects(&pool, "cross-msg").await, shipped);

    let script = dtx_tests::python::repo().join("sdk-python/tests/message_initiator.py");
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .arg(&file)
        .args([&w.coordinator.url, &py.url, "py-msg", &w.bank])
        .output()
        .await
        .expect("run the Python initiator");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(said.trim(), (TxStatus::Committed as i32).to_string());
    assert_eq!(w.effects("py-msg", "credit-bob", "action").await, 1);
    assert_eq!(w.account("bob").await.0, START + 5);
    let ordered = vec![("order".to_string(), "order".to_string())];
    assert_eq!(python_effects(&pool, "py-msg").await, ordered);
}
test_on_all_databases!(a_message_crosses_languages_both_ways, SCHEMAS);

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

/// The Python package over mTLS in both roles: its participant server serves TLS and requires
/// the coordinator's certificate (a saga step runs there over `https://`, and a coordinator
/// without its certificate is refused), and its coordinator client reaches a coordinator that
/// requires client certificates.
#[tokio::test]
async fn python_over_mtls() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = dtx_tests::pki::Ca::new(dir.path(), "dtx");
    let file = dir.path().join("python-participant.db");
    let py = PythonParticipant::start_tls(&python, &file, &ca.server("python"), &ca.cert());
    assert!(py.url.starts_with("https://"));
    let (server, myself) = (
        ca.server("server"),
        ca.client("coordinator", "dtx-coordinator"),
    );
    let client = ca.client("initiator", "orders");
    let path = |p: &std::path::Path| p.display().to_string();
    let (ca_file, store) = (
        path(&ca.cert()),
        format!("sqlite://{}", dir.path().join("c.db").display()),
    );
    let base = [
        "--tls-cert".to_string(),
        path(&server.cert),
        "--tls-key".into(),
        path(&server.key),
        "--tls-client-ca".into(),
        ca_file.clone(),
        "--participant-ca".into(),
        ca_file.clone(),
    ];
    let tls = dtx_sdk::client::ClientTls {
        ca_pem: Some(ca.pem().into_bytes()),
        system_roots: false,
        identity: Some((
            client.cert_pem().into_bytes(),
            client.key_pem().into_bytes(),
        )),
    };
    for (with_certificate, status) in [(false, None), (true, Some(TxStatus::Succeeded))] {
        let mut flags = base.to_vec();
        if with_certificate {
            flags.extend([
                "--participant-client-cert".into(),
                path(&myself.cert),
                "--participant-client-key".into(),
                path(&myself.key),
            ]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator =
            dtx_tests::coordinator::InProcess::start_with_tls(&store, &flags, Some(tls.clone()))
                .await;
        let xid = format!("py-mtls-{with_certificate}");
        let sdk = coordinator.client().await;
        sdk.saga()
            .xid(&xid)
            .step(SagaStep::new("ship", &py.url, "ship").payload(b"parcel".to_vec()))
            .submit()
            .await
            .unwrap();
        let tx = sdk.wait(&xid, Duration::from_secs(3)).await.unwrap();
        match status {
            Some(status) => assert_eq!(tx.status(), status, "{tx:?}"),
            None => assert_ne!(tx.status(), TxStatus::Succeeded, "{tx:?}"),
        }
        if with_certificate {
            // A TCC whose branch is at the Python participant: the initiator's Try and the
            // coordinator's Confirm both over mTLS.
            let tcc = format!("py-tcc-{with_certificate}");
            let options = dtx_sdk::client::TccOptions {
                xid: Some(tcc.clone()),
                ..Default::default()
            };
            let branch = dtx_sdk::client::TccBranch::new(&py.url, "hold", b"seat".to_vec());
            let tx = sdk.begin(options).await.unwrap();
            tx.call(branch.id("b1")).await.unwrap();
            tx.commit().await.unwrap();
            let done = sdk.wait(&tcc, Duration::from_secs(10)).await.unwrap();
            assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
            let pool = SqlitePool::connect(&format!("sqlite://{}", file.display()))
                .await
                .unwrap();
            let rows: Vec<(String, String)> = python_effects(&pool, &tcc).await;
            let expected =
                [("b1", "try"), ("b1", "confirm")].map(|(b, a)| (b.to_string(), a.to_string()));
            assert_eq!(rows, expected);
        }

        // The Python coordinator client, over mTLS, sees the same transaction.
        let script = "import sys, dtx\n\
            tls = dtx.ClientTls.from_files(sys.argv[2], sys.argv[3], sys.argv[4])\n\
            c = dtx.Coordinator(sys.argv[1], tls=tls)\n\
            print(c.get(sys.argv[5]).xid)";
        // Not std's blocking call: the coordinator serves on this test's runtime.
        let out = tokio::process::Command::new(&python)
            .args(["-c", script, &coordinator.url, &ca_file])
            .args([path(&client.cert), path(&client.key), xid.clone()])
            .output()
            .await
            .expect("run the Python client");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed.trim(),
            xid,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        coordinator.stop().await;
    }
}

/// A coordinator with auth on and signed branch calls, and a Python participant that obeys only
/// those: a saga step and a TCC (the Rust initiator's Try with the coordinator's token, then
/// the Confirm) in tenant acme reach it under `acme/xid`; the Python client runs a TCC with its
/// own bearer token; a forged and a replayed call are refused with nothing written.
#[tokio::test]
async fn python_participant_obeys_only_signed_calls() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let keys = dtx_tests::auth::AuthKeys::new(dir.path());
    let public_key = dir.path().join("call-public.pem");
    std::fs::write(&public_key, &keys.call_public_pem).unwrap();
    let file = dir.path().join("python-participant.db");
    let py = PythonParticipant::start_verifying(&python, &file, &public_key);
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let flags = keys.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coordinator = dtx_tests::coordinator::InProcess::start(&store, &flags).await;
    let token = keys.jwt("orders", "acme", &["initiator"]);
    let sdk = coordinator.client().await.with_token(&token).unwrap();
    let pool = SqlitePool::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();

    let saga = sdk
        .saga()
        .xid("py-signed-saga")
        .step(SagaStep::new("ship", &py.url, "ship").payload(b"parcel".to_vec()))
        .run(WAIT)
        .await
        .unwrap();
    assert_eq!(saga.status(), TxStatus::Succeeded);
    let options = dtx_sdk::client::TccOptions {
        xid: Some("py-signed-tcc".into()),
        ..Default::default()
    };
    let tx = sdk.begin(options).await.unwrap();
    tx.call(dtx_sdk::client::TccBranch::new(&py.url, "hold", b"seat".to_vec()).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let done = sdk.wait("py-signed-tcc", WAIT).await.unwrap();
    assert_eq!(done.status(), TxStatus::Committed, "{done:?}");
    let rows = python_effects(&pool, "acme/py-signed-tcc").await;
    let expected = [("b1", "try"), ("b1", "confirm")].map(|(b, a)| (b.to_string(), a.to_string()));
    assert_eq!(rows, expected);
    assert_eq!(python_effects(&pool, "acme/py-signed-saga").await.len(), 1);

    // The Python client as the initiator: its bearer token, the branch xid and Try token the
    // coordinator hands back.
    let script = "import sys, dtx\n\
        c = dtx.Coordinator(sys.argv[1], token=sys.argv[2])\n\
        with c.tcc(xid='py-client-tcc') as tx:\n    tx.call(sys.argv[3], 'hold', b'seat', branch_id='b1')\n\
        print(dtx.v1.dtx_pb2.TxStatus.Name(c.wait('py-client-tcc', 10).status))";
    let out = tokio::process::Command::new(&python)
        .args(["-c", script, &coordinator.url, &token, &py.url])
        .output()
        .await
        .expect("run the Python client");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "TX_STATUS_COMMITTED",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(python_effects(&pool, "acme/py-client-tcc").await.len(), 2);

    // Calls the coordinator did not sign for exactly that call.
    let mut participant =
        dtx_proto::v1::participant_client::ParticipantClient::connect(py.url.clone())
            .await
            .unwrap();
    let forged = {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let key = ed25519_dalek::SigningKey::from_bytes(&[42; 32]);
        let pem = key.to_pkcs8_pem(Default::default()).unwrap();
        let call = dtx_proto::auth::Call {
            xid: "acme/py-forged",
            branch: "b1",
            action: "ACTION",
            handler: "ship",
        };
        dtx_proto::auth::CallSigner::from_pem(&pem)
            .unwrap()
            .sign(&py.url, call)
            .unwrap()
    };
    let elsewhere = {
        let pem = std::fs::read_to_string(&keys.signing_key).unwrap();
        let call = dtx_proto::auth::Call {
            xid: "acme/py-forged",
            branch: "b1",
            action: "ACTION",
            handler: "ship",
        };
        let signer = dtx_proto::auth::CallSigner::from_pem(&pem).unwrap();
        (
            signer.sign("http://127.0.0.1:1", call).unwrap(),
            signer
                .sign(
                    &py.url,
                    dtx_proto::auth::Call {
                        branch: "b2",
                        ..call
                    },
                )
                .unwrap(),
        )
    };
    for (case, token) in [
        ("no token", None),
        ("forged", Some(forged.as_str())),
        ("another target", Some(elsewhere.0.as_str())),
        ("another branch", Some(elsewhere.1.as_str())),
    ] {
        let mut call = tonic::Request::new(dtx_proto::v1::BranchRequest {
            xid: "acme/py-forged".into(),
            branch_id: "b1".into(),
            action: dtx_proto::v1::BranchAction::Action as i32,
            handler: "ship".into(),
            payload: b"parcel".to_vec(),
            headers: Default::default(),
        });
        if let Some(token) = token {
            call.metadata_mut()
                .insert(dtx_proto::auth::CALL_TOKEN, token.parse().unwrap());
        }
        let refused = participant.branch(call).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::Unauthenticated,
            "{case}: {refused:?}"
        );
    }
    assert!(python_effects(&pool, "acme/py-forged").await.is_empty());
    let barrier: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dtx_barrier WHERE xid = ?")
        .bind("acme/py-forged")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(barrier, 0);
    coordinator.stop().await;
}
