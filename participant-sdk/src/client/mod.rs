//! The initiator's client: TCC transactions, sagas and two-phase messages (see
//! [`MessageBuilder`]).
//!
//! TCC:
//! ```no_run
//! # async fn run() -> Result<(), dtx_sdk::Error> {
//! use dtx_sdk::client::{Coordinator, TccBranch, TccOptions};
//! let coordinator = Coordinator::connect("http://127.0.0.1:50070").await?;
//! let receipt = coordinator
//!     .tcc(TccOptions::default(), |tx| async move {
//!         tx.call(TccBranch::new("http://accounts:50051", "debit", b"alice:10".to_vec())).await?;
//!         tx.call(TccBranch::new("http://accounts:50051", "credit", b"bob:10".to_vec())).await?;
//!         Ok::<_, dtx_sdk::Error>(tx.xid().to_string())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//! `tcc` commits when the closure returns `Ok` and rolls back when it returns `Err` - which is
//! what happens when a Try is refused (FAILURE) or its outcome is unknown: an unknown Try is
//! never committed.
//!
//! Saga:
//! ```no_run
//! # async fn run() -> Result<(), dtx_sdk::Error> {
//! use dtx_sdk::client::{Coordinator, SagaStep};
//! let coordinator = Coordinator::connect("http://127.0.0.1:50070").await?;
//! let outcome = coordinator
//!     .saga()
//!     .step(SagaStep::new("reserve", "http://inventory:50051", "reserve").payload(b"sku-1:2".to_vec()))
//!     .step(SagaStep::new("charge", "http://payment:50051", "charge").payload(b"alice:30".to_vec()))
//!     .submit()
//!     .await?
//!     .await_outcome(std::time::Duration::from_secs(30))
//!     .await?;
//! assert!(outcome.succeeded());
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dtx_proto::answer::Answer;
use dtx_proto::backoff::Backoff;
pub use dtx_proto::tls::ClientTls;
use dtx_proto::trace::{TRACEPARENT, TraceParent};
use dtx_proto::v1::coordinator_client::CoordinatorClient;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{self as wire, BranchAction, TxStatus};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::Error;

/// Options of a TCC transaction.
#[derive(Debug, Clone)]
pub struct TccOptions {
    /// The global transaction id; generated if `None`. Choose one to make Begin retry-safe.
    pub xid: Option<String>,
    /// Rolled back automatically if not decided within this time.
    pub timeout: Duration,
    /// Timeout of each Try call, and of Confirm/Cancel calls made by the coordinator.
    pub call_timeout: Duration,
    /// Retries of a Try answered RETRY or UNAVAILABLE before giving up (and rolling back).
    pub try_retries: u32,
    /// Wait until phase two finished (every Confirm/Cancel delivered) before `commit`
    /// returns; `None` returns once the decision is durable.
    pub wait_phase_two: Option<Duration>,
    /// The W3C `traceparent` of the work this transaction is part of (e.g. the incoming
    /// request's); every call of the transaction joins that trace. `None` or invalid: the
    /// transaction starts a trace of its own.
    pub traceparent: Option<String>,
}

impl Default for TccOptions {
    fn default() -> Self {
        TccOptions {
            xid: None,
            timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(10),
            try_retries: 2,
            wait_phase_two: Some(Duration::from_secs(30)),
            traceparent: None,
        }
    }
}

/// A branch of a TCC transaction: which participant and handler, and the payload its Try,
/// Confirm and Cancel receive.
#[derive(Debug, Clone)]
pub struct TccBranch {
    /// The participant's URL (`http://host:port`, `https://...`).
    pub target: String,
    /// The handler name the participant serves.
    pub handler: String,
    /// The body its Try, Confirm and Cancel receive.
    pub payload: Vec<u8>,
    /// Headers sent with each of its calls.
    pub headers: BTreeMap<String, String>,
    /// Defaults to "b1", "b2", ... in call order.
    pub branch_id: Option<String>,
}

impl TccBranch {
    /// A branch calling `handler` at `target` with `payload`.
    pub fn new(target: impl Into<String>, handler: impl Into<String>, payload: Vec<u8>) -> Self {
        TccBranch {
            target: target.into(),
            handler: handler.into(),
            payload,
            headers: BTreeMap::new(),
            branch_id: None,
        }
    }

    /// Names the branch (it must be unique within the transaction).
    pub fn id(mut self, branch_id: impl Into<String>) -> Self {
        self.branch_id = Some(branch_id.into());
        self
    }

    /// A header sent with each of the branch's calls.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }
}

/// A connection to a coordinator (and to the participants whose Try it invokes). Cheap to
/// clone.
#[derive(Clone)]
pub struct Coordinator {
    client: CoordinatorClient<Channel>,
    participants: Arc<RwLock<HashMap<String, ParticipantClient<Channel>>>>,
    /// TLS for `https://` URLs (the coordinator's and the participants' of direct Trys).
    tls: Option<Arc<ClientTls>>,
    /// The `authorization` value sent with every coordinator call, when auth is on.
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

fn endpoint(url: &str, tls: Option<&ClientTls>) -> Result<Endpoint, Error> {
    Ok(dtx_proto::tls::endpoint(url, tls)
        .map_err(|e| Error::Limit(dtx_proto::limits::LimitError(e)))?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true))
}

/// Waits between repeats of a coordinator RPC answered UNAVAILABLE: 50, 100, 200, 400 ms.
const UNAVAILABLE_RETRY: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(400));

/// Waits between attempts of the initiator's own Try: 100 ms doubling up to 3.2 s.
const TRY_RETRY: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(3200));

/// Runs an idempotent coordinator RPC, repeating it while the coordinator is UNAVAILABLE.
async fn idempotent<T, F, Fut>(mut rpc: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    for failures in 0..4 {
        match rpc().await {
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(UNAVAILABLE_RETRY.delay(failures, 0.0)).await;
            }
            other => return other.map(tonic::Response::into_inner).map_err(Error::from),
        }
    }
    Ok(rpc().await?.into_inner())
}

/// `idempotent` for one method of a [`Coordinator`]: each attempt clones the client and the
/// request, carries the bearer token, and a child span of the transaction's trace context, if
/// given, in its metadata.
macro_rules! rpc {
    ($coordinator:expr, $method:ident, $request:expr) => {
        rpc!($coordinator, $method, $request, None::<TraceParent>)
    };
    ($coordinator:expr, $method:ident, $request:expr, $trace:expr) => {
        idempotent(|| {
            let mut client = $coordinator.client.clone();
            let mut request = $coordinator.request($request.clone());
            if let Some(trace) = $trace {
                trace.child().insert_into(request.metadata_mut());
            }
            async move { client.$method(request).await }
        })
    };
}

mod message;
pub use message::{Committed, MessageBranch, MessageBuilder, PreparedMessage};

impl Coordinator {
    /// Connects to the coordinator at `url` (e.g. `http://127.0.0.1:50070`; an `https://` URL
    /// is TLS with the system's roots).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Ok(Self::from_channel(endpoint(url, None)?.connect().await?))
    }

    /// Connects to the coordinator at an `https://` `url` with `tls` (its CA, and a client
    /// certificate where the coordinator requires one), which also serves the direct Trys to
    /// `https://` participants.
    pub async fn connect_tls(url: &str, tls: ClientTls) -> Result<Self, Error> {
        if !url.starts_with("https://") {
            return Err(Error::Limit(dtx_proto::limits::LimitError(format!(
                "{url:?}: TLS settings are for an https:// URL"
            ))));
        }
        let channel = endpoint(url, Some(&tls))?.connect().await?;
        Ok(Coordinator {
            tls: Some(Arc::new(tls)),
            ..Self::from_channel(channel)
        })
    }

    /// A client on an existing channel (for custom transports or interceptors).
    pub fn from_channel(channel: Channel) -> Self {
        Coordinator {
            client: CoordinatorClient::new(channel).max_decoding_message_size(16 * 1024 * 1024),
            participants: Arc::default(),
            tls: None,
            token: None,
        }
    }

    /// Sends `token` as `authorization: Bearer <token>` with every call to the coordinator
    /// (a coordinator with auth on refuses calls without one).
    pub fn with_token(mut self, token: &str) -> Result<Self, Error> {
        self.token = Some(
            dtx_proto::auth::bearer_value(token)
                .map_err(|e| Error::Limit(dtx_proto::limits::LimitError(e.0)))?,
        );
        Ok(self)
    }

    /// A request to the coordinator, with the bearer token if one is set.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert(dtx_proto::auth::AUTHORIZATION, token.clone());
        }
        request
    }

    fn participant(&self, target: &str) -> Result<ParticipantClient<Channel>, Error> {
        if let Some(client) = self.participants.read().expect("participants").get(target) {
            return Ok(client.clone());
        }
        let client = ParticipantClient::new(endpoint(target, self.tls.as_deref())?.connect_lazy());
        self.participants
            .write()
            .expect("participants")
            .insert(target.to_string(), client.clone());
        Ok(client)
    }

    /// Starts a TCC transaction. Nothing is sent yet: the coordinator begins it durably
    /// together with its first branch (one round trip less), or at commit/rollback if it has no
    /// branch. Its deadline counts from then.
    pub async fn begin(&self, options: TccOptions) -> Result<TccTransaction, Error> {
        let xid = options
            .xid
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        dtx_proto::limits::check_xid(&xid)?;
        let trace = options
            .traceparent
            .as_deref()
            .and_then(TraceParent::parse)
            .unwrap_or_else(TraceParent::new_root);
        Ok(TccTransaction {
            xid,
            trace,
            options,
            coordinator: self.clone(),
            branches: Arc::new(AtomicU32::new(0)),
            begun: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Runs `body` in a TCC transaction: commits if it returns `Ok`, rolls back if it returns
    /// `Err` (the error is returned after the rollback was requested).
    pub async fn tcc<T, E, F, Fut>(&self, options: TccOptions, body: F) -> Result<T, E>
    where
        E: From<Error>,
        F: FnOnce(TccTransaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let tx = self.begin(options).await?;
        match body(tx.clone()).await {
            Ok(value) => {
                tx.commit().await?;
                Ok(value)
            }
            Err(e) => {
                if let Err(rollback) = tx.rollback().await {
                    // The deadline rolls it back anyway; the caller's error matters more.
                    tracing::warn!(xid = %tx.xid, error = %rollback, "rollback request failed");
                }
                Err(e)
            }
        }
    }

    /// Starts defining a saga.
    pub fn saga(&self) -> SagaBuilder {
        SagaBuilder {
            coordinator: self.clone(),
            request: wire::SubmitSagaRequest::default(),
        }
    }

    /// Reads a transaction.
    pub async fn get(&self, xid: &str) -> Result<wire::Transaction, Error> {
        let request = wire::GetRequest {
            xid: xid.to_string(),
        };
        rpc!(self, get, request).await
    }

    /// Waits until the transaction is settled or `timeout` elapsed; returns it either way.
    pub async fn wait(&self, xid: &str, timeout: Duration) -> Result<wire::Transaction, Error> {
        let request = wire::WaitRequest {
            xid: xid.to_string(),
            timeout_ms: timeout.as_millis().max(1) as u64,
        };
        let mut client = self.client.clone();
        let mut call = self.request(request);
        call.set_timeout(timeout + Duration::from_secs(5));
        Ok(client.wait(call).await?.into_inner())
    }

    /// Operator action: resumes a transaction parked in NEEDS_ATTENTION.
    pub async fn resume(&self, xid: &str) -> Result<wire::Transaction, Error> {
        let request = wire::ResumeRequest {
            xid: xid.to_string(),
        };
        Ok(self
            .client
            .clone()
            .resume(self.request(request))
            .await?
            .into_inner())
    }
}

/// An open TCC transaction. Cheap to clone.
#[derive(Clone)]
pub struct TccTransaction {
    xid: String,
    /// The trace every call of the transaction joins (stored with each branch).
    trace: TraceParent,
    options: TccOptions,
    coordinator: Coordinator,
    branches: Arc<AtomicU32>,
    /// The coordinator is known to have the transaction.
    begun: Arc<AtomicBool>,
}

impl TccTransaction {
    /// The transaction's xid, as the caller named it (or as it was generated).
    pub fn xid(&self) -> &str {
        &self.xid
    }

    /// The trace context of the transaction (its trace id names the transaction in traces).
    pub fn traceparent(&self) -> TraceParent {
        self.trace
    }

    /// Registers the branch with the coordinator (durably, so a rollback will Cancel it even
    /// if the Try never arrives), then invokes its Try. Returns the Try's result; a refusal is
    /// [`Error::BranchRefused`], an unknown outcome [`Error::BranchInDoubt`] - after either the
    /// transaction must roll back.
    pub async fn call(&self, branch: TccBranch) -> Result<Vec<u8>, Error> {
        let branch_id = branch
            .branch_id
            .clone()
            .unwrap_or_else(|| format!("b{}", self.branches.fetch_add(1, Ordering::Relaxed) + 1));
        let mut headers = branch.headers;
        headers
            .entry(TRACEPARENT.to_string())
            .or_insert_with(|| self.trace.to_string());
        let register = wire::RegisterBranchRequest {
            xid: self.xid.clone(),
            branch_id: branch_id.clone(),
            target: branch.target.clone(),
            handler: branch.handler.clone(),
            payload: branch.payload.clone(),
            headers: headers.clone(),
            call_timeout_ms: self.options.call_timeout.as_millis() as u64,
            begin_timeout_ms: if self.begun.load(Ordering::Acquire) {
                0
            } else {
                self.options.timeout.as_millis().max(1) as u64
            },
        };
        let trace = Some(self.trace);
        let registered = rpc!(self.coordinator, register_branch, register, trace).await?;
        self.begun.store(true, Ordering::Release);
        // The coordinator's signature on this Try, for participants that obey only it.
        let try_token =
            match registered.try_token.as_str() {
                "" => None,
                token => Some(token.parse::<tonic::metadata::MetadataValue<_>>().map_err(
                    |_| {
                        Error::Limit(dtx_proto::limits::LimitError(
                            "the coordinator's try_token is not ASCII".into(),
                        ))
                    },
                )?),
            };
        let request = wire::BranchRequest {
            // The xid the participant's barrier keys on (scoped by the caller's tenant).
            xid: match registered.branch_xid {
                scoped if scoped.is_empty() => self.xid.clone(),
                scoped => scoped,
            },
            branch_id: branch_id.clone(),
            action: BranchAction::Try as i32,
            handler: branch.handler,
            payload: branch.payload,
            headers,
        };
        let mut last = String::new();
        for attempt in 0..=self.options.try_retries {
            if attempt > 0 {
                tokio::time::sleep(TRY_RETRY.delay(attempt, 0.0)).await;
            }
            let mut participant = self.coordinator.participant(&branch.target)?;
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(self.options.call_timeout);
            self.trace.child().insert_into(call.metadata_mut());
            if let Some(token) = &try_token {
                call.metadata_mut()
                    .insert(dtx_proto::auth::CALL_TOKEN, token.clone());
            }
            let answer =
                tokio::time::timeout(self.options.call_timeout, participant.branch(call)).await;
            match answer {
                // One classification table for every branch answer (`dtx_proto::answer`):
                // only an explicit FAILURE proves the Try had no effect; a status-only answer
                // is retried (the barrier returns a repeat's first result) and, if it never
                // clears, leaves the branch in doubt for the rollback's Cancel.
                Ok(result) => match Answer::of_result(result) {
                    Answer::Success(result) => return Ok(result),
                    Answer::Refused(message) => {
                        return Err(Error::BranchRefused {
                            xid: self.xid.clone(),
                            branch_id,
                            message,
                        });
                    }
                    Answer::Unknown(seen) => last = seen,
                },
                Err(_) => {
                    // A timed-out Try may still commit later; it is not retried (the retry
                    // would race it) - the rollback's Cancel and the barrier settle it.
                    return Err(Error::BranchInDoubt {
                        xid: self.xid.clone(),
                        branch_id,
                        message: format!(
                            "no answer within {} ms",
                            self.options.call_timeout.as_millis()
                        ),
                    });
                }
            }
        }
        Err(Error::BranchInDoubt {
            xid: self.xid.clone(),
            branch_id,
            message: last,
        })
    }

    /// Decides Commit (durable before it returns); waits for phase two if the options say so.
    pub async fn commit(&self) -> Result<TxStatus, Error> {
        self.decide(true).await
    }

    /// Decides Rollback; every registered branch gets its Cancel.
    pub async fn rollback(&self) -> Result<TxStatus, Error> {
        self.decide(false).await
    }

    async fn decide(&self, commit: bool) -> Result<TxStatus, Error> {
        if !self.begun.load(Ordering::Acquire) {
            // No branch was registered (or a registration's outcome is unknown): make sure
            // the transaction exists, so the decision is recorded and any branch is settled.
            let begin = wire::BeginRequest {
                xid: self.xid.clone(),
                timeout_ms: self.options.timeout.as_millis().max(1) as u64,
            };
            rpc!(self.coordinator, begin, begin, Some(self.trace)).await?;
            self.begun.store(true, Ordering::Release);
        }
        let request = wire::DecideRequest {
            xid: self.xid.clone(),
            wait: self.options.wait_phase_two.is_some(),
            wait_timeout_ms: self
                .options
                .wait_phase_two
                .map_or(0, |d| d.as_millis() as u64),
        };
        let trace = Some(self.trace);
        let response = if commit {
            rpc!(self.coordinator, commit, request, trace).await?
        } else {
            rpc!(self.coordinator, rollback, request, trace).await?
        };
        Ok(response.status())
    }
}

/// A saga step: participant, handler, payloads, dependencies, policy.
#[derive(Debug, Clone)]
pub struct SagaStep(wire::SagaStep);

impl SagaStep {
    /// A step named `name` (unique in the saga; also its barrier branch id) calling `handler`
    /// (an action/compensate pair) on the participant at `target`.
    pub fn new(
        name: impl Into<String>,
        target: impl Into<String>,
        handler: impl Into<String>,
    ) -> Self {
        SagaStep(wire::SagaStep {
            name: name.into(),
            target: target.into(),
            handler: handler.into(),
            ..Default::default()
        })
    }

    /// The action's payload (also the compensation's, unless set separately).
    pub fn payload(mut self, payload: Vec<u8>) -> Self {
        self.0.action_payload = payload;
        self
    }

    /// The compensation's payload, when it differs from the action's.
    pub fn compensate_payload(mut self, payload: Vec<u8>) -> Self {
        self.0.compensate_payload = payload;
        self
    }
}

/// The builder methods a saga step and a message branch share (each wraps a wire message with
/// `depends_on`, `retry` and `headers`), written once; the docs say what differs.
macro_rules! dependent_call_builder {
    ($builder:ty, after = $after:literal, retry = $retry:literal, header = $header:literal) => {
        impl $builder {
            #[doc = $after]
            pub fn after<I, S>(mut self, names: I) -> Self
            where
                I: IntoIterator<Item = S>,
                S: Into<String>,
            {
                self.0.depends_on.extend(names.into_iter().map(Into::into));
                self
            }

            #[doc = $retry]
            pub fn retry(mut self, policy: RetryPolicy) -> Self {
                self.0.retry = Some(policy.into());
                self
            }

            #[doc = $header]
            pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
                self.0.headers.insert(key.into(), value.into());
                self
            }
        }
    };
}

dependent_call_builder!(
    SagaStep,
    after = "Runs only after these steps succeeded. Without any `after` in the saga, steps run \
             in the order they were added.",
    retry = "Attempts, backoff and call timeout of this step's calls.",
    header = "A header sent with each of the step's calls."
);
dependent_call_builder!(
    MessageBranch,
    after = "Delivered only after these branches were. Branches without any are delivered at \
             once.",
    retry = "Backoff and call timeout of this branch's deliveries (its attempts are unlimited).",
    header = "A header sent with every delivery of this branch."
);

/// How the coordinator retries calls whose outcome is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryPolicy {
    /// Attempts of an action before the saga compensates (0: the coordinator's default, 5).
    pub max_attempts: u32,
    /// The first wait between attempts (it doubles, with jitter; zero: the default).
    pub initial_backoff: Duration,
    /// The longest wait between attempts (zero: the default).
    pub max_backoff: Duration,
    /// Timeout of one call (an expired call has an unknown outcome).
    pub call_timeout: Duration,
}

impl From<RetryPolicy> for wire::RetryPolicy {
    fn from(p: RetryPolicy) -> Self {
        wire::RetryPolicy {
            max_attempts: p.max_attempts,
            initial_backoff_ms: p.initial_backoff.as_millis() as u64,
            max_backoff_ms: p.max_backoff.as_millis() as u64,
            call_timeout_ms: p.call_timeout.as_millis() as u64,
        }
    }
}

/// Builds a saga definition; [`SagaBuilder::submit`] stores it in one durable write.
pub struct SagaBuilder {
    coordinator: Coordinator,
    request: wire::SubmitSagaRequest,
}

impl SagaBuilder {
    /// The saga's id (generated if not set). Submitting the same definition again under the
    /// same xid is harmless; a different definition is rejected.
    pub fn xid(mut self, xid: impl Into<String>) -> Self {
        self.request.xid = xid.into();
        self
    }

    /// Forward progress must finish within this time, or the saga compensates.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.request.timeout_ms = timeout.as_millis() as u64;
        self
    }

    /// The retry policy of every step that does not set its own.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.request.retry = Some(policy.into());
        self
    }

    /// Sent with every call of every step.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.headers.insert(key.into(), value.into());
        self
    }

    /// The W3C `traceparent` of the work this saga is part of; every call of the saga joins
    /// that trace. Not set or invalid: the saga starts a trace of its own.
    pub fn traceparent(self, traceparent: &str) -> Self {
        match TraceParent::parse(traceparent) {
            Some(trace) => self.header(TRACEPARENT, trace.to_string()),
            None => self,
        }
    }

    /// Adds a step.
    pub fn step(mut self, step: SagaStep) -> Self {
        self.request.steps.push(step.0);
        self
    }

    /// The definition as it goes on the wire.
    pub fn definition(&self) -> &wire::SubmitSagaRequest {
        &self.request
    }

    /// Submits the saga. Invalid definitions (cycles, unknown dependencies, duplicate names,
    /// limits) are rejected with `INVALID_ARGUMENT` and nothing is stored.
    pub async fn submit(self) -> Result<SagaHandle, Error> {
        Ok(self.send(Duration::ZERO).await?.0)
    }

    /// Submits the saga and waits for its outcome, in one round trip when it settles within
    /// `timeout` ([`Error::NotSettled`] if it does not).
    pub async fn run(self, timeout: Duration) -> Result<SagaOutcome, Error> {
        let started = tokio::time::Instant::now();
        let (handle, transaction) = self.send(timeout).await?;
        match transaction {
            Some(tx) if tx.status().is_settled() => Ok(SagaOutcome(tx)),
            _ => {
                handle
                    .await_outcome(timeout.saturating_sub(started.elapsed()))
                    .await
            }
        }
    }

    async fn send(
        mut self,
        wait: Duration,
    ) -> Result<(SagaHandle, Option<wire::Transaction>), Error> {
        if self.request.xid.is_empty() {
            self.request.xid = uuid::Uuid::new_v4().to_string();
        }
        self.request.wait_timeout_ms = wait.as_millis() as u64;
        let trace = match TraceParent::of_headers(&self.request.headers) {
            Some(trace) => trace,
            None => {
                let root = TraceParent::new_root();
                self.request
                    .headers
                    .insert(TRACEPARENT.to_string(), root.to_string());
                root
            }
        };
        let request = self.request;
        let submitted = rpc!(self.coordinator, submit_saga, request, Some(trace)).await?;
        let handle = SagaHandle {
            xid: submitted.xid,
            coordinator: self.coordinator,
        };
        Ok((handle, submitted.transaction))
    }
}

/// A submitted saga.
pub struct SagaHandle {
    xid: String,
    coordinator: Coordinator,
}

impl SagaHandle {
    /// The saga's xid.
    pub fn xid(&self) -> &str {
        &self.xid
    }

    /// Waits for the saga's outcome (long-polling the coordinator). Returns
    /// [`Error::NotSettled`] if it is still running after `timeout`.
    pub async fn await_outcome(&self, timeout: Duration) -> Result<SagaOutcome, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let tx = self
                .coordinator
                .wait(&self.xid, left.max(Duration::from_millis(1)))
                .await?;
            let status = tx.status();
            if status.is_settled() {
                return Ok(SagaOutcome(tx));
            }
            if left.is_zero() {
                return Err(Error::NotSettled {
                    xid: self.xid.clone(),
                    status,
                });
            }
        }
    }
}

/// The settled state of a saga.
#[derive(Debug, Clone)]
pub struct SagaOutcome(pub wire::Transaction);

impl SagaOutcome {
    /// SUCCEEDED, COMPENSATED or NEEDS_ATTENTION.
    pub fn status(&self) -> TxStatus {
        self.0.status()
    }

    /// Whether every step's action succeeded.
    pub fn succeeded(&self) -> bool {
        self.status() == TxStatus::Succeeded
    }

    /// The result payload of a step's action (empty if it did not succeed).
    pub fn result(&self, step: &str) -> Option<&[u8]> {
        self.0
            .branches
            .iter()
            .find(|b| b.branch_id == step)
            .map(|b| b.result.as_slice())
    }

    /// Every step as the coordinator recorded it (state, attempts, last error, result).
    pub fn steps(&self) -> &[wire::Branch] {
        &self.0.branches
    }
}
