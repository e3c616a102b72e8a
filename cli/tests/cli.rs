//! The `dtx` binary against a real coordinator and participant: what it prints and the exit
//! codes scripts rely on.

use std::time::Duration;

use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::participant::Fault;
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START, World};

/// Runs `dtx` with `args` against `url`: (exit code, stdout, stderr).
async fn dtx(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_dtx"))
        .arg("--coordinator")
        .arg(url)
        .args(args)
        .env_remove("DTX_OPERATOR")
        .output()
        .await
        .expect("run dtx");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn ok(url: &str, args: &[&str]) -> String {
    let (code, out, err) = dtx(url, args).await;
    assert_eq!(code, 0, "dtx {args:?}: {err}");
    out
}

async fn json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    serde_json::from_str(&ok(url, &all).await).expect("JSON output")
}

async fn status_of(url: &str, xid: &str) -> String {
    json(url, &["tx", "show", xid]).await["status"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn an_operator_finds_fixes_and_checks_a_parked_transaction<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let url = w.coordinator.url.clone();
    w.park("order-42", "alice", Fault::Refuse).await;

    // Find it.
    let listed = ok(&url, &["tx", "list", "--needs-attention"]).await;
    let mut lines = listed.lines();
    assert!(lines.next().unwrap().starts_with("XID"), "{listed}");
    let row = lines.next().unwrap();
    assert!(
        row.starts_with("order-42") && row.contains("NEEDS_ATTENTION"),
        "{listed}"
    );
    let page = json(
        &url,
        &[
            "tx",
            "list",
            "--status",
            "needs_attention",
            "--older-than",
            "1ms",
        ],
    )
    .await;
    assert_eq!(page["transactions"][0]["xid"], "order-42");
    assert_eq!(page["next_page_token"], "");
    let none = json(&url, &["tx", "list", "--older-than", "1d"]).await;
    assert_eq!(none["transactions"].as_array().unwrap().len(), 0);
    let tcc = json(&url, &["tx", "list", "--kind", "tcc"]).await;
    assert_eq!(tcc["transactions"][0]["xid"], "order-42");
    let sagas = json(&url, &["tx", "list", "--kind", "saga"]).await;
    assert_eq!(sagas["transactions"].as_array().unwrap().len(), 0);

    // See why.
    let shown = ok(&url, &["tx", "show", "order-42"]).await;
    for needle in [
        "NEEDS_ATTENTION",
        "BRANCHES",
        "HISTORY",
        "ATTEMPT_FAILED",
        "injected refusal",
    ] {
        assert!(shown.contains(needle), "{needle} in\n{shown}");
    }

    // Refused and bad inputs have their own exit codes.
    let (code, _, err) = dtx(&url, &["tx", "retry", "order-42", "--reason", "now"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("Resume"), "{err}");
    let (code, _, err) = dtx(&url, &["tx", "resume", "order-42", "--reason", ""]).await;
    assert_eq!(code, 5, "{err}");
    let (code, _, _) = dtx(&url, &["tx", "resume", "order-42"]).await;
    assert_eq!(code, 2, "--reason is required");
    let (code, _, err) = dtx(&url, &["tx", "list", "--older-than", "10x"]).await;
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = dtx(&url, &["tx", "list", "--kind", "xa"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tcc, saga or message"), "{err}");
    let (code, _, err) = dtx(&url, &["tx", "show", "order-43"]).await;
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = dtx("http://127.0.0.1:1", &["stats"]).await;
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("cannot reach"), "{err}");

    // Fix it, and check the outcome and the record of who did it.
    let args = [
        "tx",
        "resume",
        "order-42",
        "--reason",
        "limit raised",
        "--operator",
        "ops-bob",
    ];
    ok(&url, &args).await;
    for _ in 0..200 {
        if status_of(&url, "order-42").await == "COMMITTED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shown = json(&url, &["tx", "show", "order-42"]).await;
    assert_eq!(shown["status"], "COMMITTED");
    let operator: Vec<_> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "OPERATOR")
        .map(|e| (e["actor"].as_str().unwrap(), e["detail"].as_str().unwrap()))
        .collect();
    assert_eq!(operator, [("ops-bob", "resume: limit raised")]);
    assert_eq!(w.account("alice").await, (START - 10, 0));

    let stats = json(&url, &["stats"]).await;
    let committed = stats["counts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["status"] == "COMMITTED")
        .unwrap()["count"]
        .as_u64();
    assert_eq!(committed, Some(1));
    assert_eq!(stats["needs_attention"], 0);
    let table = ok(&url, &["stats"]).await;
    assert!(table.contains("needs attention: 0"), "{table}");
}
test_on_all_databases!(
    an_operator_finds_fixes_and_checks_a_parked_transaction,
    SCHEMAS
);

/// A coordinator that accepts connections and never answers (a wedged process, or a
/// SIGSTOPped one, whose kernel still completes the TCP handshake): `dtx` gives up after
/// `--timeout` with exit 6 and a sentence.
#[tokio::test]
async fn a_coordinator_that_never_answers_times_out_with_exit_6() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let (code, _, err) = dtx(&url, &["--timeout", "1s", "stats"]).await;
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("did not answer within 1s (--timeout)"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    held.abort();
}

/// Usage errors are exit 2: a URL that is none, and https:// (no TLS yet: refused rather than
/// sent in plain text).
#[tokio::test]
async fn a_bad_or_tls_coordinator_url_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dtx_tests::pki::Ca::new(dir.path(), "dtx");
    let ca_file = ca.cert().display().to_string();
    for (url, extra, says) in [
        ("not a url", vec![], "is not"),
        (
            "ftp://127.0.0.1:1",
            vec![],
            "is not an http:// or https:// URL",
        ),
        ("http://127.0.0.1:1", vec!["--ca", &ca_file], "use https://"),
        (
            "https://127.0.0.1:1",
            vec!["--cert", &ca_file],
            "--cert and --key go together",
        ),
    ] {
        let mut args = extra.clone();
        args.push("stats");
        let (code, _, err) = dtx(url, &args).await;
        assert_eq!(code, 2, "{url}: {err}");
        assert!(err.contains(says), "{url}: {err}");
    }
}

/// `https://` is TLS: against a coordinator requiring client certificates, `dtx` works with
/// `--ca`, `--cert` and `--key` (or their variables), and says why it cannot connect without.
#[tokio::test]
async fn the_cli_speaks_tls_and_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dtx_tests::pki::Ca::new(dir.path(), "dtx");
    let (server, client) = (ca.server("server"), ca.client("operator", "ops-anna"));
    let files = [&server.cert, &server.key, &ca.cert()].map(|p| p.display().to_string());
    let flags = [
        "--tls-cert",
        &files[0],
        "--tls-key",
        &files[1],
        "--tls-client-ca",
        &files[2],
    ];
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let tls = dtx_sdk::client::ClientTls {
        ca_pem: Some(ca.pem().into_bytes()),
        system_roots: false,
        identity: Some((
            client.cert_pem().into_bytes(),
            client.key_pem().into_bytes(),
        )),
    };
    let coordinator =
        dtx_tests::coordinator::InProcess::start_with_tls(&store, &flags, Some(tls)).await;
    let url = coordinator.url.clone();
    let (cert, key) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let tls_args = ["--ca", &files[2], "--cert", &cert, "--key", &key, "stats"];
    let table = ok(&url, &tls_args).await;
    assert!(table.contains("needs attention: 0"), "{table}");

    let (code, _, err) = dtx(&url, &["--ca", &files[2], "stats"]).await;
    assert_eq!(code, 6, "answered without a client certificate: {err}");
    let (code, _, err) = dtx(&url, &["stats"]).await;
    assert_eq!(
        code, 6,
        "trusted a private CA through the system roots: {err}"
    );
    assert!(err.contains("--ca"), "{err}");
    coordinator.stop().await;
}
