//! Secrets and payloads stay out of logs, the history and alerts: a transaction whose payload
//! and bearer token carry a marker runs at DEBUG log level (every crate's logs: coordinator,
//! SDK, tonic, hyper, sqlx), parks, and raises an alert; the marker appears in no log line, no
//! history row, no stored alert and no webhook body. A participant's error text full of control
//! characters reaches them as one escaped line.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::auth::AuthKeys;
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestDb, with_db};
use dtx_tests::participant::Fault;
use dtx_tests::webhook::Receiver;
use dtx_tests::world::{SCHEMAS, bank};

type Sqlite = dtx_sql::sqlx::Sqlite;

const MARKER: &str = "S3CRET-MARKER-7f3a";

/// Every log line of this test process.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_payload_and_token_reach_no_log_history_or_alert() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| {
        let logs = logs.clone();
        async move {
            let dir = tempfile::tempdir().unwrap();
            let keys = AuthKeys::new(dir.path());
            // An opaque token that carries the marker (the token file holds only its hash).
            let token = format!("dtx_{MARKER}_0123456789abcdef");
            let line = format!(
                "{} orders default initiator\n",
                dtx_proto::auth::token_hash(&token)
            );
            std::fs::OpenOptions::new()
                .append(true)
                .open(&keys.tokens)
                .unwrap()
                .write_all(line.as_bytes())
                .unwrap();
            let webhook = Receiver::start().await;
            let (faults, bank_server) = bank(db).await;
            let mut flags = keys.flags();
            flags.extend(["--alert-webhook".into(), webhook.url.clone()]);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let coordinator = InProcess::start(&db.url, &flags).await;
            let client = coordinator.client().await.with_token(&token).unwrap();

            // The Confirm is refused with a text full of control characters: the transaction
            // parks and raises an alert.
            faults.push(
                "b1",
                Action::Confirm,
                [Fault::RefuseWith(
                    "line one\nlevel=ERROR forged\u{1b}[31m".into(),
                )],
            );
            let tx = client
                .begin(TccOptions {
                    xid: Some("secret-1".into()),
                    ..TccOptions::default()
                })
                .await
                .unwrap();
            let account = format!("acct-{MARKER}");
            dtx_tests::ledger::open_account(&db.pool, &account, 1_000).await;
            let payload = dtx_tests::participant::payload(&account, 10);
            let branch = TccBranch::new(bank_server.url(), "transfer", payload)
                .header("x-note", MARKER)
                .id("b1");
            tx.call(branch).await.unwrap();
            tx.commit().await.unwrap();
            let parked = client
                .wait("secret-1", Duration::from_secs(10))
                .await
                .unwrap();
            assert_eq!(parked.status(), TxStatus::NeedsAttention, "{parked:?}");
            let received = webhook
                .until(Duration::from_secs(10), |r| !r.is_empty())
                .await;
            coordinator.stop().await;

            let logs = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
            // The logs did see the transaction (its xid), just not its secrets.
            assert!(logs.lines().count() > 50, "DEBUG logs were captured");
            assert!(
                logs.contains("secret-1"),
                "the transaction's own lines were captured"
            );
            let leaked: Vec<&str> = logs.lines().filter(|l| l.contains(MARKER)).collect();
            assert!(leaked.is_empty(), "in the logs: {leaked:#?}");
            assert!(
                !logs.contains("forged\u{1b}"),
                "a raw control character reached the log"
            );

            let texts: Vec<String> = dtx_sql::sqlx::query_scalar(
                "SELECT COALESCE(detail, '') FROM dtx_history UNION ALL \
                 SELECT COALESCE(last_error, '') FROM dtx_branch UNION ALL \
                 SELECT COALESCE(last_error, '') FROM dtx_global UNION ALL \
                 SELECT body FROM dtx_alert",
            )
            .fetch_all(&db.pool)
            .await
            .unwrap();
            assert!(
                texts.iter().any(|t| t.contains("line one\\nlevel=ERROR")),
                "{texts:#?}"
            );
            for text in &texts {
                assert!(!text.contains(MARKER), "stored: {text}");
                assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text:?}");
            }
            for alert in received {
                assert!(!alert.body.contains(MARKER), "sent: {}", alert.body);
            }
        }
    })
    .await;
}
