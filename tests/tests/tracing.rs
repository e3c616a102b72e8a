//! W3C trace context end to end: the initiator's trace id reaches the participant's handler on
//! the Try, on the coordinator's Confirm and its retries, and on calls a second coordinator
//! process makes after the first was SIGKILLed; every attempt is a span of its own.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tonic::transport::Server;

use dtx_proto::trace::TraceParent;
use dtx_proto::v1::TxStatus;
use dtx_sdk::barrier::Action;
use dtx_sdk::client::{TccBranch, TccOptions};
use dtx_tests::coordinator::Process;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::net::serve;
use dtx_tests::participant::{CallRecord, Fault, Faults, payload};
use dtx_tests::test_on_all_databases;
use dtx_tests::world::{SCHEMAS, World, alice_with_a_slow_step, debit_alice};

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// The initiator's context (the W3C example).
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The calls of `xid` the bank saw, each with the trace context its handler saw.
fn calls(faults: &Faults, xid: &str) -> Vec<(CallRecord, TraceParent)> {
    faults
        .call_log()
        .into_iter()
        .filter(|c| c.xid == xid)
        .map(|c| {
            let trace = c.traceparent.as_deref().and_then(TraceParent::parse);
            let trace = trace
                .unwrap_or_else(|| panic!("{} {:?} without a trace: {c:?}", c.branch, c.action));
            (c, trace)
        })
        .collect()
}

/// Every call is in the initiator's trace, each attempt a span of its own.
fn one_trace_a_span_per_attempt(calls: &[(CallRecord, TraceParent)]) {
    let parent = TraceParent::parse(PARENT).unwrap();
    let mut spans = HashSet::new();
    for (c, trace) in calls {
        assert_eq!(
            trace.trace_id, parent.trace_id,
            "{} {:?}",
            c.branch, c.action
        );
        assert_ne!(
            trace.span_id, parent.span_id,
            "a span of its own, under the initiator's"
        );
        assert!(
            spans.insert(trace.span_id),
            "one span per attempt: {calls:?}"
        );
    }
}

async fn a_tcc_carries_the_initiators_trace_to_try_confirm_and_its_retry<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let w = World::start(db, &[]).await;
    // The first Confirm's answer is lost: the coordinator retries it.
    w.faults
        .push("b1", Action::Confirm, [Fault::UnavailableAfter]);
    let options = TccOptions {
        xid: Some("traced-tcc".into()),
        traceparent: Some(PARENT.into()),
        ..TccOptions::default()
    };
    let tx = w.client.begin(options).await.unwrap();
    assert_eq!(tx.traceparent().to_string(), PARENT);
    tx.call(TccBranch::new(&w.bank, "transfer", payload("alice", 10)).id("b1"))
        .await
        .unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxStatus::Committed);

    let calls = calls(&w.faults, "traced-tcc");
    let actions: Vec<Action> = calls.iter().map(|(c, _)| c.action).collect();
    assert_eq!(actions, [Action::Try, Action::Confirm, Action::Confirm]);
    one_trace_a_span_per_attempt(&calls);
}
test_on_all_databases!(
    a_tcc_carries_the_initiators_trace_to_try_confirm_and_its_retry,
    SCHEMAS
);

/// A saga whose step s2 hangs in the network when its coordinator is SIGKILLed: the second
/// process's calls (s2 again, then s3) are in the same trace, stored with the saga.
async fn a_saga_keeps_its_trace_across_a_coordinator_restart<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let (faults, bank) = alice_with_a_slow_step(db, "s2", Duration::from_millis(1500)).await;
    let first = Process::start(BIN, &db.url, &[]).await;
    first
        .client()
        .await
        .saga()
        .xid("traced-saga")
        .traceparent(PARENT)
        .step(debit_alice("s1", bank.url(), 1))
        .step(debit_alice("s2", bank.url(), 2).after(["s1"]))
        .step(debit_alice("s3", bank.url(), 3).after(["s2"]))
        .submit()
        .await
        .unwrap();
    while faults.calls("s2", Action::Action) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await;

    let second = Process::start(BIN, &db.url, &[]).await;
    let done = second
        .client()
        .await
        .wait("traced-saga", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.status(), TxStatus::Succeeded);

    let calls = calls(&faults, "traced-saga");
    let peers: HashSet<_> = calls.iter().map(|(c, _)| c.peer).collect();
    assert!(peers.len() >= 2, "calls from both processes: {calls:?}");
    let s2 = calls.iter().filter(|(c, _)| c.branch == "s2").count();
    assert!(s2 >= 2, "s2 retried by the second process: {calls:?}");
    one_trace_a_span_per_attempt(&calls);
}
test_on_all_databases!(a_saga_keeps_its_trace_across_a_coordinator_restart, SCHEMAS);

/// A stand-in OpenTelemetry collector: keeps every span exported to it.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// With `--otlp-endpoint`, each branch attempt is exported as a span of the initiator's trace,
/// and it is the span the participant sees as its caller.
async fn branch_attempts_are_exported_to_the_otlp_collector<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let collector = Collector::default();
    let server =
        serve(Server::builder().add_service(TraceServiceServer::new(collector.clone()))).await;
    let (faults, bank) = dtx_tests::world::bank(db).await;
    faults.push("b1", Action::Confirm, [Fault::UnavailableAfter]);
    let endpoint = server.url();
    let coordinator = Process::start(BIN, &db.url, &["--otlp-endpoint", &endpoint]).await;
    let client = coordinator.client().await;
    let options = TccOptions {
        xid: Some("exported".into()),
        traceparent: Some(PARENT.into()),
        ..TccOptions::default()
    };
    let tx = client.begin(options).await.unwrap();
    tx.call(TccBranch::new(bank.url(), "transfer", payload("alice", 10)).id("b1"))
        .await
        .unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxStatus::Committed);
    // SIGTERM: the coordinator flushes its spans before it exits.
    assert!(coordinator.terminate().await.success());

    let parent = TraceParent::parse(PARENT).unwrap();
    let exported: Vec<Span> = collector
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "branch attempt")
        .cloned()
        .collect();
    let confirms: Vec<_> = calls(&faults, "exported")
        .into_iter()
        .filter(|(c, _)| c.action == Action::Confirm)
        .collect();
    assert_eq!(confirms.len(), 2, "a Confirm and its retry");
    assert_eq!(exported.len(), 2, "one span per attempt: {exported:#?}");
    for (_, seen) in &confirms {
        let span = exported
            .iter()
            .find(|s| s.span_id == seen.span_id.to_be_bytes())
            .unwrap_or_else(|| {
                panic!("the participant's caller {seen} was exported: {exported:#?}")
            });
        assert_eq!(span.trace_id, parent.trace_id.to_be_bytes());
        assert_eq!(span.parent_span_id, parent.span_id.to_be_bytes());
    }
}
test_on_all_databases!(branch_attempts_are_exported_to_the_otlp_collector, SCHEMAS);
