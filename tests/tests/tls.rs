//! TLS and mTLS on the coordinator's listeners, with certificates made at run time: whole
//! transactions over TLS and mTLS, the clients that must be refused (plain text, a wrong CA,
//! no client certificate, one from another CA), the HTTP/JSON listener over TLS, and a
//! certificate rotation while a call is held.

use std::sync::Arc;
use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::client::{ClientTls, Coordinator, TccBranch, TccOptions};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestDb, with_db};
use dtx_tests::net::free_addr;
use dtx_tests::participant::payload;
use dtx_tests::pki::{Ca, Identity};
use dtx_tests::world::{SCHEMAS, START, bank, debit_alice};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Sqlite = dtx_sql::sqlx::Sqlite;

/// The flags of a coordinator serving `server` (and, with `client_ca`, requiring client
/// certificates of that CA).
fn tls_flags(server: &Identity, client_ca: Option<&Ca>) -> Vec<String> {
    let mut flags = vec![
        "--tls-cert".to_string(),
        server.cert.display().to_string(),
        "--tls-key".into(),
        server.key.display().to_string(),
    ];
    if let Some(ca) = client_ca {
        flags.extend(["--tls-client-ca".into(), ca.cert().display().to_string()]);
    }
    flags
}

fn trusting(ca: &Ca, identity: Option<&Identity>) -> ClientTls {
    ClientTls {
        ca_pem: Some(ca.pem().into_bytes()),
        system_roots: false,
        identity: identity.map(|i| (i.cert_pem().into_bytes(), i.key_pem().into_bytes())),
    }
}

/// The TLS of a test server with `identity`, requiring client certificates of `ca`.
fn mtls_server(ca: &Ca, identity: &Identity) -> Arc<dtx_coordinator::tls::ServerTls> {
    let tls = dtx_coordinator::tls::ServerTls::load(dtx_coordinator::tls::TlsFiles {
        cert: identity.cert.clone(),
        key: identity.key.clone(),
        client_ca: Some(ca.cert()),
    })
    .unwrap();
    Arc::new(tls)
}

/// The coordinator's flags to call `https://` participants and webhooks trusting `ca`, with
/// `myself` as its client certificate.
fn participant_flags(ca: &Ca, myself: &Identity) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec![
        "--participant-ca".into(),
        path(&ca.cert()),
        "--participant-client-cert".into(),
        path(&myself.cert),
        "--participant-client-key".into(),
        path(&myself.key),
    ]
}

/// A TCC and a saga through `client`, against the bank at `bank_url`: both settle.
async fn run_tcc_and_saga(client: &Coordinator, bank_url: &str, tag: &str) {
    let xid = format!("tcc-{tag}");
    let options = TccOptions {
        xid: Some(xid.clone()),
        ..TccOptions::default()
    };
    let tx = client.begin(options).await.unwrap();
    tx.call(TccBranch::new(bank_url, "transfer", payload("bob", 5)).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let done = client.wait(&xid, Duration::from_secs(10)).await.unwrap();
    assert_eq!(done.status(), TxStatus::Committed, "{done:?}");

    let saga = format!("saga-{tag}");
    let outcome = client
        .saga()
        .xid(&saga)
        .step(debit_alice("s1", bank_url, 3))
        .submit()
        .await
        .unwrap()
        .await_outcome(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(outcome.status(), TxStatus::Succeeded, "{outcome:?}");
}

/// Whether a client gets an answer from the coordinator (NOT_FOUND counts), within 5 s.
async fn answers(url: &str, tls: Option<ClientTls>) -> Result<(), String> {
    let call = async {
        let client = dtx_tests::coordinator::connect(url, tls.as_ref())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        match client.get("probe").await {
            Err(dtx_sdk::Error::Transport(e)) => Err(format!("transport: {e}")),
            Err(dtx_sdk::Error::Rpc(s)) if s.code() == tonic::Code::NotFound => Ok(()),
            other => Err(format!("{other:?}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".into()))
}

#[tokio::test]
async fn transactions_over_tls_and_the_clients_refused() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let (ca, other) = (Ca::new(dir.path(), "dtx"), Ca::new(dir.path(), "other"));
        let server = ca.server("server");
        let (_faults, bank_server) = bank(db).await;
        let flags = tls_flags(&server, None);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator =
            InProcess::start_with_tls(&db.url, &flags, Some(trusting(&ca, None))).await;
        assert!(coordinator.url.starts_with("https://"));
        run_tcc_and_saga(&coordinator.client().await, &bank_server.url(), "tls").await;
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "bob").await,
            (START - 5, 0)
        );

        // Refused: plain text on the TLS port, and a client that trusts another CA.
        let plain = coordinator.url.replace("https://", "http://");
        answers(&plain, None)
            .await
            .expect_err("plain text answered");
        let wrong = answers(&coordinator.url, Some(trusting(&other, None))).await;
        assert!(wrong.is_err(), "a client trusting another CA got an answer");
        // The system roots do not know a private CA either.
        answers(&coordinator.url, Some(ClientTls::system()))
            .await
            .expect_err("trusted by the system roots");
        coordinator.stop().await;
    })
    .await;
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_of_its_ca() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let (ca, other) = (Ca::new(dir.path(), "dtx"), Ca::new(dir.path(), "other"));
        let (server, client) = (ca.server("server"), ca.client("client", "orders"));
        let stranger = other.client("stranger", "orders");
        let (_faults, bank_server) = bank(db).await;
        let flags = tls_flags(&server, Some(&ca));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator =
            InProcess::start_with_tls(&db.url, &flags, Some(trusting(&ca, Some(&client)))).await;
        run_tcc_and_saga(&coordinator.client().await, &bank_server.url(), "mtls").await;

        let url = &coordinator.url;
        answers(url, Some(trusting(&ca, None)))
            .await
            .expect_err("answered a client without a certificate");
        answers(url, Some(trusting(&ca, Some(&stranger))))
            .await
            .expect_err("answered a client certificate of another CA");
        answers(url, Some(trusting(&ca, Some(&client))))
            .await
            .expect("answers its own client");
        coordinator.stop().await;
    })
    .await;
}

/// A TLS client for raw requests: connects to `addr`, presents `identity` if given, and
/// returns the stream and the server's certificate.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &Ca,
    identity: Option<&Identity>,
    alpn: &[u8],
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    CertificateDer<'static>,
)> {
    let mut roots = rustls::RootCertStore::empty();
    let der = CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap();
    roots.add(der).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => {
            use rustls::pki_types::PrivateKeyDer;
            let cert = CertificateDer::from_pem_slice(id.cert_pem().as_bytes()).unwrap();
            let key = PrivateKeyDer::from_pem_slice(id.key_pem().as_bytes()).unwrap();
            builder.with_client_auth_cert(vec![cert], key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await?;
    let cert = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok((stream, cert))
}

use rustls::pki_types::pem::PemObject;

/// An HTTP/JSON Begin of `xid` on a connection that closes after the answer.
fn begin_request(xid: &str) -> String {
    let body = format!("{{\"xid\":\"{xid}\"}}");
    format!(
        "POST /dtx.v1.Coordinator/Begin HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The HTTP/JSON listener over mTLS: an HTTPS client with its certificate is answered, one
/// without is refused in the handshake, and a plain-text request is told to use https://.
#[tokio::test]
async fn the_http_listener_speaks_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "dtx");
    let (server, client) = (ca.server("server"), ca.client("client", "orders"));
    let http = free_addr().await;
    let mut flags = tls_flags(&server, Some(&ca));
    flags.extend(["--http-listen".into(), http.to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let coordinator =
        InProcess::start_with_tls(&store, &flags, Some(trusting(&ca, Some(&client)))).await;

    let request = begin_request("t-1");
    let (mut stream, _) = tls_connect(http, &ca, Some(&client), b"http/1.1")
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Without a client certificate: refused (in the handshake, or at the first read).
    let refused = async {
        let (mut stream, _) = tls_connect(http, &ca, None, b"http/1.1").await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    if let Ok(answer) = refused.await {
        assert!(!answer.contains("200"), "answered: {answer}");
    }

    // Plain text: a 400 that says why.
    let mut plain = tokio::net::TcpStream::connect(http).await.unwrap();
    plain.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).await.ok();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("use https://"), "{answer}");
    coordinator.stop().await;
}

/// Rotation: new certificate files are picked up without a restart; a call held on a
/// connection made before completes, a new connection gets the new certificate, and a file
/// that does not parse leaves the new certificate in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_live() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "dtx");
    let old = ca.server("server");
    let http = free_addr().await;
    let mut flags = tls_flags(&old, None);
    flags.extend(["--http-listen".into(), http.to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let coordinator = InProcess::start_with_tls(&store, &flags, Some(trusting(&ca, None))).await;
    let client = coordinator.client().await;
    let begin = begin_request("held");
    let (mut stream, first) = tls_connect(http, &ca, None, b"http/1.1").await.unwrap();
    stream.write_all(begin.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let old_der = CertificateDer::from_pem_slice(old.cert_pem().as_bytes()).unwrap();
    assert_eq!(first, old_der);

    // A call held across the rotation, on a connection made before it.
    let held = tokio::spawn(async move { client.wait("held", Duration::from_secs(6)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Replace the files (as cert-manager or certbot would).
    let new = ca.server("rotated");
    std::fs::copy(&new.key, &old.key).unwrap();
    std::fs::copy(&new.cert, &old.cert).unwrap();
    let new_der = CertificateDer::from_pem_slice(new.cert_pem().as_bytes()).unwrap();
    let mut seen = first;
    for _ in 0..100 {
        let (_, cert) = tls_connect(http, &ca, None, b"http/1.1").await.unwrap();
        seen = cert;
        if seen == new_der {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen == new_der,
        "new connections still get the old certificate"
    );

    // A broken certificate file: the rotated certificate stays in service.
    std::fs::write(&old.cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, cert) = tls_connect(http, &ca, None, b"http/1.1").await.unwrap();
    assert!(
        cert == new_der,
        "a broken file replaced the certificate in service"
    );

    let waited = held.await.unwrap().expect("the held call completes");
    assert_eq!(waited.xid, "held");
    coordinator.stop().await;
}

/// The bank serving TLS on `identity`, requiring client certificates of `ca`: its
/// `https://127.0.0.1:<port>` URL.
async fn tls_bank(db: &'static TestDb<Sqlite>, identity: &Identity, ca: &Ca) -> TlsBank {
    tls_bank_accepting(db, identity, ca, None).await
}

/// The bank's faults, its server (stops when dropped) and URL.
type TlsBank = (
    dtx_tests::participant::Faults,
    dtx_tests::net::RunningServer,
    String,
);

/// [`tls_bank`] taking calls only from certificates naming one of `callers`.
async fn tls_bank_accepting(
    db: &'static TestDb<Sqlite>,
    identity: &Identity,
    ca: &Ca,
    callers: Option<&[&str]>,
) -> TlsBank {
    use tonic::transport::{Certificate, Identity as TonicIdentity, Server, ServerTlsConfig};
    dtx_tests::ledger::create_tables(&db.pool).await;
    for account in ["alice", "bob"] {
        dtx_tests::ledger::open_account(&db.pool, account, START).await;
    }
    let faults = dtx_tests::participant::Faults::default();
    let tls = ServerTlsConfig::new()
        .identity(TonicIdentity::from_pem(
            identity.cert_pem(),
            identity.key_pem(),
        ))
        .client_ca_root(Certificate::from_pem(ca.pem()));
    let bank = dtx_tests::participant::Bank::accepting(db.pool.clone(), faults.clone(), callers);
    let server = dtx_tests::net::serve(
        Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(bank.into_service()),
    )
    .await;
    let url = format!("https://127.0.0.1:{}", server.addr.port());
    (faults, server, url)
}

/// Both directions over mTLS: the initiator's direct Try and the coordinator's Confirms and
/// saga actions reach a participant that requires a client certificate. A coordinator that
/// does not present one is refused by the participant (nothing runs, the step keeps being
/// retried), and one with no roots for `https://` targets does not call them and says why.
#[tokio::test]
async fn participants_are_called_over_mtls() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "dtx");
        let server = ca.server("server");
        let initiator = ca.client("initiator", "orders");
        let myself = ca.client("coordinator", "dtx-coordinator");
        let (_faults, _bank, bank_url) = tls_bank(db, &ca.server("bank"), &ca).await;
        let mut flags = tls_flags(&server, Some(&ca));
        let ca_file = ca.cert().display().to_string();
        flags.extend(participant_flags(&ca, &myself));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let tls = trusting(&ca, Some(&initiator));
        let coordinator = InProcess::start_with_tls(&db.url, &flags, Some(tls.clone())).await;
        run_tcc_and_saga(&coordinator.client().await, &bank_url, "mtls-both").await;
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await.0,
            START - 3
        );
        coordinator.stop().await;

        // Without its certificate, and without roots: the saga's step is not run.
        for (extra, says) in [
            (
                vec!["--participant-ca", ca_file.as_str()],
                "CertificateRequired",
            ),
            (vec![], "--participant-ca"),
        ] {
            let mut flags = tls_flags(&server, Some(&ca));
            flags.extend(extra.iter().map(|s| s.to_string()));
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let coordinator = InProcess::start_with_tls(&db.url, &flags, Some(tls.clone())).await;
            let client = coordinator.client().await;
            let xid = format!("refused-{}", extra.len());
            client
                .saga()
                .xid(&xid)
                .step(debit_alice("s1", &bank_url, 100))
                .submit()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let tx = client.get(&xid).await.unwrap();
            // Refused in the handshake: no answer, retried, then compensated; never sent (no
            // roots): compensated at once. Never succeeded.
            assert!(
                matches!(
                    tx.status(),
                    TxStatus::Running | TxStatus::Compensating | TxStatus::Compensated
                ),
                "{tx:?}"
            );
            let error = &tx.branches[0].last_error;
            assert!(error.contains(says), "{says:?} not in {error:?}");
            assert_eq!(
                dtx_tests::ledger::effects(&db.pool, &xid, "s1", "action").await,
                0
            );
            coordinator.stop().await;
        }
    })
    .await;
}

/// An HTTP/JSON participant over mTLS: the coordinator's saga actions reach it with the
/// participant CA and the coordinator's client certificate (ALPN http/1.1).
#[tokio::test]
async fn http_json_participants_are_called_over_mtls() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "dtx");
        let myself = ca.client("coordinator", "dtx-coordinator");
        let bank_identity = ca.server("bank");
        dtx_tests::ledger::create_tables(&db.pool).await;
        dtx_tests::ledger::open_account(&db.pool, "alice", START).await;
        let bank = dtx_tests::participant::Bank::new(
            db.pool.clone(),
            dtx_tests::participant::Faults::default(),
        );
        let url = dtx_tests::net::serve_https_json(bank, mtls_server(&ca, &bank_identity)).await;
        let flags = participant_flags(&ca, &myself);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator = InProcess::start(&db.url, &flags).await;
        let outcome = coordinator
            .client()
            .await
            .saga()
            .xid("https-json")
            .step(debit_alice("s1", &url, 7))
            .submit()
            .await
            .unwrap()
            .await_outcome(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(outcome.status(), TxStatus::Succeeded, "{outcome:?}");
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await.0,
            START - 7
        );
        coordinator.stop().await;
    })
    .await;
}

/// A participant that accepts only the coordinator's identity (`accept_callers`): a
/// coordinator whose certificate (of the same CA) names another service is refused with
/// PERMISSION_DENIED and nothing runs; the real one is served.
#[tokio::test]
async fn a_participant_refuses_a_coordinator_of_another_name() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "dtx");
        let accepted: &[&str] = &["dtx-coordinator"];
        let (_faults, _bank, bank_url) =
            tls_bank_accepting(db, &ca.server("bank"), &ca, Some(accepted)).await;
        for (name, succeeds) in [("imposter", false), ("dtx-coordinator", true)] {
            let identity = ca.client(name, name);
            let flags = participant_flags(&ca, &identity);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let coordinator = InProcess::start(&db.url, &flags).await;
            let client = coordinator.client().await;
            let xid = format!("caller-{name}");
            client
                .saga()
                .xid(&xid)
                .step(debit_alice("s1", &bank_url, 1))
                .submit()
                .await
                .unwrap();
            let tx = client.wait(&xid, Duration::from_secs(2)).await.unwrap();
            let actions = dtx_tests::ledger::effects(&db.pool, &xid, "s1", "action").await;
            if succeeds {
                assert_eq!(tx.status(), TxStatus::Succeeded, "{tx:?}");
                assert_eq!(actions, 1);
            } else {
                assert_ne!(tx.status(), TxStatus::Succeeded, "{tx:?}");
                assert_eq!(actions, 0, "the imposter's call ran");
                let error = &tx.branches[0].last_error;
                assert!(
                    error.contains("names none of the accepted callers"),
                    "{error}"
                );
            }
            coordinator.stop().await;
        }
    })
    .await;
}

/// Alert webhooks over mTLS: a receiver with a private CA that requires the coordinator's
/// certificate gets the parked alert (the webhook client trusts the participant CA besides the
/// system's roots, and presents the participant client certificate).
#[tokio::test]
async fn alert_webhooks_are_sent_over_mtls() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "dtx");
        let (receiver_identity, myself) = (
            ca.server("receiver"),
            ca.client("coordinator", "dtx-coordinator"),
        );
        let receiver =
            dtx_tests::webhook::Receiver::start_tls(mtls_server(&ca, &receiver_identity)).await;
        assert!(receiver.url.starts_with("https://"), "{}", receiver.url);
        let mut flags = vec!["--alert-webhook".to_string(), receiver.url.clone()];
        flags.extend(participant_flags(&ca, &myself));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let w = dtx_tests::world::World::start(db, &flags).await;
        w.park("alerted", "alice", dtx_tests::participant::Fault::Refuse)
            .await;
        let mut got = Vec::new();
        for _ in 0..100 {
            got = receiver.received();
            if !got.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let parked: Vec<_> = got.iter().filter(|r| r.event["xid"] == "alerted").collect();
        assert!(!parked.is_empty(), "no alert over mTLS: {got:?}");
    })
    .await;
}

/// The coordinator's participant certificate is re-read when its files change: a participant
/// that accepts only `dtx-coordinator` refuses the first certificate (it names an imposter)
/// and takes the calls made after the files were replaced, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_participant_certificate_reloads() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "dtx");
        let accepted: &[&str] = &["dtx-coordinator"];
        let (_faults, _bank, bank_url) =
            tls_bank_accepting(db, &ca.server("bank"), &ca, Some(accepted)).await;
        let presented = ca.client("presented", "imposter");
        let flags = participant_flags(&ca, &presented);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator = InProcess::start(&db.url, &flags).await;
        let client = coordinator.client().await;
        let saga = |xid: String| {
            let client = client.clone();
            let bank_url = bank_url.clone();
            async move {
                client
                    .saga()
                    .xid(&xid)
                    .step(debit_alice("s1", &bank_url, 1))
                    .submit()
                    .await
                    .unwrap();
                client.wait(&xid, Duration::from_secs(1)).await.unwrap()
            }
        };
        let before = saga("before".into()).await;
        assert_ne!(before.status(), TxStatus::Succeeded, "{before:?}");

        // Replace the files (key first, as a renewal would), no restart.
        let renewed = ca.client("renewed", "dtx-coordinator");
        std::fs::copy(&renewed.key, &presented.key).unwrap();
        std::fs::copy(&renewed.cert, &presented.cert).unwrap();
        let mut after = None;
        for i in 0..20 {
            let tx = saga(format!("after-{i}")).await;
            if tx.status() == TxStatus::Succeeded {
                after = Some(tx);
                break;
            }
        }
        assert!(after.is_some(), "calls still present the old certificate");
        coordinator.stop().await;
    })
    .await;
}
