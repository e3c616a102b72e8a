//! The bad-input table: every coordinator RPC (and the participant service) gets malformed,
//! conflicting and out-of-order input. Each row checks the gRPC code, that the message says
//! what is wrong, and that the database is exactly as before the call: nothing partial is ever
//! written. Wire edge cases too: bytes that are not the method's protobuf message, strings that
//! are not UTF-8, and requests far over the transport's limit all answer INVALID_ARGUMENT with
//! a message naming the problem (not INTERNAL or OUT_OF_RANGE). On SQLite, PostgreSQL and
//! MariaDB.

use std::collections::BTreeMap;
use std::time::Duration;

use dtx_proto::v1::coordinator_client::CoordinatorClient;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::*;
use dtx_sdk::barrier::{HandlerError, Reply};
use dtx_sdk::server::{BranchCall, ParticipantServer};
use dtx_sql::SqlRow;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::net::serve;
use dtx_tests::participant::payload;
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, World};
use futures::future::BoxFuture;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};

/// Sends and receives raw bytes, so a test can put anything on the wire.
#[derive(Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = prost::bytes::Buf::remaining(src);
        Ok(Some(prost::bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

/// Calls `path` (`/dtx.v1.Coordinator/Begin`) with `body` as the whole request message.
async fn raw_call(channel: Channel, path: &'static str, body: Vec<u8>) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(
        tonic::Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(|_| ())
}

/// Not protobuf at all: a field key whose varint never ends.
const NOT_PROTOBUF: [u8; 12] = [0xff; 12];
/// Field 1 (a string in every request) holding bytes that are not UTF-8.
const NOT_UTF8: [u8; 4] = [0x0a, 0x02, 0xc3, 0x28];
/// 20 MiB: far over the largest request the contract allows.
const HUGE: usize = 20 << 20;

fn ok_handler<C>(_: &mut C, _: BranchCall) -> BoxFuture<'_, Result<Reply, HandlerError>> {
    Box::pin(async { Ok(Reply::ok()) })
}

/// Every row of the coordinator's tables, as text (updated_ms included: any write shows).
async fn snapshot<DB: TestBackend>(db: &TestDb<DB>) -> Vec<String> {
    let globals = db
        .rows("SELECT xid, status, decision, branch_count, updated_ms, spec FROM dtx_global ORDER BY xid")
        .await;
    let branches = db
        .rows("SELECT xid, branch_id, status, attempts, payload, target FROM dtx_branch ORDER BY xid, branch_id")
        .await;
    let globals = globals.iter().map(|r| {
        format!(
            "g {} {} {:?} {} {} {:?}",
            r.text(0).unwrap(),
            r.text(1).unwrap(),
            r.opt_text(2).unwrap(),
            r.i64(3).unwrap(),
            r.i64(4).unwrap(),
            r.opt_bytes(5).unwrap().map(|s| s.len())
        )
    });
    let branches = branches.iter().map(|r| {
        format!(
            "b {} {} {} {} {:?} {}",
            r.text(0).unwrap(),
            r.text(1).unwrap(),
            r.text(2).unwrap(),
            r.i64(3).unwrap(),
            r.opt_bytes(4).unwrap(),
            r.text(5).unwrap()
        )
    });
    globals.chain(branches).collect()
}

type Call = BoxFuture<'static, Result<(), Status>>;

fn ignore<T>(r: Result<tonic::Response<T>, Status>) -> Result<(), Status> {
    r.map(|_| ())
}

fn saga_step(name: &str, target: &str, deps: &[&str]) -> SagaStep {
    SagaStep {
        name: name.into(),
        target: target.into(),
        handler: "debit".into(),
        action_payload: payload("alice", 1),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

fn branch(xid: &str, id: &str, target: &str) -> RegisterBranchRequest {
    RegisterBranchRequest {
        xid: xid.into(),
        branch_id: id.into(),
        target: target.into(),
        handler: "transfer".into(),
        payload: payload("alice", 1),
        ..Default::default()
    }
}

async fn malformed_and_conflicting_input_is_rejected_without_writing<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    let bank = w.bank.clone();
    let channel = Channel::from_shared(w.coordinator.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let c = CoordinatorClient::new(channel.clone()).max_decoding_message_size(64 << 20);

    // Fixtures: an open TCC transaction with one branch, a committed one, a rolled-back one
    // (all three settled before the table runs), and a finished saga.
    let mut setup = c.clone();
    let begin = |xid: &str| BeginRequest {
        xid: xid.into(),
        timeout_ms: 600_000,
    };
    for xid in ["open", "open2", "committed", "rolled-back"] {
        setup.begin(begin(xid)).await.unwrap();
    }
    setup
        .register_branch(branch("open", "b1", &bank))
        .await
        .unwrap();
    setup
        .register_branch(branch("open2", "b1", &bank))
        .await
        .unwrap();
    let wait = |xid: &str| DecideRequest {
        xid: xid.into(),
        wait: true,
        wait_timeout_ms: 10_000,
    };
    setup.commit(wait("committed")).await.unwrap();
    setup.rollback(wait("rolled-back")).await.unwrap();
    let saga = SubmitSagaRequest {
        xid: "saga".into(),
        steps: vec![saga_step("s1", &bank, &[])],
        ..Default::default()
    };
    setup.submit_saga(saga.clone()).await.unwrap();
    setup
        .wait(WaitRequest {
            xid: "saga".into(),
            timeout_ms: 10_000,
        })
        .await
        .unwrap();
    for i in 0..63 {
        setup
            .register_branch(branch("open", &format!("f{i}"), &bank))
            .await
            .unwrap();
    }

    let long_xid = "x".repeat(129);
    let big = vec![0u8; 64 * 1024 + 1];
    let many_headers: BTreeMap<String, String> =
        (0..33).map(|i| (format!("h{i}"), "v".into())).collect();
    let mut cases: Vec<(&str, Call, Code, &str)> = Vec::new();
    macro_rules! case {
        ($name:expr, $code:expr, $needle:expr, $method:ident($request:expr)) => {{
            let (mut client, request) = (c.clone(), $request);
            cases.push((
                $name,
                Box::pin(async move { ignore(client.$method(request).await) }),
                $code,
                $needle,
            ));
        }};
    }
    use Code::*;
    // Begin
    case!(
        "begin: xid outside the charset",
        InvalidArgument,
        "charset",
        begin(begin("bad xid"))
    );
    case!(
        "begin: xid too long",
        InvalidArgument,
        "limit of 128 bytes",
        begin(begin(&long_xid))
    );
    case!(
        "begin: timeout too long",
        InvalidArgument,
        "timeout_ms",
        begin(BeginRequest {
            xid: "t".into(),
            timeout_ms: u64::MAX
        })
    );
    case!(
        "begin: same xid, other timeout",
        AlreadyExists,
        "already used",
        begin(BeginRequest {
            xid: "open".into(),
            timeout_ms: 5_000
        })
    );
    case!(
        "begin: a saga's xid",
        AlreadyExists,
        "already used",
        begin(begin("saga"))
    );
    case!(
        "begin: a non-ASCII xid names the character",
        InvalidArgument,
        "contains 'é'",
        begin(begin("tx-é"))
    );
    // Wire edge cases: the request does not decode, or is far over the transport limit.
    let raw_rows: [(&str, &'static str, Vec<u8>, &str); 3] = [
        (
            "begin: not protobuf",
            "/dtx.v1.Coordinator/Begin",
            NOT_PROTOBUF.to_vec(),
            "not a valid dtx.v1.BeginRequest",
        ),
        (
            "begin: xid not UTF-8",
            "/dtx.v1.Coordinator/Begin",
            NOT_UTF8.to_vec(),
            "UTF-8",
        ),
        (
            // Field 1 of a BranchResponse is a varint, of a BeginRequest a string.
            "begin: another message type",
            "/dtx.v1.Coordinator/Begin",
            BranchResponse {
                outcome: Outcome::Success as i32,
                ..Default::default()
            }
            .encode_to_vec(),
            "not a valid dtx.v1.BeginRequest",
        ),
    ];
    for (name, path, body, needle) in raw_rows {
        assert!(BeginRequest::decode(&body[..]).is_err(), "{name} decodes");
        cases.push((
            name,
            Box::pin(raw_call(channel.clone(), path, body)),
            InvalidArgument,
            needle,
        ));
    }
    case!(
        "register: a 20 MiB payload names the contract limit",
        InvalidArgument,
        "65536",
        register_branch(RegisterBranchRequest {
            payload: vec![0; HUGE],
            ..branch("open", "b2", &bank)
        })
    );
    // RegisterBranch
    case!(
        "register: unknown xid",
        NotFound,
        "no transaction",
        register_branch(branch("nope", "b1", &bank))
    );
    case!(
        "register: empty branch id",
        InvalidArgument,
        "branch_id must not be empty",
        register_branch(branch("open", "", &bank))
    );
    case!(
        "register: branch id too long",
        InvalidArgument,
        "limit of 64 bytes",
        register_branch(branch("open", &"b".repeat(65), &bank))
    );
    case!(
        "register: target not a URI",
        InvalidArgument,
        "target",
        register_branch(branch("open", "b2", "not a uri"))
    );
    case!(
        "register: port 0",
        InvalidArgument,
        "a port is 1 to 65535",
        register_branch(branch("open", "b2", "http://127.0.0.1:0"))
    );
    case!(
        "register: port past 65535",
        InvalidArgument,
        "a port is 1 to 65535",
        register_branch(branch("open", "b2", "http://127.0.0.1:99999"))
    );
    case!(
        "register: credentials in the target",
        InvalidArgument,
        "must not carry credentials",
        register_branch(branch("open", "b2", "http://user:secret@127.0.0.1:5000"))
    );
    case!(
        "register: payload too large",
        InvalidArgument,
        "limit of 65536 bytes",
        register_branch(RegisterBranchRequest {
            payload: big.clone(),
            ..branch("open", "b2", &bank)
        })
    );
    case!(
        "register: too many headers",
        InvalidArgument,
        "limit of 32",
        register_branch(RegisterBranchRequest {
            headers: many_headers.clone(),
            ..branch("open", "b2", &bank)
        })
    );
    case!(
        "register: call timeout too long",
        InvalidArgument,
        "call_timeout_ms",
        register_branch(RegisterBranchRequest {
            call_timeout_ms: u64::MAX,
            ..branch("open", "b2", &bank)
        })
    );
    case!(
        "register: the 65th branch",
        InvalidArgument,
        "the limit is 64",
        register_branch(branch("open", "b65", &bank))
    );
    case!(
        "register: same branch, other payload",
        AlreadyExists,
        "different content",
        register_branch(RegisterBranchRequest {
            payload: payload("bob", 9),
            ..branch("open", "b1", &bank)
        })
    );
    case!(
        "register: same branch, other target",
        AlreadyExists,
        "different content",
        register_branch(RegisterBranchRequest {
            target: "http://127.0.0.2:1".into(),
            ..branch("open2", "b1", &bank)
        })
    );
    // The coordinator calls only allowed targets (loopback by default): no door to the
    // internal network, not even to the cloud's metadata service.
    for target in [
        "http://10.0.0.5:50051",
        "http://169.254.169.254/latest/meta-data",
    ] {
        case!(
            "register: a target outside --allow-target",
            PermissionDenied,
            "--allow-target",
            register_branch(RegisterBranchRequest {
                target: target.into(),
                begin_timeout_ms: 60_000,
                ..branch("not-allowed", "b1", &bank)
            })
        );
    }
    case!(
        "register: after the decision",
        FailedPrecondition,
        "after the decision",
        register_branch(branch("committed", "b9", &bank))
    );
    case!(
        "register: on a saga",
        FailedPrecondition,
        "saga",
        register_branch(branch("saga", "b9", &bank))
    );
    case!(
        "register: begin timeout too long",
        InvalidArgument,
        "begin_timeout_ms",
        register_branch(RegisterBranchRequest {
            begin_timeout_ms: u64::MAX,
            ..branch("new-xid", "b1", &bank)
        })
    );
    // Commit / Rollback
    case!(
        "commit: unknown xid",
        NotFound,
        "no transaction",
        commit(wait("nope"))
    );
    case!(
        "commit: bad xid",
        InvalidArgument,
        "charset",
        commit(wait("a/b"))
    );
    case!(
        "commit: after rollback",
        Aborted,
        "rollback",
        commit(wait("rolled-back"))
    );
    case!(
        "rollback: after commit",
        Aborted,
        "commit",
        rollback(wait("committed"))
    );
    case!(
        "commit: a saga",
        FailedPrecondition,
        "saga",
        commit(wait("saga"))
    );
    case!(
        "commit: wait too long",
        InvalidArgument,
        "wait_timeout_ms",
        commit(DecideRequest {
            xid: "open".into(),
            wait: true,
            wait_timeout_ms: u64::MAX
        })
    );
    // SubmitSaga
    let sagas: Vec<(&str, SubmitSagaRequest, Code, &str)> = vec![
        (
            "saga: no steps",
            SubmitSagaRequest {
                xid: "n1".into(),
                ..Default::default()
            },
            InvalidArgument,
            "at least one step",
        ),
        (
            "saga: cycle",
            SubmitSagaRequest {
                xid: "n2".into(),
                steps: vec![saga_step("a", &bank, &["b"]), saga_step("b", &bank, &["a"])],
                ..Default::default()
            },
            InvalidArgument,
            "cycle",
        ),
        (
            "saga: unknown dependency",
            SubmitSagaRequest {
                xid: "n3".into(),
                steps: vec![saga_step("a", &bank, &["zz"])],
                ..Default::default()
            },
            InvalidArgument,
            "not a step",
        ),
        (
            "saga: duplicate step names",
            SubmitSagaRequest {
                xid: "n4".into(),
                steps: vec![saga_step("a", &bank, &[]), saga_step("a", &bank, &[])],
                ..Default::default()
            },
            InvalidArgument,
            "used by two steps",
        ),
        (
            "saga: 65 steps",
            SubmitSagaRequest {
                xid: "n5".into(),
                steps: (0..65)
                    .map(|i| saga_step(&format!("s{i}"), &bank, &[]))
                    .collect(),
                ..Default::default()
            },
            InvalidArgument,
            "limit of 64",
        ),
        (
            "saga: payload too large",
            SubmitSagaRequest {
                xid: "n6".into(),
                steps: vec![SagaStep {
                    action_payload: big.clone(),
                    ..saga_step("a", &bank, &[])
                }],
                ..Default::default()
            },
            InvalidArgument,
            "limit of 65536 bytes",
        ),
        (
            "saga: bad target",
            SubmitSagaRequest {
                xid: "n7".into(),
                steps: vec![saga_step("a", "ftp://x", &[])],
                ..Default::default()
            },
            InvalidArgument,
            "http",
        ),
        (
            "saga: bad xid",
            SubmitSagaRequest {
                xid: long_xid.clone(),
                steps: vec![saga_step("a", &bank, &[])],
                ..Default::default()
            },
            InvalidArgument,
            "limit of 128",
        ),
        (
            "saga: same xid, other definition",
            SubmitSagaRequest {
                steps: vec![saga_step("other", &bank, &[])],
                ..saga.clone()
            },
            AlreadyExists,
            "different saga definition",
        ),
        (
            "saga: a step outside --allow-target",
            SubmitSagaRequest {
                xid: "saga-not-allowed".into(),
                steps: vec![
                    saga_step("a", &bank, &[]),
                    saga_step("b", "http://internal.example.com:80", &["a"]),
                ],
                ..Default::default()
            },
            PermissionDenied,
            "matches no rule",
        ),
        (
            "saga: a TCC transaction's xid",
            SubmitSagaRequest {
                xid: "open".into(),
                ..saga.clone()
            },
            AlreadyExists,
            "TCC transaction",
        ),
    ];
    for (name, req, code, needle) in sagas {
        case!(name, code, needle, submit_saga(req));
    }
    // Reads and operator calls
    case!(
        "get: unknown xid",
        NotFound,
        "no transaction",
        get(GetRequest { xid: "nope".into() })
    );
    case!(
        "get: empty xid",
        InvalidArgument,
        "must not be empty",
        get(GetRequest { xid: String::new() })
    );
    case!(
        "wait: timeout too long",
        InvalidArgument,
        "timeout_ms",
        wait(WaitRequest {
            xid: "open".into(),
            timeout_ms: u64::MAX
        })
    );
    case!(
        "resume: not parked",
        FailedPrecondition,
        "not NEEDS_ATTENTION",
        resume(ResumeRequest {
            xid: "committed".into()
        })
    );

    // Participant service.
    let mut p = ParticipantClient::connect(bank.clone()).await.unwrap();
    let call = |action: i32, handler: &str, payload: Vec<u8>| BranchRequest {
        xid: "px".into(),
        branch_id: "b1".into(),
        action,
        handler: handler.into(),
        payload,
        headers: Default::default(),
    };
    let participant_cases = [
        (
            "participant: unknown handler",
            call(1, "nope", vec![]),
            NotFound,
            "no handler named",
        ),
        (
            "participant: action kind 0",
            call(0, "transfer", vec![]),
            InvalidArgument,
            "action",
        ),
        (
            "participant: action kind 99",
            call(99, "transfer", vec![]),
            InvalidArgument,
            "action",
        ),
        (
            "participant: saga action on a TCC handler",
            call(4, "transfer", vec![]),
            FailedPrecondition,
            "has no action",
        ),
        (
            "participant: payload too large",
            call(1, "transfer", big.clone()),
            InvalidArgument,
            "limit of 65536 bytes",
        ),
    ];

    // Outcomes are announced before the final row is written: let those writes land.
    for _ in 0..100 {
        if db
            .rows("SELECT xid FROM dtx_global WHERE owner IS NOT NULL")
            .await
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = snapshot(db).await;
    let mut checked = 0;
    for (name, call, code, needle) in cases {
        let status = call.await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
        assert_eq!(snapshot(db).await, before, "{name} changed the database");
        checked += 1;
    }
    for (name, req, code, needle) in participant_cases {
        let status = p.branch(req).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{name}: {:?}",
            status.message()
        );
        assert_eq!(
            dtx_tests::ledger::barrier_rows(&db.pool, "px", "b1").await,
            0,
            "{name}"
        );
        checked += 1;
    }
    // Wire edge cases on the participant service: the test bank and the SDK's own server
    // (whose decoding limit comes from the contract, as the coordinator's does).
    let sdk = ParticipantServer::new(db.pool.clone()).tcc(
        "transfer",
        ok_handler::<DB::Conn>,
        ok_handler::<DB::Conn>,
        ok_handler::<DB::Conn>,
    );
    let sdk_server = serve(Server::builder().add_service(sdk.into_service())).await;
    let mut wire_cases: Vec<(String, Call, &str)> = Vec::new();
    for (server, url) in [("bank", bank.clone()), ("sdk", sdk_server.url())] {
        let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
        let wrong_type = BranchResponse {
            outcome: Outcome::Success as i32,
            ..Default::default()
        }
        .encode_to_vec();
        for (row, body, needle) in [
            (
                "not protobuf",
                NOT_PROTOBUF.to_vec(),
                "not a valid dtx.v1.BranchRequest",
            ),
            ("xid not UTF-8", NOT_UTF8.to_vec(), "UTF-8"),
            (
                "another message type",
                wrong_type,
                "not a valid dtx.v1.BranchRequest",
            ),
        ] {
            assert!(BranchRequest::decode(&body[..]).is_err(), "{row} decodes");
            let call = raw_call(channel.clone(), "/dtx.v1.Participant/Branch", body);
            wire_cases.push((
                format!("participant ({server}): {row}"),
                Box::pin(call),
                needle,
            ));
        }
    }
    let mut client = ParticipantClient::new(
        Channel::from_shared(sdk_server.url())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    for (row, size) in [("5 MiB payload", 5 << 20), ("20 MiB payload", HUGE)] {
        let (mut client, request) = (client.clone(), call(1, "transfer", vec![0; size]));
        let call = async move { ignore(client.branch(request).await) };
        wire_cases.push((format!("participant (sdk): {row}"), Box::pin(call), "65536"));
    }
    for (name, call, needle) in wire_cases {
        let status = call.await.expect_err(&name);
        assert_eq!(status.code(), InvalidArgument, "{name}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            status.message()
        );
        assert_eq!(
            dtx_tests::ledger::barrier_rows(&db.pool, "px", "b1").await,
            0,
            "{name}"
        );
        checked += 1;
    }
    client
        .branch(call(1, "transfer", vec![0; 16]))
        .await
        .expect("the SDK server still serves a well-formed call");
    // Idempotent repeats are accepted and change nothing either.
    let mut cl = c.clone();
    cl.begin(begin("open")).await.unwrap();
    cl.register_branch(branch("open", "b1", &bank))
        .await
        .unwrap();
    cl.commit(DecideRequest {
        xid: "committed".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    cl.submit_saga(saga).await.unwrap();
    // (A repeated Begin/Register/Submit writes nothing; an accepted repeat of a decision
    // neither.)
    assert_eq!(
        snapshot(db).await,
        before,
        "idempotent repeats changed the database"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    eprintln!("{}: {checked} bad-input rows checked", DB::NAME);
}
test_on_all_databases!(
    malformed_and_conflicting_input_is_rejected_without_writing,
    SCHEMAS
);
