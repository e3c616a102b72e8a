//! Calls to participant services, reduced to what the engine needs to know.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use dtx_proto::answer::Answer;
use dtx_proto::auth::{self, CallSigner};
use dtx_proto::http::Problem;
use dtx_proto::limits::{Transport, transport_of};
use dtx_proto::tls::ClientTls;
use dtx_proto::trace::TraceParent;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest, BranchResponse};
use tonic::transport::Channel;

use super::http_client::{self, Client};
use crate::domain::allow::{Allowlist, Target};
use crate::domain::job::CallOutcome;
use crate::domain::{BranchId, Xid};

/// One branch call.
#[derive(Debug, Clone)]
pub struct Call {
    pub target: String,
    pub xid: Xid,
    pub branch_id: BranchId,
    pub action: BranchAction,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// Connections to participants, swapped whole when the TLS material changes: later calls
/// connect with the new certificate, calls in flight finish on their connections.
pub struct Participants {
    current: RwLock<Arc<Connections>>,
    /// The targets that may be called, checked again against what a name resolves to now.
    allow: Arc<Allowlist>,
    /// Signs every call (`x-dtx-call-token`) when a signing key is configured.
    signer: RwLock<Option<Arc<CallSigner>>>,
}

/// One lazily connected HTTP/2 channel per gRPC target (channels multiplex concurrent calls, so
/// one per target is enough), and one pooled HTTP/1.1 client for every HTTP/JSON target, all
/// made with one TLS configuration.
struct Connections {
    clients: RwLock<HashMap<String, ParticipantClient<Channel>>>,
    http: OnceLock<Result<Client, String>>,
    /// For `https://` targets; `None`: they are not called.
    tls: Option<ClientTls>,
    /// Every connection resolves through it (the address connected to is the one checked).
    allow: Arc<Allowlist>,
}

impl Connections {
    fn new(tls: Option<ClientTls>, allow: Arc<Allowlist>) -> Self {
        Connections {
            clients: RwLock::default(),
            http: OnceLock::new(),
            tls,
            allow,
        }
    }

    /// The TLS of an `https://` target: an error (the call is not made) without trust roots.
    fn tls_for(&self, target: &str) -> Result<Option<&ClientTls>, String> {
        if !target.starts_with("https://") {
            return Ok(None);
        }
        self.tls.as_ref().map(Some).ok_or_else(|| {
            "an https:// target, and no roots to verify it with: start the coordinator with \
             --participant-ca (or --participant-system-roots)"
                .to_string()
        })
    }

    fn client(&self, target: &str) -> Result<ParticipantClient<Channel>, String> {
        if let Some(client) = self.clients.read().expect("participants lock").get(target) {
            return Ok(client.clone());
        }
        // `https://` is TLS with ALPN h2, never plain HTTP/2.
        let endpoint = dtx_proto::tls::endpoint(target, self.tls_for(target)?)
            .map_err(|e| format!("target {target:?}: {e}"))?
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(false);
        let connector = http_client::connector(self.allow.clone());
        let client = ParticipantClient::new(endpoint.connect_with_connector_lazy(connector));
        self.clients
            .write()
            .expect("participants lock")
            .insert(target.to_string(), client.clone());
        Ok(client)
    }
}

impl Participants {
    pub fn new(tls: Option<ClientTls>, allow: Arc<Allowlist>) -> Self {
        Participants {
            current: RwLock::new(Arc::new(Connections::new(tls, allow.clone()))),
            allow,
            signer: RwLock::new(None),
        }
    }

    /// The key branch calls are signed with (a reload replaces it; `None`: unsigned).
    pub fn set_signer(&self, signer: Option<CallSigner>) {
        *self.signer.write().expect("signer lock") = signer.map(Arc::new);
    }

    /// A token for `call` to `target`, if calls are signed.
    pub fn sign(&self, target: &str, call: auth::Call<'_>) -> Result<Option<String>, String> {
        let signer = self.signer.read().expect("signer lock").clone();
        signer
            .map(|s| s.sign(target, call).map_err(|e| e.0))
            .transpose()
    }

    /// New trust roots or client certificate for `https://` participants (a reload).
    pub fn set_tls(&self, tls: Option<ClientTls>) {
        *self.current.write().expect("participants lock") =
            Arc::new(Connections::new(tls, self.allow.clone()));
    }

    fn connections(&self) -> Arc<Connections> {
        self.current.read().expect("participants lock").clone()
    }

    /// Makes one call, bounded by its timeout.
    pub async fn call(&self, call: Call) -> CallOutcome {
        // Each attempt is a span of the transaction's trace: the participant sees the trace id.
        let span = tracing::info_span!(
            "branch attempt",
            otel.kind = "client",
            xid = %call.xid,
            branch = %call.branch_id,
            action = call.action.as_str_name(),
            handler = %call.handler,
        );
        let (target, timeout) = (call.target, call.timeout);
        let request = BranchRequest {
            xid: call.xid.into(),
            branch_id: call.branch_id.into(),
            action: call.action as i32,
            handler: call.handler,
            payload: call.payload,
            headers: call.headers,
        };
        let trace = TraceParent::of_headers(&request.headers).map(|t| attempt_span(&span, t));
        // The target as it resolves now (DNS rebinding): outside the rules, the call is not
        // made (a Confirm parks with the reason; a check-back is asked again later).
        if let Err(refused) = self.check_resolved(&target).await {
            tracing::warn!(parent: &span, target = %target, "{refused}");
            return CallOutcome::NotSent(refused);
        }
        let answer = async {
            let token = self.sign(&target, auth::Call::of(&request))?;
            let sent = Sent {
                trace,
                token,
                timeout,
            };
            match transport_of(&target) {
                Transport::Grpc => self.call_grpc(&target, request, sent).await,
                Transport::HttpJson => self.call_http(&target, request, sent).await,
            }
        };
        match tracing::Instrument::instrument(answer, span).await {
            Err(not_sent) => CallOutcome::NotSent(not_sent),
            Ok(Answer::Success(result)) => CallOutcome::Success(result),
            Ok(Answer::Refused(reason)) => CallOutcome::Failure(reason),
            Ok(Answer::Unknown(seen)) => CallOutcome::Unknown(seen),
        }
    }

    /// Whether `target`'s host, resolved now, is still inside the allowlist.
    async fn check_resolved(&self, target: &str) -> Result<(), String> {
        let parsed = Target::parse(target)?;
        let addrs: Vec<IpAddr> = match parsed.host.parse::<IpAddr>() {
            Ok(addr) => vec![addr],
            Err(_) => tokio::net::lookup_host((parsed.host.as_str(), parsed.port))
                .await
                .map_err(|e| format!("target {target}: cannot resolve {}: {e}", parsed.host))?
                .map(|a| a.ip())
                .collect(),
        };
        self.allow.check_addresses(&parsed, &addrs)
    }

    /// The `dtx.v1.Participant/Branch` call; `Err` when it could not be sent.
    async fn call_grpc(
        &self,
        target: &str,
        request: BranchRequest,
        sent: Sent,
    ) -> Result<Answer, String> {
        let Sent {
            trace,
            token,
            timeout,
        } = sent;
        let mut client = self.connections().client(target)?;
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        if let Some(trace) = trace {
            trace.insert_into(request.metadata_mut());
        }
        if let Some(token) = token {
            let value = token
                .parse()
                .map_err(|_| "the call token is not ASCII".to_string())?;
            request.metadata_mut().insert(auth::CALL_TOKEN, value);
        }
        // The grpc-timeout header asks the server to give up; this bounds our own wait too,
        // including connection setup.
        Ok(
            match tokio::time::timeout(timeout, client.branch(request)).await {
                Err(_) => Answer::Unknown(format!("no answer within {} ms", timeout.as_millis())),
                Ok(result) => Answer::of_result(result),
            },
        )
    }

    /// A JSON POST of the request to an HTTP participant. Its answer means what the same
    /// answer over gRPC would: a `BranchResponse` in JSON with status 200, or a problem body
    /// whose `code` names the gRPC code; anything else is an unknown outcome.
    async fn call_http(
        &self,
        target: &str,
        request: BranchRequest,
        sent: Sent,
    ) -> Result<Answer, String> {
        let Sent {
            trace,
            token,
            timeout,
        } = sent;
        let connections = self.connections();
        let client = connections
            .http
            .get_or_init(|| {
                http_client::client_with(connections.tls.as_ref(), connections.allow.clone())
                    .map_err(|e| format!("no HTTP client for participants: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        connections.tls_for(target)?;
        let body = serde_json::to_vec(&request).map_err(|e| format!("encoding the call: {e}"))?;
        let mut headers = vec![("accept", "application/json".to_string())];
        if let Some(trace) = trace {
            headers.push(("traceparent", trace.to_string()));
        }
        if let Some(token) = token {
            headers.push((auth::CALL_TOKEN, token));
        }
        let (status, body) =
            match http_client::post_json(client, target, &headers, body.into(), timeout).await {
                Ok(answer) => answer,
                Err(e) => return Ok(Answer::Unknown(e)),
            };
        Ok(if status == http::StatusCode::OK {
            match serde_json::from_slice::<BranchResponse>(&body) {
                Ok(response) => Answer::of_response(response),
                Err(e) => Answer::Unknown(format!("HTTP 200 without a BranchResponse: {e}")),
            }
        } else {
            match serde_json::from_slice::<Problem>(&body) {
                Ok(problem) => Answer::of_status(&problem.to_status()),
                Err(_) => Answer::Unknown(format!("HTTP {status}")),
            }
        })
    }
}

/// What goes with a branch request besides its body.
struct Sent {
    trace: Option<TraceParent>,
    /// The signed `x-dtx-call-token`, when calls are signed.
    token: Option<String>,
    timeout: Duration,
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
