//! Calls to participant services, reduced to what the engine needs to know.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::Duration;

use dtx_proto::answer::Answer;
use dtx_proto::trace::TraceParent;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest};
use tonic::transport::{Channel, Endpoint};

use crate::domain::job::CallOutcome;

/// One branch call.
#[derive(Debug, Clone)]
pub struct Call {
    pub target: String,
    pub xid: String,
    pub branch_id: String,
    pub action: BranchAction,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// Connections to participants, one lazily connected HTTP/2 channel per target (channels
/// multiplex concurrent calls, so one per target is enough).
#[derive(Default)]
pub struct Participants {
    clients: RwLock<HashMap<String, ParticipantClient<Channel>>>,
}

impl Participants {
    fn client(&self, target: &str) -> Result<ParticipantClient<Channel>, String> {
        if let Some(client) = self.clients.read().expect("participants lock").get(target) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::from_shared(target.to_string())
            .map_err(|e| format!("target {target:?} is not a valid endpoint: {e}"))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(false);
        let client = ParticipantClient::new(endpoint.connect_lazy());
        self.clients
            .write()
            .expect("participants lock")
            .insert(target.to_string(), client.clone());
        Ok(client)
    }

    /// Makes one call, bounded by its timeout.
    pub async fn call(&self, call: Call) -> CallOutcome {
        let mut client = match self.client(&call.target) {
            Ok(client) => client,
            Err(e) => return CallOutcome::NotSent(e),
        };
        // Each attempt is a span of the transaction's trace: the participant sees the trace id.
        let span = tracing::info_span!(
            "branch attempt",
            otel.kind = "client",
            xid = %call.xid,
            branch = %call.branch_id,
            action = call.action.as_str_name(),
            handler = %call.handler,
        );
        let mut request = tonic::Request::new(BranchRequest {
            xid: call.xid,
            branch_id: call.branch_id,
            action: call.action as i32,
            handler: call.handler,
            payload: call.payload,
            headers: call.headers,
        });
        request.set_timeout(call.timeout);
        let trace =
            TraceParent::of_headers(&request.get_ref().headers).map(|t| attempt_span(&span, t));
        if let Some(trace) = trace {
            trace.insert_into(request.metadata_mut());
        }
        // The grpc-timeout header asks the server to give up; this bounds our own wait too,
        // including connection setup.
        let answer = tokio::time::timeout(call.timeout, client.branch(request));
        match tracing::Instrument::instrument(answer, span).await {
            Err(_) => {
                CallOutcome::Unknown(format!("no answer within {} ms", call.timeout.as_millis()))
            }
            Ok(result) => match Answer::of_result(result) {
                Answer::Success(result) => CallOutcome::Success(result),
                Answer::Refused(reason) => CallOutcome::Failure(reason),
                Answer::Unknown(seen) => CallOutcome::Unknown(seen),
            },
        }
    }
}

/// The context of one attempt under the transaction's `stored` one: the exported span's own
/// when spans go to a collector (so the participant's spans hang under it), a fresh child id
/// otherwise.
fn attempt_span(span: &tracing::Span, stored: TraceParent) -> TraceParent {
    use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let remote = SpanContext::new(
        stored.trace_id.into(),
        stored.span_id.into(),
        TraceFlags::new(stored.flags),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote.clone()));
    let context = span.context();
    let own = context.span().span_context().clone();
    if own.is_valid() && own.trace_id() == remote.trace_id() {
        return TraceParent {
            trace_id: u128::from_be_bytes(own.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(own.span_id().to_bytes()),
            flags: own.trace_flags().to_u8(),
        };
    }
    stored.child()
}
