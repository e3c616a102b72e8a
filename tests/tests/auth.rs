//! Who may call, against a real coordinator with auth on: every Coordinator and Admin RPC, over
//! gRPC and HTTP/JSON alike, refused without a token, with a forged, expired or foreign-audience
//! one, with a role that does not allow it, and (NOT_FOUND) for another tenant's transaction -
//! nothing stored in any case; two tenants using the same xid; branch calls the participant
//! obeys only when the coordinator signed them for exactly that call.

use std::time::Duration;

use dtx_proto::auth::CALL_TOKEN;
use dtx_proto::v1 as wire;
use dtx_proto::v1::admin_client::AdminClient;
use dtx_proto::v1::coordinator_client::CoordinatorClient;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_sdk::client::{Coordinator, TccBranch, TccOptions};
use dtx_tests::auth::{AuthKeys, claims};
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestBackend, TestDb, with_db};
use dtx_tests::net::{RunningServer, free_addr, serve_on};
use dtx_tests::participant::{Bank, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START};
use serde_json::json;
use tonic::Code;
use tonic::transport::Server;

type Sqlite = dtx_sql::sqlx::Sqlite;

/// Every RPC of both services, with a request that would store something (or read a
/// transaction) if it were allowed.
fn requests(xid: &str, bank: &str) -> Vec<(&'static str, serde_json::Value)> {
    let step = json!([{"name": "s1", "target": bank, "handler": "debit"}]);
    vec![
        (
            "dtx.v1.Coordinator/Begin",
            json!({"xid": format!("{xid}-new"), "timeoutMs": 60000}),
        ),
        (
            "dtx.v1.Coordinator/RegisterBranch",
            json!({"xid": xid, "branchId": "b9", "target": bank, "handler": "transfer"}),
        ),
        ("dtx.v1.Coordinator/Commit", json!({"xid": xid})),
        ("dtx.v1.Coordinator/Rollback", json!({"xid": xid})),
        (
            "dtx.v1.Coordinator/SubmitSaga",
            json!({"xid": format!("{xid}-saga"), "steps": step}),
        ),
        ("dtx.v1.Coordinator/Get", json!({"xid": xid})),
        (
            "dtx.v1.Coordinator/Wait",
            json!({"xid": xid, "timeoutMs": 10}),
        ),
        ("dtx.v1.Coordinator/Resume", json!({"xid": xid})),
        (
            "dtx.v1.Coordinator/PrepareMessage",
            json!({
                "xid": format!("{xid}-msg"),
                "branches": [{"name": "m1", "target": bank, "handler": "credit"}],
                "checkBack": {"target": bank, "handler": "check"},
            }),
        ),
        ("dtx.v1.Coordinator/SubmitMessage", json!({"xid": xid})),
        ("dtx.v1.Coordinator/AbortMessage", json!({"xid": xid})),
        ("dtx.v1.Admin/ListTransactions", json!({})),
        ("dtx.v1.Admin/DescribeTransaction", json!({"xid": xid})),
        ("dtx.v1.Admin/Stats", json!({})),
        ("dtx.v1.Admin/Resume", json!({"xid": xid, "reason": "test"})),
        (
            "dtx.v1.Admin/ForceRollback",
            json!({"xid": xid, "reason": "test"}),
        ),
        (
            "dtx.v1.Admin/RetryNow",
            json!({"xid": xid, "reason": "test"}),
        ),
    ]
}

/// The code of `rpc` over gRPC with `body` and `token` (`Ok` when it succeeded).
async fn grpc(url: &str, rpc: &str, body: serde_json::Value, token: Option<&str>) -> Code {
    dtx_tests::rpc::grpc(url, rpc, body, token)
        .await
        .err()
        .map_or(Code::Ok, |s| s.code())
}

/// The code of `rpc` over HTTP/JSON (from its problem body).
async fn http(base: &str, rpc: &str, body: serde_json::Value, token: Option<&str>) -> Code {
    match dtx_tests::rpc::http(base, rpc, body, token).await {
        Ok(()) => Code::Ok,
        Err(problem) => {
            dtx_proto::http::code_named(&problem.code).unwrap_or_else(|| panic!("{problem:?}"))
        }
    }
}

/// Rows in every coordinator table: a refused call must not change it.
async fn stored<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    use dtx_sql::SqlRow as _;
    let rows = db
        .rows(
            "SELECT (SELECT COUNT(*) FROM dtx_global) + (SELECT COUNT(*) FROM dtx_branch) + \
             (SELECT COUNT(*) FROM dtx_history) + (SELECT COUNT(*) FROM dtx_barrier)",
        )
        .await;
    rows[0].i64(0).unwrap()
}

/// The bank at a URL it knows before serving (its call verifier names it), obeying only the
/// coordinator when `keys` is given.
async fn bank<DB: TestBackend>(
    db: &'static TestDb<DB>,
    keys: Option<&AuthKeys>,
) -> (String, RunningServer) {
    dtx_tests::ledger::create_tables(&db.pool).await;
    for account in ["alice", "bob"] {
        dtx_tests::ledger::open_account(&db.pool, account, START).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let verifier = keys.map(|k| k.verifier(&[&url]));
    let bank = Bank::configured(
        db.pool.clone(),
        Faults::default(),
        |server| match verifier {
            Some(v) => server.verify_calls(v),
            None => server,
        },
    );
    let server = serve_on(listener, Server::builder().add_service(bank.into_service()));
    (url, server)
}

/// A coordinator with auth on (and signed branch calls, plus `extra` flags) on the test's
/// database, and a bank that obeys only it.
struct Setup {
    keys: AuthKeys,
    bank_url: String,
    coordinator: InProcess,
    _bank: RunningServer,
    _dir: tempfile::TempDir,
}

async fn setup<DB: TestBackend>(db: &'static TestDb<DB>, extra: &[String]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let keys = AuthKeys::new(dir.path());
    let (bank_url, bank) = bank(db, Some(&keys)).await;
    let mut flags = keys.flags();
    flags.extend_from_slice(extra);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coordinator = InProcess::start(&db.url, &flags).await;
    Setup {
        keys,
        bank_url,
        coordinator,
        _bank: bank,
        _dir: dir,
    }
}

/// Begins `{prefix}-1` and `{prefix}-2` as `token`'s tenant, then `{prefix}-3`, which must be
/// RESOURCE_EXHAUSTED with nothing stored: its status.
async fn third_begin_refused<DB: TestBackend>(
    db: &TestDb<DB>,
    s: &Setup,
    token: &str,
    prefix: &str,
) -> tonic::Status {
    let url = &s.coordinator.url;
    for i in 1..=2 {
        let begin = json!({"xid": format!("{prefix}-{i}"), "timeoutMs": 60000});
        let code = grpc(url, "dtx.v1.Coordinator/Begin", begin, Some(token)).await;
        assert_eq!(code, Code::Ok);
    }
    let before = stored(db).await;
    let mut client = CoordinatorClient::connect(url.clone()).await.unwrap();
    let mut request = tonic::Request::new(wire::BeginRequest {
        xid: format!("{prefix}-3"),
        timeout_ms: 60_000,
    });
    request.metadata_mut().insert(
        "authorization",
        dtx_proto::auth::bearer_value(token).unwrap(),
    );
    let refused = client.begin(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(stored(db).await, before, "a refused begin stored something");
    refused
}

/// Initiator tokens of two tenants, `acme` and `globex`.
fn two_tenants(s: &Setup) -> (String, String) {
    let initiator = |tenant| s.keys.jwt("orders", tenant, &["initiator"]);
    (initiator("acme"), initiator("globex"))
}

/// A committed TCC of `client`'s tenant moving `amount` from alice, waited for.
async fn commit_tcc(client: &Coordinator, xid: &str, bank: &str, amount: i64) -> wire::Transaction {
    let options = TccOptions {
        xid: Some(xid.into()),
        ..TccOptions::default()
    };
    let tx = client.begin(options).await.unwrap();
    tx.call(TccBranch::new(bank, "transfer", payload("alice", amount)).id("b1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    client.wait(xid, Duration::from_secs(10)).await.unwrap()
}

#[tokio::test]
async fn every_rpc_refuses_a_caller_it_cannot_trust_and_stores_nothing() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let http_addr = free_addr().await;
        let s = setup(db, &["--http-listen".into(), http_addr.to_string()]).await;
        let (keys, bank_url, coordinator) = (&s.keys, &s.bank_url, &s.coordinator);
        // Appended to the token file: the coordinator re-reads it within 2 s.
        let operator_token = keys.opaque("o", "acme", &["operator"]);
        let base = format!("http://{http_addr}");

        // acme's transaction, committed (so nothing moves in the background while counting).
        let acme = coordinator
            .client()
            .await
            .with_token(&keys.jwt("orders", "acme", &["initiator"]))
            .unwrap();
        let done = commit_tcc(&acme, "order-1", bank_url, 5).await;
        assert_eq!(done.status(), wire::TxStatus::Committed);
        // The operator's token is known once the file was re-read.
        let probe = |token: String| {
            let body = json!({});
            async move { grpc(&coordinator.url, "dtx.v1.Admin/Stats", body, Some(&token)).await }
        };
        let mut known = false;
        for _ in 0..50 {
            known = probe(operator_token.clone()).await == Code::Ok;
            if known {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(known, "the token file was not re-read within 5 s");

        let now = dtx_tests::auth::now();
        let expired = {
            let mut c = claims("orders", "acme", &["initiator", "operator", "reader"]);
            c["exp"] = json!(now - 600);
            c["iat"] = json!(now - 4000);
            keys.jwt_with(c)
        };
        let wrong_audience = {
            let mut c = claims("orders", "acme", &["initiator", "operator", "reader"]);
            c["aud"] = json!("another-service");
            keys.jwt_with(c)
        };
        let wrong_issuer = {
            let mut c = claims("orders", "acme", &["initiator", "operator", "reader"]);
            c["iss"] = json!("https://evil.test");
            keys.jwt_with(c)
        };
        let forged = keys.forged_jwt("orders", "acme", &["initiator", "operator", "reader"]);
        let no_roles = keys.jwt("nobody", "acme", &[]);
        let role_tokens = [
            ("initiator", keys.jwt("i", "acme", &["initiator"])),
            ("operator", operator_token),
            ("reader", keys.jwt("r", "acme", &["reader"])),
        ];
        let other_tenant = keys.jwt("globex-ops", "globex", &["initiator", "operator", "reader"]);

        // The sweep covers every RPC of the table (which a unit test holds to the proto).
        let swept: std::collections::BTreeSet<&str> = requests("order-1", bank_url)
            .iter()
            .map(|(rpc, _)| *rpc)
            .collect();
        let tabled: std::collections::BTreeSet<&str> = dtx_coordinator::auth::RPC_ROLES
            .iter()
            .map(|(rpc, _)| *rpc)
            .filter(|rpc| rpc.starts_with("dtx.v1."))
            .collect();
        assert_eq!(swept, tabled, "an RPC the sweep does not try");

        let before = stored(db).await;
        let mut checked = 0;
        for (rpc, body) in requests("order-1", bank_url) {
            let allowed = dtx_coordinator::auth::roles_for(rpc);
            let mut cases: Vec<(String, Option<&str>, Code)> = vec![
                ("no token".into(), None, Code::Unauthenticated),
                ("garbage".into(), Some("not-a-token"), Code::Unauthenticated),
                (
                    "forged signature".into(),
                    Some(&forged),
                    Code::Unauthenticated,
                ),
                ("expired".into(), Some(&expired), Code::Unauthenticated),
                (
                    "wrong audience".into(),
                    Some(&wrong_audience),
                    Code::Unauthenticated,
                ),
                (
                    "wrong issuer".into(),
                    Some(&wrong_issuer),
                    Code::Unauthenticated,
                ),
                ("no role".into(), Some(&no_roles), Code::PermissionDenied),
            ];
            for (role, token) in &role_tokens {
                if !allowed.iter().any(|r| r.as_str() == *role) {
                    cases.push((format!("role {role}"), Some(token), Code::PermissionDenied));
                }
            }
            // Another tenant's transaction does not exist for this caller.
            if body.get("xid").and_then(|x| x.as_str()) == Some("order-1") {
                cases.push(("other tenant".into(), Some(&other_tenant), Code::NotFound));
            }
            for (case, token, expected) in cases {
                for via in ["grpc", "http"] {
                    let code = match via {
                        "grpc" => grpc(&coordinator.url, rpc, body.clone(), token).await,
                        _ => http(&base, rpc, body.clone(), token).await,
                    };
                    assert_eq!(code, expected, "{rpc} over {via} with {case}");
                    assert_eq!(
                        stored(db).await,
                        before,
                        "{rpc} over {via} with {case} stored"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 17 * 2 * 7, "{checked}");

        // The token file's operator acts; the action is recorded under its subject.
        let (_, operator) = &role_tokens[1];
        let mut admin = AdminClient::new(
            tonic::transport::Channel::from_shared(coordinator.url.clone())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
        let mut list = tonic::Request::new(wire::ListTransactionsRequest::default());
        list.metadata_mut().insert(
            "authorization",
            dtx_proto::auth::bearer_value(operator).unwrap(),
        );
        let listed = admin.list_transactions(list).await.unwrap().into_inner();
        let xids: Vec<&str> = listed.transactions.iter().map(|t| t.xid.as_str()).collect();
        assert_eq!(xids, ["order-1"]);
        s.coordinator.stop().await;
    })
    .await;
}

#[tokio::test]
async fn two_tenants_use_the_same_xid_apart() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let s = setup(db, &[]).await;
        let (keys, bank_url) = (&s.keys, &s.bank_url);
        let client = s.coordinator.client().await;
        let acme = client
            .clone()
            .with_token(&keys.jwt("orders", "acme", &["initiator"]))
            .unwrap();
        let globex = client
            .clone()
            .with_token(&keys.jwt("orders", "globex", &["initiator"]))
            .unwrap();
        let a = commit_tcc(&acme, "order-7", bank_url, 10).await;
        let g = commit_tcc(&globex, "order-7", bank_url, 20).await;
        assert_eq!(a.status(), wire::TxStatus::Committed);
        assert_eq!(g.status(), wire::TxStatus::Committed);
        // Each caller sees its own under the xid it chose.
        assert_eq!(a.xid, "order-7");
        assert_eq!(acme.get("order-7").await.unwrap().branches.len(), 1);
        // Both moved money: the participant's barrier kept them apart.
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await,
            (START - 30, 0)
        );
        for (scoped, n) in [("acme/order-7", 1), ("globex/order-7", 1), ("order-7", 0)] {
            let confirms = dtx_tests::ledger::effects(&db.pool, scoped, "b1", "confirm").await;
            assert_eq!(confirms, n, "{scoped}");
        }
        // A third tenant does not see it.
        let initech = client
            .clone()
            .with_token(&keys.jwt("orders", "initech", &["initiator"]))
            .unwrap();
        let missing = initech.get("order-7").await.unwrap_err();
        assert!(matches!(missing, dtx_sdk::Error::Rpc(ref e) if e.code() == Code::NotFound));
        s.coordinator.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_participant_obeys_only_calls_the_coordinator_signed_for_them() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let s = setup(db, &[]).await;
        let (keys, bank_url, coordinator) = (&s.keys, s.bank_url.clone(), &s.coordinator);
        let token = keys.jwt("orders", "default", &["initiator"]);
        let client = coordinator.client().await.with_token(&token).unwrap();

        // The SDK forwards the coordinator's Try token; Confirm and saga calls are signed.
        let done = commit_tcc(&client, "signed-1", &bank_url, 4).await;
        assert_eq!(done.status(), wire::TxStatus::Committed);
        let saga = client
            .saga()
            .xid("signed-saga")
            .step(dtx_tests::world::debit_alice("s1", &bank_url, 3))
            .run(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(saga.status(), wire::TxStatus::Succeeded);
        assert_eq!(
            dtx_tests::ledger::account(&db.pool, "alice").await,
            (START - 7, 0)
        );

        // A real Try token, from a registration, replayed for another action or branch.
        let mut raw = CoordinatorClient::connect(coordinator.url.clone())
            .await
            .unwrap();
        let mut register = tonic::Request::new(wire::RegisterBranchRequest {
            xid: "replay-1".into(),
            branch_id: "b1".into(),
            target: bank_url.clone(),
            handler: "transfer".into(),
            payload: payload("alice", 50),
            begin_timeout_ms: 60_000,
            ..Default::default()
        });
        register.metadata_mut().insert(
            "authorization",
            dtx_proto::auth::bearer_value(&token).unwrap(),
        );
        let registered = raw.register_branch(register).await.unwrap().into_inner();
        assert!(!registered.try_token.is_empty());
        let forged = {
            let other = ed25519_dalek::SigningKey::from_bytes(&[99; 32]);
            use ed25519_dalek::pkcs8::EncodePrivateKey;
            let pem = other.to_pkcs8_pem(Default::default()).unwrap();
            dtx_proto::auth::CallSigner::from_pem(&pem)
                .unwrap()
                .sign(
                    &bank_url,
                    dtx_proto::auth::Call {
                        xid: "replay-1",
                        branch: "b1",
                        action: "CONFIRM",
                        handler: "transfer",
                    },
                )
                .unwrap()
        };
        let before = stored(db).await;
        let mut participant = ParticipantClient::connect(bank_url.clone()).await.unwrap();
        for (case, action, branch, token) in [
            ("no token", wire::BranchAction::Confirm, "b1", None),
            (
                "forged",
                wire::BranchAction::Confirm,
                "b1",
                Some(forged.as_str()),
            ),
            (
                "try token as confirm",
                wire::BranchAction::Confirm,
                "b1",
                Some(registered.try_token.as_str()),
            ),
            (
                "try token for another branch",
                wire::BranchAction::Try,
                "b2",
                Some(registered.try_token.as_str()),
            ),
        ] {
            let mut call = tonic::Request::new(wire::BranchRequest {
                xid: "replay-1".into(),
                branch_id: branch.into(),
                action: action as i32,
                handler: "transfer".into(),
                payload: payload("alice", 50),
                headers: Default::default(),
            });
            if let Some(token) = token {
                call.metadata_mut()
                    .insert(CALL_TOKEN, token.parse().unwrap());
            }
            let refused = participant.branch(call).await.unwrap_err();
            assert_eq!(refused.code(), Code::Unauthenticated, "{case}: {refused:?}");
            assert_eq!(stored(db).await, before, "{case} wrote something");
        }
        // The real token for exactly its call is obeyed.
        let mut call = tonic::Request::new(wire::BranchRequest {
            xid: "replay-1".into(),
            branch_id: "b1".into(),
            action: wire::BranchAction::Try as i32,
            handler: "transfer".into(),
            payload: payload("alice", 50),
            headers: Default::default(),
        });
        call.metadata_mut()
            .insert(CALL_TOKEN, registered.try_token.parse().unwrap());
        let answer = participant.branch(call).await.unwrap().into_inner();
        assert_eq!(answer.outcome(), wire::Outcome::Success);
        s.coordinator.stop().await;
    })
    .await;
}

/// Quotas per tenant: past its begins per second a tenant is RESOURCE_EXHAUSTED (gRPC with
/// `retry-after` metadata, HTTP/JSON 429 with `Retry-After`), nothing stored, counted by
/// tenant; another tenant is not charged; after the wait it may begin again.
async fn a_tenant_past_its_quota_waits_and_others_do_not<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (http_addr, metrics_addr) = (free_addr().await, free_addr().await);
    let extra = [
        "--quota-begins-per-second",
        "2",
        "--http-listen",
        &http_addr.to_string(),
        "--metrics-listen",
        &metrics_addr.to_string(),
    ]
    .map(String::from);
    let s = setup(db, &extra).await;
    let (acme, globex) = two_tenants(&s);
    let begin = |xid: &str| json!({"xid": xid, "timeoutMs": 60000});
    let url = &s.coordinator.url;
    let refused = third_begin_refused(db, &s, &acme, "q").await;
    assert!(
        refused.message().contains("--quota-begins-per-second"),
        "{refused:?}"
    );
    assert_eq!(refused.metadata().get("retry-after").unwrap(), "1");
    let before = stored(db).await;
    let answer = reqwest::Client::new()
        .post(format!("http://{http_addr}/dtx.v1.Coordinator/Begin"))
        .bearer_auth(&acme)
        .header("content-type", "application/json")
        .body(begin("q-4").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    assert_eq!(stored(db).await, before, "a refused begin stored something");
    // Another tenant is not charged for acme's calls.
    assert_eq!(
        grpc(url, "dtx.v1.Coordinator/Begin", begin("q-1"), Some(&globex)).await,
        Code::Ok
    );
    let scrape = reqwest::get(format!("http://{metrics_addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = scrape
        .lines()
        .find(|l| l.starts_with("dtx_quota_rejections_total{") && l.contains("\"acme\""))
        .unwrap_or_else(|| panic!("no rejection counted:\n{scrape}"));
    assert!(line.ends_with(" 2"), "{line}");
    // After the wait, acme begins again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        grpc(url, "dtx.v1.Coordinator/Begin", begin("q-5"), Some(&acme)).await,
        Code::Ok
    );
    s.coordinator.stop().await;
}
test_on_all_databases!(a_tenant_past_its_quota_waits_and_others_do_not, SCHEMAS);

/// Transactions in flight per tenant: past its limit a tenant's begin is RESOURCE_EXHAUSTED
/// naming the flag, nothing stored; another tenant is not charged; once one of its
/// transactions finished (and the count was read again) it may begin again.
async fn a_tenant_with_its_limit_in_flight_begins_no_more<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let extra = ["--quota-transactions-in-flight", "2"].map(String::from);
    let s = setup(db, &extra).await;
    let (acme, globex) = two_tenants(&s);
    let begin = |xid: &str| json!({"xid": xid, "timeoutMs": 60000});
    let url = &s.coordinator.url;
    let refused = third_begin_refused(db, &s, &acme, "f").await;
    assert!(
        refused.message().contains(
            "has 2 transactions in flight, its limit is 2 (--quota-transactions-in-flight)"
        ),
        "{refused:?}"
    );
    assert_eq!(refused.metadata().get("retry-after").unwrap(), "1");
    assert_eq!(
        grpc(url, "dtx.v1.Coordinator/Begin", begin("f-1"), Some(&globex)).await,
        Code::Ok
    );
    // One of acme's finishes; after the count is read again, acme begins again.
    assert_eq!(
        grpc(
            url,
            "dtx.v1.Coordinator/Rollback",
            json!({"xid": "f-1"}),
            Some(&acme)
        )
        .await,
        Code::Ok
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        grpc(url, "dtx.v1.Coordinator/Begin", begin("f-3"), Some(&acme)).await,
        Code::Ok
    );
    s.coordinator.stop().await;
}
test_on_all_databases!(a_tenant_with_its_limit_in_flight_begins_no_more, SCHEMAS);

/// Payload bytes per minute: a saga whose step payloads take the tenant past its allowance is
/// RESOURCE_EXHAUSTED naming the flag, with the wait in `retry-after`, and is not stored;
/// another tenant is not charged.
async fn a_tenant_past_its_payload_bytes_is_refused_unstored<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let extra = ["--quota-payload-bytes-per-minute", "1000"].map(String::from);
    let s = setup(db, &extra).await;
    let mut client = CoordinatorClient::connect(s.coordinator.url.clone())
        .await
        .unwrap();
    let submit = |token: &str, xid: &str, bytes: usize| {
        let mut request = tonic::Request::new(wire::SubmitSagaRequest {
            xid: xid.into(),
            steps: vec![wire::SagaStep {
                name: "s1".into(),
                target: s.bank_url.clone(),
                handler: "debit".into(),
                action_payload: payload("alice", 1)
                    .into_iter()
                    .chain(std::iter::repeat_n(b' ', bytes))
                    .collect(),
                ..Default::default()
            }],
            timeout_ms: 60_000,
            ..Default::default()
        });
        request.metadata_mut().insert(
            "authorization",
            dtx_proto::auth::bearer_value(token).unwrap(),
        );
        request
    };
    let (acme, globex) = two_tenants(&s);
    client.submit_saga(submit(&acme, "p-1", 800)).await.unwrap();
    let refused = client
        .submit_saga(submit(&acme, "p-2", 300))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("more than 1000 payload bytes per minute (--quota-payload-bytes-per-minute)"),
        "{refused:?}"
    );
    let wait: u64 = refused
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "retry-after {wait}");
    let mut get = tonic::Request::new(wire::GetRequest { xid: "p-2".into() });
    get.metadata_mut().insert(
        "authorization",
        dtx_proto::auth::bearer_value(&acme).unwrap(),
    );
    let missing = client.get(get).await.unwrap_err();
    assert_eq!(
        missing.code(),
        Code::NotFound,
        "the refused saga was stored"
    );
    client
        .submit_saga(submit(&globex, "p-2", 300))
        .await
        .unwrap();
    s.coordinator.stop().await;
}
test_on_all_databases!(a_tenant_past_its_payload_bytes_is_refused_unstored, SCHEMAS);
