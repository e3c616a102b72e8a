//! The coordinator over HTTP/JSON (`--http-listen`), driven by a plain HTTP client the way a
//! service in another language would, against participants that speak HTTP/JSON too: a whole
//! TCC and sagas, the bad-input table with its HTTP statuses and problem bodies, and a check
//! that every RPC of the proto has its route.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use dtx_sdk::barrier::Action;
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestBackend, TestDb, with_db};
use dtx_tests::ledger;
use dtx_tests::net::{free_addr, serve_http_json};
use dtx_tests::participant::{Bank, Fault, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, START};
use serde_json::{Value, json};

/// A coordinator with the HTTP/JSON interface; its base URL.
async fn coordinator(store: &str) -> (InProcess, String) {
    let addr = free_addr().await.to_string();
    let coordinator = InProcess::start(store, &["--http-listen", &addr]).await;
    (coordinator, format!("http://{addr}"))
}

/// The bank (barrier-backed ledger, fault injection) as an HTTP/JSON participant.
async fn http_bank<DB: TestBackend>(db: &'static TestDb<DB>) -> (Faults, String) {
    ledger::create_tables(&db.pool).await;
    for account in ["alice", "bob"] {
        ledger::open_account(&db.pool, account, START).await;
    }
    let faults = Faults::default();
    let url = serve_http_json(Bank::new(db.pool.clone(), faults.clone())).await;
    (faults, url)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// POSTs `body` to `url`: the HTTP status, the `content-type`, the `dtx-status` header and
/// the JSON answer.
async fn post(url: &str, body: &Value) -> (u16, String, Option<String>, Value) {
    post_raw(url, body.to_string()).await
}

async fn post_raw(url: &str, body: String) -> (u16, String, Option<String>, Value) {
    let answer = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("HTTP call");
    let status = answer.status().as_u16();
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let content_type = header("content-type").unwrap_or_default();
    let dtx_status = header("dtx-status");
    let bytes = answer.bytes().await.expect("answer body");
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, content_type, dtx_status, json)
}

/// Calls `/dtx.v1.Coordinator/<method>` and expects 200: its JSON answer.
async fn rpc(base: &str, method: &str, body: Value) -> Value {
    let (status, _, _, json) = post(&format!("{base}/dtx.v1.Coordinator/{method}"), &body).await;
    assert_eq!(status, 200, "{method} {body}: {json}");
    json
}

/// A TCC over plain HTTP: Begin, RegisterBranch with an HTTP target, the initiator's own Try
/// POSTed to the participant, Commit-and-wait. The first Confirm is answered with an
/// UNAVAILABLE problem (an unknown outcome), so the coordinator must retry it; the money
/// moves once. Then a saga whose second step refuses: the first is compensated.
async fn tcc_and_saga_over_http<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (faults, bank) = http_bank(db).await;
    let (_coordinator, base) = coordinator(&db.url).await;
    let xid = "http-tcc-1";
    let begun = rpc(&base, "Begin", json!({"xid": xid, "timeoutMs": 30000})).await;
    assert_eq!(begun["status"], "TX_STATUS_TRYING", "{begun}");
    let amount = b64(&payload("alice", 10));
    rpc(
        &base,
        "RegisterBranch",
        json!({"xid": xid, "branchId": "b1", "target": bank, "handler": "transfer", "payload": amount}),
    )
    .await;
    let (status, _, _, tried) = post(
        &bank,
        &json!({"xid": xid, "branchId": "b1", "action": "BRANCH_ACTION_TRY", "handler": "transfer", "payload": amount}),
    )
    .await;
    assert_eq!(
        (status, &tried["outcome"]),
        (200, &json!("OUTCOME_SUCCESS")),
        "{tried}"
    );
    faults.push("b1", Action::Confirm, [Fault::UnavailableBefore]);
    let committed = rpc(
        &base,
        "Commit",
        json!({"xid": xid, "wait": true, "waitTimeoutMs": 20000}),
    )
    .await;
    assert_eq!(committed["status"], "TX_STATUS_COMMITTED", "{committed}");
    assert_eq!(
        faults.calls("b1", Action::Confirm),
        2,
        "the unknown Confirm is retried"
    );
    assert_eq!(ledger::effects(&db.pool, xid, "b1", "confirm").await, 1);
    assert_eq!(ledger::account(&db.pool, "alice").await, (START - 10, 0));
    // Commit again: idempotent, same answer.
    let again = rpc(&base, "Commit", json!({"xid": xid})).await;
    assert_eq!(again["status"], "TX_STATUS_COMMITTED");

    let saga = "http-saga-1";
    faults.push("credit-bob", Action::Action, [Fault::Refuse]);
    let submitted = rpc(
        &base,
        "SubmitSaga",
        json!({
            "xid": saga,
            "steps": [
                {"name": "debit-alice", "target": bank, "handler": "debit", "actionPayload": b64(&payload("alice", 5))},
                {"name": "credit-bob", "target": bank, "handler": "credit", "actionPayload": b64(&payload("bob", 5))},
            ],
            "retry": {"initialBackoffMs": 10},
            "waitTimeoutMs": 20000,
        }),
    )
    .await;
    assert_eq!(
        submitted["transaction"]["status"], "TX_STATUS_COMPENSATED",
        "{submitted}"
    );
    assert_eq!(
        ledger::effects(&db.pool, saga, "debit-alice", "compensate").await,
        1
    );
    assert_eq!(ledger::account(&db.pool, "alice").await, (START - 10, 0));
    assert_eq!(ledger::account(&db.pool, "bob").await, (START, 0));
    let got = rpc(&base, "Get", json!({"xid": saga})).await;
    assert_eq!(got["kind"], "TX_KIND_SAGA");
    assert_eq!(got["branches"].as_array().map(Vec::len), Some(2), "{got}");
}

test_on_all_databases!(tcc_and_saga_over_http, SCHEMAS);

/// The bad-input table over HTTP: each row's HTTP status, gRPC code name, a part of the
/// message, and nothing stored.
#[tokio::test]
async fn bad_input_gets_the_status_and_problem_of_its_grpc_code() {
    with_db::<dtx_sql::sqlx::Sqlite, _, _>(SCHEMAS, |db| async move {
        let (_coordinator, base) = coordinator(&db.url).await;
        let target = "http://127.0.0.1:1/dtx/branch";
        rpc(&base, "Begin", json!({"xid": "decided"})).await;
        rpc(&base, "Commit", json!({"xid": "decided"})).await;
        let long = "x".repeat(300);
        let step = |name: &str, deps: &[&str]| {
            json!({"name": name, "target": target, "handler": "h", "dependsOn": deps})
        };
        let rows: Vec<(&str, String, u16, &str, &str)> = vec![
            ("Begin", json!({"xid": long}).to_string(), 400, "INVALID_ARGUMENT", "xid"),
            ("Begin", "{not json".into(), 400, "INVALID_ARGUMENT", "is not a BeginRequest in JSON"),
            ("Begin", json!({"xid": 7}).to_string(), 400, "INVALID_ARGUMENT", "BeginRequest"),
            (
                "RegisterBranch",
                json!({"xid": "nobody", "branchId": "b", "target": target, "handler": "h"}).to_string(),
                404,
                "NOT_FOUND",
                "nobody",
            ),
            (
                "RegisterBranch",
                json!({"xid": "bad-target", "branchId": "b", "target": "ftp://x", "handler": "h", "beginTimeoutMs": 1000}).to_string(),
                400,
                "INVALID_ARGUMENT",
                "http:// or https://",
            ),
            (
                "SubmitSaga",
                json!({"xid": "cycle", "steps": [step("a", &["b"]), step("b", &["a"])]}).to_string(),
                400,
                "INVALID_ARGUMENT",
                "cycle",
            ),
            ("Rollback", json!({"xid": "decided"}).to_string(), 409, "ABORTED", ""),
            ("Get", json!({"xid": "never"}).to_string(), 404, "NOT_FOUND", "never"),
            (
                "Begin",
                format!("{{\"xid\": \"{}\"}}", "y".repeat(dtx_coordinator::http_api::MAX_BODY_BYTES)),
                413,
                "INVALID_ARGUMENT",
                "larger than the limit",
            ),
        ];
        for (method, body, http, code, part) in rows {
            let url = format!("{base}/dtx.v1.Coordinator/{method}");
            let (status, content_type, dtx_status, problem) = post_raw(&url, body.clone()).await;
            let shown = &body[..body.len().min(80)];
            assert_eq!(status, http, "{method} {shown}: {problem}");
            assert_eq!(content_type, "application/problem+json", "{method} {shown}");
            assert_eq!(problem["code"], code, "{method} {shown}: {problem}");
            assert_eq!(problem["status"], http, "{problem}");
            let detail = problem["detail"].as_str().unwrap_or_default();
            assert!(detail.contains(part), "{method} {shown}: {detail:?} lacks {part:?}");
            if code == "ABORTED" {
                assert_eq!(dtx_status.as_deref(), Some("COMMITTED"), "{problem}");
            }
        }
        // Nothing of the refused requests was stored.
        for xid in ["bad-target", "cycle", "nobody"] {
            let (status, _, _, _) =
                post(&format!("{base}/dtx.v1.Coordinator/Get"), &json!({"xid": xid})).await;
            assert_eq!(status, 404, "{xid} was stored");
        }
        // Route errors are problem+json too.
        let (status, content_type, _, problem) =
            post(&format!("{base}/dtx.v1.Coordinator/Nope"), &json!({})).await;
        assert_eq!((status, content_type.as_str()), (404, "application/problem+json"));
        assert_eq!(problem["code"], "NOT_FOUND", "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("POST /dtx.v1.Coordinator/<Method>"));
        let wrong = reqwest::get(format!("{base}/dtx.v1.Coordinator/Get")).await.unwrap();
        assert_eq!(wrong.status().as_u16(), 405);
        assert_eq!(wrong.headers()["allow"], "POST");
        assert_eq!(wrong.headers()["content-type"], "application/problem+json");
        let problem: Value = serde_json::from_slice(&wrong.bytes().await.unwrap()).unwrap();
        assert_eq!(problem["status"], 405, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("called with POST"), "{problem}");
    })
    .await;
}

/// The routes are the proto's RPCs, every one: a method added to the proto without its
/// route (or a route without a method) fails here.
#[test]
fn every_coordinator_and_admin_rpc_has_its_route() {
    use prost::Message as _;
    let set = prost_types::FileDescriptorSet::decode(dtx_proto::v1::FILE_DESCRIPTOR_SET).unwrap();
    let methods = |service: &str| -> BTreeSet<String> {
        set.file
            .iter()
            .flat_map(|f| &f.service)
            .filter(|s| s.name() == service)
            .flat_map(|s| s.method.iter().map(|m| m.name().to_string()))
            .collect()
    };
    use dtx_coordinator::http_api::{ADMIN_METHODS as admin, COORDINATOR_METHODS as coordinator};
    let routed = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(routed(coordinator), methods("Coordinator"));
    assert_eq!(routed(admin), methods("Admin"));
}
