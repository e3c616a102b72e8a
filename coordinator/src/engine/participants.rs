//! Calls to participant services, reduced to what the engine needs to know.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use dtx_proto::answer::Answer;
use dtx_proto::auth::{self, CallSigner};
use dtx_proto::http::Problem;
use dtx_proto::limits::{Transport, transport_of};
use dtx_proto::tls::ClientTls;
use dtx_proto::trace::{TRACEPARENT, TraceParent};
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{
    BranchAction, BranchBatchItem, BranchBatchRequest, BranchRequest, BranchResponse,
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tonic::Status;
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
    batching: Batching,
}

/// How calls due at once to one participant are sent together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most calls in one `BranchBatch` (1: every call alone).
    pub max_items: usize,
    /// Batches (or single calls) in flight to one participant at a time. While all are out,
    /// the calls that come due wait and leave together with the next one; with a slot free, a
    /// call leaves at once, alone.
    pub in_flight: usize,
    /// Longest the calls wait for a slot: then they leave anyway, so a participant holding
    /// some answers (or calls that hang until their timeout) cannot stall the rest.
    pub max_wait: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            max_items: 32,
            in_flight: 4,
            max_wait: Duration::from_millis(5),
        }
    }
}

/// The second-phase calls the coordinator makes on its own schedule: the ones it may send
/// together. A Try is the initiator's; a check-back waits on the initiator's transaction.
fn batchable(action: i32) -> bool {
    matches!(
        BranchAction::try_from(action),
        Ok(BranchAction::Confirm
            | BranchAction::Cancel
            | BranchAction::Action
            | BranchAction::Compensate)
    )
}

/// One lazily connected HTTP/2 channel per gRPC target (channels multiplex concurrent calls, so
/// one per target is enough), and one pooled HTTP/1.1 client for every HTTP/JSON target, all
/// made with one TLS configuration.
struct Connections {
    clients: RwLock<HashMap<String, ParticipantClient<Channel>>>,
    /// One per gRPC target that calls were batched to (see [`Lane`]).
    lanes: Mutex<HashMap<String, Lane>>,
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
            lanes: Mutex::default(),
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
    pub fn new(tls: Option<ClientTls>, allow: Arc<Allowlist>, batching: Batching) -> Self {
        Participants {
            current: RwLock::new(Arc::new(Connections::new(tls, allow.clone()))),
            allow,
            signer: RwLock::new(None),
            batching,
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
        let token = match self.sign(&target, auth::Call::of(&request)) {
            Ok(token) => token,
            Err(not_sent) => return CallOutcome::NotSent(not_sent),
        };
        let sent = Sent {
            trace,
            token,
            timeout,
        };
        // Routed before anything more is awaited, and the calls of their own boxed: a call
        // waiting in a batching lane holds only the receiver of its answer, not room for a
        // whole client call (every call in flight costs what its future holds).
        use tracing::Instrument;
        let answer = match transport_of(&target) {
            Transport::HttpJson => {
                Box::pin(self.call_http(&target, request, sent).instrument(span)).await
            }
            Transport::Grpc => match self.route(&target, request.action) {
                Err(not_sent) => Err(not_sent),
                Ok(Route::Lane(lane)) => Ok(Lane::answer(lane.queue(request, sent)).await),
                Ok(Route::Alone(client)) => {
                    Box::pin(single_call(client, request, sent).instrument(span)).await
                }
            },
        };
        match answer {
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

    /// How a `dtx.v1.Participant/Branch` call to `target` goes: a place in the target's next
    /// batch when the call may be batched, else alone; `Err` when it cannot be sent.
    fn route(&self, target: &str, action: i32) -> Result<Route, String> {
        let connections = self.connections();
        let client = connections.client(target)?;
        let lane = (self.batching.max_items > 1 && batchable(action))
            .then(|| connections.lane(target, &client, self.batching))
            .flatten();
        Ok(match lane {
            Some(lane) => Route::Lane(lane),
            None => Route::Alone(client),
        })
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

/// How one gRPC call goes: in the target's batching lane, or alone on the client.
enum Route {
    Lane(Lane),
    Alone(ParticipantClient<Channel>),
}

/// One `dtx.v1.Participant/Branch` call; `Err` when it could not be sent.
async fn single_call(
    mut client: ParticipantClient<Channel>,
    request: BranchRequest,
    sent: Sent,
) -> Result<Answer, String> {
    let Sent {
        trace,
        token,
        timeout,
    } = sent;
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

impl Connections {
    /// The batching lane to `target`, made on first use; `None` once the participant showed
    /// it takes no batches.
    fn lane(
        &self,
        target: &str,
        client: &ParticipantClient<Channel>,
        batching: Batching,
    ) -> Option<Lane> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        let lane = match lanes.get(target) {
            Some(lane) => lane,
            None => lanes
                .entry(target.to_string())
                .or_insert_with(|| Lane::start(client.clone(), batching)),
        };
        lane.support.batches().then(|| lane.clone())
    }
}

/// How long a participant that answered a batch UNIMPLEMENTED gets single calls before a
/// batch is tried again: the answer may have come from a replica mid-deploy or a proxy.
const REPROBE_AFTER: Duration = Duration::from_secs(60);

/// What a lane knows of its participant's `BranchBatch`.
#[derive(Default)]
struct Support(Mutex<Known>);

#[derive(Default, Clone, Copy)]
enum Known {
    #[default]
    Untried,
    Taken,
    Refused(Instant),
}

impl Support {
    /// Whether calls may go in batches now (a refusal older than [`REPROBE_AFTER`] is
    /// forgotten).
    fn batches(&self) -> bool {
        let mut known = self.0.lock().expect("support lock");
        match *known {
            Known::Refused(at) if at.elapsed() < REPROBE_AFTER => false,
            Known::Refused(_) => {
                *known = Known::Untried;
                true
            }
            _ => true,
        }
    }

    fn untried(&self) -> bool {
        matches!(*self.0.lock().expect("support lock"), Known::Untried)
    }

    fn set(&self, to: Known) {
        *self.0.lock().expect("support lock") = to;
    }
}

/// The calls to one gRPC participant that may go together, and the task that sends them:
/// `in_flight` sends at a time, each taking every call queued when it leaves (up to
/// `max_items`). Coalescing adds no wait: a call that finds a slot free leaves at once; only
/// calls that come due while every slot is out wait, for the first slot to come back or
/// `max_wait`, whichever is first (then they leave without a slot). Dropped with its
/// connections (a TLS reload); the task then sends what is queued and ends.
#[derive(Clone)]
struct Lane {
    queue: mpsc::UnboundedSender<Queued>,
    support: Arc<Support>,
}

/// A call waiting in a lane, with where its answer goes.
struct Queued {
    request: BranchRequest,
    sent: Sent,
    answer: oneshot::Sender<Result<Answer, String>>,
}

impl Lane {
    fn start(client: ParticipantClient<Channel>, batching: Batching) -> Lane {
        let (queue, mut waiting) = mpsc::unbounded_channel::<Queued>();
        let support = Arc::new(Support::default());
        let slots = Arc::new(Semaphore::new(batching.in_flight.max(1)));
        let lane = Lane {
            queue,
            support: support.clone(),
        };
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let free = slots.clone().acquire_owned();
                let slot = tokio::time::timeout(batching.max_wait, free).await.ok();
                let mut calls = vec![first];
                while calls.len() < batching.max_items {
                    match waiting.try_recv() {
                        Ok(call) => calls.push(call),
                        Err(_) => break,
                    }
                }
                let (client, support) = (client.clone(), support.clone());
                tokio::spawn(async move {
                    send_together(client, calls, &support).await;
                    drop(slot);
                });
            }
        });
        lane
    }

    /// Queues the call; its answer comes on the receiver.
    fn queue(
        &self,
        request: BranchRequest,
        sent: Sent,
    ) -> oneshot::Receiver<Result<Answer, String>> {
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            request,
            sent,
            answer,
        };
        // A closed queue drops the call, and its receiver says so.
        let _ = self.queue.send(queued);
        answered
    }

    /// The answer of a queued call.
    async fn answer(answered: oneshot::Receiver<Result<Answer, String>>) -> Answer {
        match answered.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(not_sent)) => Answer::Unknown(not_sent),
            Err(_) => Answer::Unknown("the call was dropped before its answer".into()),
        }
    }
}

/// Sends calls as one `BranchBatch` (one call alone as a plain `Branch`) and hands each its
/// own answer, classified exactly as a single call's would be. A batch answered UNIMPLEMENTED
/// is sent again as single calls (safe whatever ran: the barrier answers a repeat), and so
/// are the participant's later calls for [`REPROBE_AFTER`].
async fn send_together(
    mut client: ParticipantClient<Channel>,
    mut calls: Vec<Queued>,
    support: &Support,
) {
    if calls.len() == 1 {
        let Queued {
            request,
            sent,
            answer,
        } = calls.pop().expect("one call");
        let _ = answer.send(single_call(client, request, sent).await);
        return;
    }
    let timeout = calls.iter().map(|c| c.sent.timeout).min().expect("calls");
    let untried = support.untried();
    let items = calls
        .iter_mut()
        .map(|call| {
            // The batch has no metadata of its own per call: the attempt's trace context
            // travels in the request's headers, as the stored one does.
            if let Some(trace) = call.sent.trace
                && (call.request.headers.len() < dtx_proto::limits::MAX_HEADERS
                    || call.request.headers.contains_key(TRACEPARENT))
            {
                call.request
                    .headers
                    .insert(TRACEPARENT.to_string(), trace.to_string());
            }
            // Kept until the participant has shown it takes batches (it may send them back).
            let request = if untried {
                call.request.clone()
            } else {
                std::mem::take(&mut call.request)
            };
            BranchBatchItem {
                request: Some(request),
                call_token: call.sent.token.clone().unwrap_or_default(),
            }
        })
        .collect();
    let mut request = tonic::Request::new(BranchBatchRequest { items });
    request.set_timeout(timeout);
    let answered = tokio::time::timeout(timeout, client.branch_batch(request)).await;
    let answers: Vec<Answer> = match answered {
        Err(_) => vec![
            Answer::Unknown(format!("no answer within {} ms", timeout.as_millis()));
            calls.len()
        ],
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            support.set(Known::Refused(Instant::now()));
            let alone = calls.into_iter().map(|call| {
                let client = client.clone();
                async move {
                    let _ = call
                        .answer
                        .send(single_call(client, call.request, call.sent).await);
                }
            });
            futures::future::join_all(alone).await;
            return;
        }
        Ok(Err(status)) => vec![Answer::of_status(&status); calls.len()],
        Ok(Ok(response)) => {
            support.set(Known::Taken);
            let answers = response.into_inner().answers;
            if answers.len() == calls.len() {
                answers
                    .into_iter()
                    .map(|a| match tonic::Code::from_i32(a.code) {
                        tonic::Code::Ok => Answer::of_response(a.response.unwrap_or_default()),
                        code => Answer::of_status(&Status::new(code, a.message)),
                    })
                    .collect()
            } else {
                let seen = format!(
                    "a batch of {} calls got {} answers",
                    calls.len(),
                    answers.len()
                );
                vec![Answer::Unknown(seen); calls.len()]
            }
        }
    };
    for (call, answer) in calls.into_iter().zip(answers) {
        let _ = call.answer.send(Ok(answer));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_batch_gets_single_calls_until_the_refusal_is_old_then_a_batch_again() {
        let support = Support::default();
        assert!(support.batches() && support.untried());
        support.set(Known::Refused(Instant::now()));
        assert!(!support.batches(), "just refused: single calls");
        let old = Instant::now() - REPROBE_AFTER - Duration::from_millis(1);
        support.set(Known::Refused(old));
        assert!(support.batches(), "an old refusal is forgotten");
        assert!(support.untried(), "the next batch probes again");
        support.set(Known::Taken);
        assert!(support.batches() && !support.untried());
    }
}
