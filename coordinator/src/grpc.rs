//! The `dtx.v1.Coordinator` service: request conversion, engine calls, and the one place where
//! errors become gRPC codes.

use std::sync::Arc;
use std::time::Duration;

use dtx_proto::codec::SizeGuard;
use dtx_proto::limits;
use dtx_proto::reason::Reason;
use dtx_proto::v1 as wire;
use dtx_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::auth::{Auth, Caller};
use crate::domain::{BranchState, Decision, Kind, TxRecord, TxStatus};
use crate::engine::{Engine, NewBranch, Operator};
use crate::error::Error;
use crate::quota::Quotas;

/// The gRPC face of an [`Engine`].
pub struct CoordinatorService {
    engine: Engine,
    auth: Auth,
    /// Shared with the HTTP/JSON front end: one tenant's buckets whichever way it calls.
    quotas: Arc<Quotas>,
}

impl CoordinatorService {
    /// The service itself, for the HTTP/JSON front end (which calls its methods directly).
    pub fn plain(engine: Engine, auth: Auth, quotas: Arc<Quotas>) -> Self {
        CoordinatorService {
            engine,
            auth,
            quotas,
        }
    }

    pub fn new(
        engine: Engine,
        auth: Auth,
        quotas: Arc<Quotas>,
    ) -> SizeGuard<CoordinatorServer<Self>> {
        // The decoding limit comes from the contract: every request within the limits (and
        // one somewhat over a field limit, which then gets that field's message) decodes; a
        // larger one is refused before it is buffered, and the guard names the limits.
        SizeGuard::new(
            CoordinatorServer::new(Self::plain(engine, auth, quotas))
                .max_decoding_message_size(limits::MAX_REQUEST_BYTES),
        )
    }

    /// Charges `caller`'s tenant for a begin (when `begins`: its rate and its transactions in
    /// flight) and `payload_bytes`, before anything is stored; RESOURCE_EXHAUSTED (counted)
    /// over a quota.
    async fn charge(
        &self,
        caller: &Caller,
        begins: bool,
        payload_bytes: usize,
    ) -> Result<(), Status> {
        let tenant = caller.tenant.as_str();
        let charged = match begins {
            true => match self.quotas.begin(tenant) {
                Ok(()) => {
                    let count = |up_to| self.engine.count_in_flight(tenant, up_to);
                    self.quotas.in_flight(tenant, count).await
                }
                refused => refused,
            },
            false => Ok(()),
        }
        .and_then(|()| self.quotas.payload(tenant, payload_bytes));
        charged.map_err(|e| {
            self.engine
                .metrics()
                .quota_rejected(&caller.tenant, e.quota);
            e.status
        })
    }

    /// The caller of `Coordinator/<method>`, checked before anything else happens.
    fn caller<T>(&self, request: &Request<T>, method: &str) -> Result<Caller, Status> {
        self.auth
            .caller(request.metadata(), &format!("dtx.v1.Coordinator/{method}"))
    }
}

impl CoordinatorService {
    /// SubmitMessage (`Commit`) or AbortMessage (`Rollback`).
    async fn decide_message(
        &self,
        caller: Caller,
        req: wire::DecideRequest,
        decision: Decision,
    ) -> Result<Response<wire::DecideResponse>, Status> {
        let span = tracing::info_span!("decide_message", xid = %req.xid, %decision);
        async move {
            let key = caller.scope(&req.xid)?;
            let wait = wait_for(req.wait, req.wait_timeout_ms)?;
            let status = (self.engine)
                .decide(key, Kind::Message, decision, wait)
                .await?;
            Ok(Response::new(wire::DecideResponse {
                xid: req.xid,
                status: wire_status(status) as i32,
            }))
        }
        .instrument(span)
        .await
    }
}

/// The xid as its caller knows it (without its tenant's scope).
pub fn caller_xid(key: &str) -> String {
    limits::unscoped(key).1.to_string()
}

/// The error's reason (and so its code) with its message; a contradicted decision also says
/// the recorded status in `dtx-status`.
impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let mut status = e.reason().status(e.to_string());
        if let Error::Decided {
            status: recorded, ..
        } = &e
            && let Ok(v) = recorded.as_str().parse()
        {
            status.metadata_mut().insert("dtx-status", v);
        }
        status
    }
}

pub fn wire_status(status: TxStatus) -> wire::TxStatus {
    match status {
        TxStatus::Trying => wire::TxStatus::Trying,
        TxStatus::Committing => wire::TxStatus::Committing,
        TxStatus::Committed => wire::TxStatus::Committed,
        TxStatus::RollingBack => wire::TxStatus::RollingBack,
        TxStatus::RolledBack => wire::TxStatus::RolledBack,
        TxStatus::Running => wire::TxStatus::Running,
        TxStatus::Succeeded => wire::TxStatus::Succeeded,
        TxStatus::Compensating => wire::TxStatus::Compensating,
        TxStatus::Compensated => wire::TxStatus::Compensated,
        TxStatus::NeedsAttention => wire::TxStatus::NeedsAttention,
        TxStatus::Prepared => wire::TxStatus::Prepared,
    }
}

fn wire_branch_status(state: BranchState) -> wire::BranchStatus {
    match state {
        BranchState::Pending => wire::BranchStatus::Pending,
        BranchState::InDoubt => wire::BranchStatus::InDoubt,
        BranchState::Done => wire::BranchStatus::Done,
        BranchState::Refused => wire::BranchStatus::Refused,
        BranchState::Confirmed => wire::BranchStatus::Confirmed,
        BranchState::Cancelled => wire::BranchStatus::Cancelled,
        BranchState::Compensated => wire::BranchStatus::Compensated,
        BranchState::Stuck => wire::BranchStatus::Stuck,
        BranchState::Skipped => wire::BranchStatus::Skipped,
    }
}

pub fn wire_kind(kind: Kind) -> wire::TxKind {
    match kind {
        Kind::Tcc => wire::TxKind::Tcc,
        Kind::Saga => wire::TxKind::Saga,
        Kind::Message => wire::TxKind::Message,
    }
}

/// The wire form of a transaction, with saga and message dependencies from its definition.
pub fn wire_transaction(record: TxRecord) -> wire::Transaction {
    let g = record.global;
    let deps = dependencies(g.kind, g.spec.as_deref());
    wire::Transaction {
        branches: record
            .branches
            .into_iter()
            .map(|b| wire::Branch {
                depends_on: deps.get(b.branch_id.as_str()).cloned().unwrap_or_default(),
                status: wire_branch_status(b.state) as i32,
                attempts: b.attempts.clamp(0, i64::from(u32::MAX)) as u32,
                last_error: b.last_error.unwrap_or_default(),
                result: b.result.unwrap_or_default(),
                branch_id: b.branch_id.into(),
                target: b.target,
                handler: b.handler,
            })
            .collect(),
        xid: caller_xid(&g.xid),
        kind: wire_kind(g.kind) as i32,
        status: wire_status(g.status) as i32,
        decision: g
            .decision
            .map(|d| d.as_str().to_string())
            .unwrap_or_default(),
        deadline_unix_ms: g.deadline_ms,
        created_unix_ms: g.created_ms,
        updated_unix_ms: g.updated_ms,
        last_error: g.last_error.unwrap_or_default(),
    }
}

fn dependencies(kind: Kind, spec: Option<&[u8]>) -> std::collections::HashMap<String, Vec<String>> {
    use prost::Message;
    let Some(spec) = spec else {
        return Default::default();
    };
    match kind {
        Kind::Tcc => Default::default(),
        Kind::Saga => wire::SubmitSagaRequest::decode(spec)
            .map(|req| {
                req.steps
                    .into_iter()
                    .map(|s| (s.name, s.depends_on))
                    .collect()
            })
            .unwrap_or_default(),
        Kind::Message => wire::PrepareMessageRequest::decode(spec)
            .map(|req| {
                req.branches
                    .into_iter()
                    .map(|b| (b.name, b.depends_on))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn wait_for(wait: bool, millis: u64) -> Result<Option<Duration>, Status> {
    if !wait {
        return Ok(None);
    }
    limits::timeout(
        "wait_timeout_ms",
        millis,
        Duration::from_secs(30),
        limits::MAX_WAIT,
    )
    .map(Some)
    .map_err(|e| Reason::InvalidRequest.status(e.0))
}

macro_rules! traced {
    ($name:literal, $xid:expr, $body:expr) => {{
        let span = tracing::info_span!($name, xid = %$xid);
        async move { $body }.instrument(span).await
    }};
}

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn begin(
        &self,
        request: Request<wire::BeginRequest>,
    ) -> Result<Response<wire::BeginResponse>, Status> {
        let caller = self.caller(&request, "Begin")?;
        let req = request.into_inner();
        traced!("begin", req.xid, {
            let (xid, key) = caller.scope_or_new(req.xid)?;
            self.charge(&caller, true, 0).await?;
            let row = self.engine.begin(Some(key), req.timeout_ms).await?;
            Ok(Response::new(wire::BeginResponse {
                xid,
                deadline_unix_ms: row.deadline_ms,
                status: wire_status(row.status) as i32,
            }))
        })
    }

    async fn register_branch(
        &self,
        request: Request<wire::RegisterBranchRequest>,
    ) -> Result<Response<wire::RegisterBranchResponse>, Status> {
        let caller = self.caller(&request, "RegisterBranch")?;
        let req = with_caller_trace(request, |r| &mut r.headers);
        traced!("register_branch", req.xid, {
            let key = caller.scope(&req.xid)?;
            self.charge(&caller, req.begin_timeout_ms != 0, req.payload.len())
                .await?;
            let call_timeout = limits::timeout(
                "call_timeout_ms",
                req.call_timeout_ms,
                limits::DEFAULT_CALL_TIMEOUT,
                limits::MAX_CALL_TIMEOUT,
            )
            .map_err(Error::from)?;
            let begin_timeout = match req.begin_timeout_ms {
                0 => None,
                ms => Some(
                    limits::timeout(
                        "begin_timeout_ms",
                        ms,
                        limits::DEFAULT_TX_TIMEOUT,
                        limits::MAX_TX_TIMEOUT,
                    )
                    .map_err(Error::from)?,
                ),
            };
            let try_call = dtx_proto::auth::Call {
                xid: &key,
                branch: &req.branch_id,
                action: dtx_proto::auth::action_claim(wire::BranchAction::Try as i32),
                handler: &req.handler,
            };
            let try_token = self
                .engine
                .sign_try(&req.target, try_call)
                .map_err(|e| Reason::Internal.status(e))?
                .unwrap_or_default();
            let branch = NewBranch {
                branch_id: req.branch_id,
                target: req.target,
                handler: req.handler,
                payload: req.payload,
                headers: req.headers,
                call_timeout,
                begin_timeout,
            };
            self.engine.register_branch(key.clone(), branch).await?;
            Ok(Response::new(wire::RegisterBranchResponse {
                branch_xid: key,
                try_token,
            }))
        })
    }

    async fn commit(
        &self,
        request: Request<wire::DecideRequest>,
    ) -> Result<Response<wire::DecideResponse>, Status> {
        let caller = self.caller(&request, "Commit")?;
        let req = request.into_inner();
        traced!("commit", req.xid, {
            let key = caller.scope(&req.xid)?;
            let wait = wait_for(req.wait, req.wait_timeout_ms)?;
            let status = (self.engine)
                .decide(key, Kind::Tcc, Decision::Commit, wait)
                .await?;
            Ok(Response::new(wire::DecideResponse {
                xid: req.xid,
                status: wire_status(status) as i32,
            }))
        })
    }

    async fn rollback(
        &self,
        request: Request<wire::DecideRequest>,
    ) -> Result<Response<wire::DecideResponse>, Status> {
        let caller = self.caller(&request, "Rollback")?;
        let req = request.into_inner();
        traced!("rollback", req.xid, {
            let key = caller.scope(&req.xid)?;
            let wait = wait_for(req.wait, req.wait_timeout_ms)?;
            let status = (self.engine)
                .decide(key, Kind::Tcc, Decision::Rollback, wait)
                .await?;
            Ok(Response::new(wire::DecideResponse {
                xid: req.xid,
                status: wire_status(status) as i32,
            }))
        })
    }

    async fn submit_saga(
        &self,
        request: Request<wire::SubmitSagaRequest>,
    ) -> Result<Response<wire::SubmitSagaResponse>, Status> {
        let caller = self.caller(&request, "SubmitSaga")?;
        let mut req = with_caller_trace(request, |r| &mut r.headers);
        traced!("submit_saga", req.xid, {
            let (xid, key) = caller.scope_or_new(std::mem::take(&mut req.xid))?;
            req.xid = key;
            let payload: usize = req
                .steps
                .iter()
                .map(|s| s.action_payload.len() + s.compensate_payload.len())
                .sum();
            self.charge(&caller, true, payload).await?;
            let wait = match req.wait_timeout_ms {
                0 => None,
                ms => Some(
                    limits::timeout("wait_timeout_ms", ms, limits::MAX_WAIT, limits::MAX_WAIT)
                        .map_err(Error::from)?,
                ),
            };
            let row = self.engine.submit_saga(req).await?;
            let transaction = match wait {
                Some(wait) => Some(wire_transaction(self.engine.wait(&row.xid, wait).await?)),
                None => None,
            };
            Ok(Response::new(wire::SubmitSagaResponse {
                status: transaction
                    .as_ref()
                    .map_or(wire_status(row.status) as i32, |t| t.status),
                xid,
                deadline_unix_ms: row.deadline_ms,
                transaction,
            }))
        })
    }

    async fn prepare_message(
        &self,
        request: Request<wire::PrepareMessageRequest>,
    ) -> Result<Response<wire::PrepareMessageResponse>, Status> {
        let caller = self.caller(&request, "PrepareMessage")?;
        let mut req = with_caller_trace(request, |r| &mut r.headers);
        traced!("prepare_message", req.xid, {
            let (xid, key) = caller.scope_or_new(std::mem::take(&mut req.xid))?;
            req.xid = key.clone();
            let payload: usize = req.branches.iter().map(|b| b.payload.len()).sum();
            self.charge(&caller, true, payload).await?;
            let row = self.engine.prepare_message(req).await?;
            Ok(Response::new(wire::PrepareMessageResponse {
                xid,
                status: wire_status(row.status) as i32,
                branch_xid: key,
                check_back_unix_ms: row.deadline_ms,
            }))
        })
    }

    async fn submit_message(
        &self,
        request: Request<wire::DecideRequest>,
    ) -> Result<Response<wire::DecideResponse>, Status> {
        let caller = self.caller(&request, "SubmitMessage")?;
        self.decide_message(caller, request.into_inner(), Decision::Commit)
            .await
    }

    async fn abort_message(
        &self,
        request: Request<wire::DecideRequest>,
    ) -> Result<Response<wire::DecideResponse>, Status> {
        let caller = self.caller(&request, "AbortMessage")?;
        self.decide_message(caller, request.into_inner(), Decision::Rollback)
            .await
    }

    async fn get(
        &self,
        request: Request<wire::GetRequest>,
    ) -> Result<Response<wire::Transaction>, Status> {
        let caller = self.caller(&request, "Get")?;
        let req = request.into_inner();
        traced!("get", req.xid, {
            Ok(Response::new(wire_transaction(
                self.engine.get(&caller.scope(&req.xid)?).await?,
            )))
        })
    }

    async fn wait(
        &self,
        request: Request<wire::WaitRequest>,
    ) -> Result<Response<wire::Transaction>, Status> {
        let caller = self.caller(&request, "Wait")?;
        let req = request.into_inner();
        traced!("wait", req.xid, {
            let key = caller.scope(&req.xid)?;
            let timeout = limits::timeout(
                "timeout_ms",
                req.timeout_ms,
                Duration::from_secs(30),
                limits::MAX_WAIT,
            )
            .map_err(Error::from)?;
            Ok(Response::new(wire_transaction(
                self.engine.wait(&key, timeout).await?,
            )))
        })
    }

    async fn resume(
        &self,
        request: Request<wire::ResumeRequest>,
    ) -> Result<Response<wire::Transaction>, Status> {
        let caller = self.caller(&request, "Resume")?;
        let by = Operator {
            name: caller.subject.clone(),
            reason: "Coordinator.Resume".into(),
        };
        let req = request.into_inner();
        traced!("resume", req.xid, {
            Ok(Response::new(wire_transaction(
                self.engine.resume(&caller.scope(&req.xid)?, &by).await?,
            )))
        })
    }
}

/// The request, with the caller's trace context (its `traceparent` metadata) stored as the
/// `traceparent` header of what it defines when that has none: every later call of the
/// transaction, after a restart too, then joins the caller's trace.
fn with_caller_trace<T>(
    request: Request<T>,
    headers: impl FnOnce(&mut T) -> &mut std::collections::BTreeMap<String, String>,
) -> T {
    use dtx_proto::trace::{TRACEPARENT, TraceParent};
    let trace = TraceParent::of_metadata(request.metadata());
    let mut req = request.into_inner();
    if let Some(trace) = trace {
        let headers = headers(&mut req);
        if !headers.contains_key(TRACEPARENT) && headers.len() < limits::MAX_HEADERS {
            headers.insert(TRACEPARENT.to_string(), trace.to_string());
        }
    }
    req
}
