//! Every error reason (`dtx_proto::reason::TABLE`) made to happen by a real request, against a
//! coordinator with auth, quotas and the HTTP/JSON listener on: gRPC's status details, the
//! HTTP problem's `type`, the Rust SDK's `Error::reason`, the Python package's `reason_of`
//! and the `dtx` CLI's exit code must all name the same reason. It lives with the CLI's tests
//! because only they can run the `dtx` binary.

use std::collections::BTreeSet;
use std::process::Stdio;

use dtx_proto::reason::{Reason, TABLE};
use dtx_tests::auth::AuthKeys;
use dtx_tests::coordinator::InProcess;
use dtx_tests::db::{TestDb, with_db};
use dtx_tests::net::free_addr;
use dtx_tests::world::SCHEMAS;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

type Sqlite = dtx_sql::sqlx::Sqlite;

/// A request sent the same way over every interface: `rpc` with `body` and `token`.
#[derive(Clone)]
struct Probe {
    rpc: &'static str,
    body: Value,
    token: Option<String>,
}

/// What each interface said about one probe.
struct Heard {
    grpc: Option<Reason>,
    http: Option<Reason>,
    sdk: Option<Reason>,
    python: Option<String>,
}

struct Setup {
    keys: AuthKeys,
    coordinator: InProcess,
    http: String,
    python: Option<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

const UNREACHABLE: &str = "http://127.0.0.1:9";

impl Setup {
    fn token(&self, tenant: &str, roles: &[&str]) -> Option<String> {
        Some(self.keys.jwt("probe", tenant, roles))
    }

    /// Calls that prepare a case (as `tenant`'s initiator over gRPC); each must succeed.
    async fn prepare(&self, tenant: &str, calls: &[(&str, Value)]) {
        let token = self.token(tenant, &["initiator"]);
        for (rpc, body) in calls {
            let done =
                dtx_tests::rpc::grpc(&self.coordinator.url, rpc, body.clone(), token.as_deref())
                    .await;
            assert!(done.is_ok(), "preparing {rpc} {body}: {done:?}");
        }
    }

    /// Sends `probe` over gRPC, HTTP/JSON, the Rust SDK's error and the Python package.
    async fn hear(&self, probe: &Probe) -> Heard {
        let token = probe.token.as_deref();
        let status =
            dtx_tests::rpc::grpc(&self.coordinator.url, probe.rpc, probe.body.clone(), token)
                .await
                .expect_err("the probe fails over gRPC");
        let problem = dtx_tests::rpc::http(&self.http, probe.rpc, probe.body.clone(), token)
            .await
            .expect_err("the probe fails over HTTP/JSON");
        assert_eq!(
            dtx_proto::http::code_named(&problem.code),
            Some(status.code()),
            "{problem:?}"
        );
        let grpc = Reason::of_status(&status);
        // The detail is there, not only implied by the code.
        assert!(
            tonic_types::StatusExt::get_error_details(&status)
                .error_info()
                .is_some(),
            "{status:?} carries no ErrorInfo"
        );
        Heard {
            grpc,
            http: Reason::of_problem_type(&problem.kind),
            sdk: dtx_sdk::Error::Rpc(status).reason(),
            python: self.python_reason(probe).await,
        }
    }

    /// What `dtx.reason_of` says of the probe sent through the Python client (`None` without
    /// Python outside CI).
    async fn python_reason(&self, probe: &Probe) -> Option<String> {
        let python = self.python.as_ref()?;
        let method = probe.rpc.strip_prefix("dtx.v1.Coordinator/")?;
        let script = r#"
import json, sys
import dtx
from dtx.v1 import dtx_pb2 as wire
from google.protobuf import json_format
url, method, token, body = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.stdin.read()
kind = wire.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name[method].input_type.name
request = json_format.Parse(body, getattr(wire, kind)())
try:
    dtx.Coordinator(url, token=token)._rpc(method, request)
    print("OK")
except dtx.CoordinatorError as e:
    print(dtx.reason_of(e))
"#;
        let mut child = tokio::process::Command::new(python)
            .args(["-c", script, &self.coordinator.url, method])
            .arg(probe.token.clone().unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run Python");
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(probe.body.to_string().as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The `dtx` CLI's exit code for `args` with `token`.
    async fn cli(&self, token: Option<&str>, args: &[&str]) -> u8 {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_dtx"));
        command
            .arg("--coordinator")
            .arg(&self.coordinator.url)
            .args(args)
            .env_remove("DTX_TOKEN");
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        let out = command.output().await.expect("run dtx");
        out.status.code().expect("dtx exited") as u8
    }
}

/// Checks every interface named `reason` for `probe` (Python only for Coordinator RPCs).
async fn expect(s: &Setup, reason: Reason, probe: Probe, seen: &mut BTreeSet<&'static str>) {
    let heard = s.hear(&probe).await;
    let rpc = probe.rpc;
    assert_eq!(heard.grpc, Some(reason), "gRPC, {rpc}");
    assert_eq!(heard.http, Some(reason), "HTTP/JSON, {rpc}");
    assert_eq!(heard.sdk, Some(reason), "Rust SDK, {rpc}");
    if let Some(python) = heard.python {
        assert_eq!(python, reason.name(), "Python, {rpc}");
    }
    seen.insert(reason.name());
}

#[tokio::test]
async fn every_reason_is_reported_the_same_by_every_interface() {
    with_db::<Sqlite, _, _>(SCHEMAS, |db: &'static TestDb<Sqlite>| async move {
        let dir = tempfile::tempdir().unwrap();
        let keys = AuthKeys::new(dir.path());
        let http_addr = free_addr().await;
        let mut flags = keys.flags();
        flags.extend(
            ["--http-listen", &http_addr.to_string(), "--quota-begins-per-second", "5"]
                .map(String::from),
        );
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let coordinator = InProcess::start(&db.url, &flags).await;
        let s = Setup {
            keys,
            coordinator,
            http: format!("http://{http_addr}"),
            python: dtx_tests::python::python(),
            _dir: dir,
        };
        let mut seen = BTreeSet::new();
        let initiator = |tenant: &str| s.token(tenant, &["initiator"]);
        let saga = |xid: &str, target: &str| {
            json!({"xid": xid, "steps": [{"name": "s1", "target": target, "handler": "h"}]})
        };

        let probe = |rpc, body, token| Probe { rpc, body, token };
        expect(&s, Reason::InvalidRequest,
            probe("dtx.v1.Coordinator/Begin", json!({"xid": "x".repeat(300)}),
                initiator("invalid")),
            &mut seen).await;
        expect(&s, Reason::UnknownTransaction,
            probe("dtx.v1.Coordinator/Get", json!({"xid": "nope"}), initiator("unknown")),
            &mut seen)
            .await;
        expect(&s, Reason::Unauthenticated,
            probe("dtx.v1.Coordinator/Begin", json!({"xid": "t"}), None), &mut seen).await;
        expect(&s, Reason::RoleDenied,
            probe("dtx.v1.Coordinator/Begin", json!({"xid": "t"}), s.token("role", &["reader"])),
            &mut seen).await;
        expect(&s, Reason::TargetNotAllowed,
            probe("dtx.v1.Coordinator/SubmitSaga", saga("far", "http://10.0.0.5:50051"),
                initiator("target")),
            &mut seen).await;

        s.prepare("reuse", &[("dtx.v1.Coordinator/SubmitSaga", saga("s", UNREACHABLE))]).await;
        expect(&s, Reason::KeyReused,
            probe("dtx.v1.Coordinator/SubmitSaga", saga("s", "http://127.0.0.1:10"),
                initiator("reuse")),
            &mut seen).await;

        s.prepare("decided", &[
            ("dtx.v1.Coordinator/Begin", json!({"xid": "d"})),
            ("dtx.v1.Coordinator/Rollback", json!({"xid": "d", "wait": true})),
        ]).await;
        expect(&s, Reason::AlreadyDecided,
            probe("dtx.v1.Coordinator/Commit", json!({"xid": "d"}), initiator("decided")),
            &mut seen).await;

        s.prepare("state", &[("dtx.v1.Coordinator/SubmitSaga", saga("s", UNREACHABLE))]).await;
        expect(&s, Reason::WrongState,
            probe("dtx.v1.Coordinator/RegisterBranch",
                json!({"xid": "s", "branchId": "b1", "target": UNREACHABLE, "handler": "h"}),
                initiator("state")),
            &mut seen).await;

        // Five begins a second per tenant (a repeated submit counts too): the sixth at once is
        // over.
        let begins: Vec<(&str, Value)> = (1..=5)
            .map(|i| ("dtx.v1.Coordinator/Begin", json!({"xid": format!("f{i}")})))
            .collect();
        s.prepare("flood", &begins).await;
        let over = dtx_tests::rpc::grpc(&s.coordinator.url, "dtx.v1.Coordinator/Begin",
            json!({"xid": "f6"}), initiator("flood").as_deref()).await.unwrap_err();
        assert_eq!(Reason::of_status(&over), Some(Reason::QuotaExceeded), "{over:?}");
        let over = dtx_tests::rpc::http(&s.http, "dtx.v1.Coordinator/Begin",
            json!({"xid": "f7"}), initiator("flood").as_deref()).await.unwrap_err();
        assert_eq!(Reason::of_problem_type(&over.kind), Some(Reason::QuotaExceeded));
        seen.insert(Reason::QuotaExceeded.name());

        let unknown = dtx_tests::rpc::http(&s.http, "dtx.v1.Coordinator/Nope", json!({}),
            initiator("unknown").as_deref()).await.unwrap_err();
        assert_eq!(unknown.reason(), Some(Reason::UnknownMethod), "{unknown:?}");
        seen.insert(Reason::UnknownMethod.name());

        // The CLI (Admin RPCs) exits with each reason's code.
        let operator = s.token("ops", &["operator", "reader"]);
        let reader = s.token("ops", &["reader"]);
        s.prepare("ops", &[
            ("dtx.v1.Coordinator/Begin", json!({"xid": "done"})),
            ("dtx.v1.Coordinator/Commit", json!({"xid": "done", "wait": true})),
            ("dtx.v1.Coordinator/Begin", json!({"xid": "bad"})),
            ("dtx.v1.Coordinator/Commit", json!({"xid": "bad", "wait": true})),
        ]).await;
        let long = "x".repeat(300);
        for (reason, token, args) in [
            (Reason::InvalidRequest, &operator, vec!["tx", "show", long.as_str()]),
            (Reason::UnknownTransaction, &operator, vec!["tx", "show", "nope"]),
            (Reason::WrongState, &operator, vec!["tx", "retry", "done", "--reason", "r"]),
            (Reason::RoleDenied, &reader, vec!["tx", "resume", "done", "--reason", "r"]),
            (Reason::Unauthenticated, &None, vec!["stats"]),
        ] {
            assert_eq!(s.cli(token.as_deref(), &args).await, reason.exit_code(), "{args:?}");
        }

        // A row the coordinator cannot read: INTERNAL, and a repeat will not fix it.
        dtx_sql::sqlx::query("UPDATE dtx_global SET kind = 'bogus' WHERE xid = 'ops/bad'")
            .execute(&db.pool).await.unwrap();
        expect(&s, Reason::Internal,
            probe("dtx.v1.Coordinator/Get", json!({"xid": "bad"}), initiator("ops")), &mut seen)
            .await;
        assert_eq!(s.cli(operator.as_deref(), &["tx", "show", "bad"]).await,
            Reason::Internal.exit_code());

        // A store that fails every statement: UNAVAILABLE (the call is safe to repeat).
        dtx_sql::sqlx::query("ALTER TABLE dtx_global RENAME TO dtx_global_away")
            .execute(&db.pool).await.unwrap();
        expect(&s, Reason::Unavailable,
            probe("dtx.v1.Coordinator/Get", json!({"xid": "done"}), initiator("ops")),
            &mut seen).await;
        assert_eq!(s.cli(operator.as_deref(), &["tx", "show", "done"]).await,
            Reason::Unavailable.exit_code());

        // The Python package lists the same reasons with the same codes.
        if let Some(python) = &s.python {
            let out = std::process::Command::new(python)
                .args(["-c", "from dtx import reasons\nfor name, code in reasons.TABLE: print(name, code.value[0])"])
                .output()
                .unwrap();
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            let expected: String = TABLE
                .iter()
                .map(|r| format!("{} {}\n", r.name, r.code as i32))
                .collect();
            assert_eq!(listed, expected, "{}", String::from_utf8_lossy(&out.stderr));
        }

        let all: BTreeSet<&str> = TABLE.iter().map(|r| r.name).collect();
        assert_eq!(seen, all, "reasons no request made happen");
        s.coordinator.stop().await;
    })
    .await;
}
