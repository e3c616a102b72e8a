//! The participant gRPC server helper.
//!
//! A service registers named handlers - a TCC trio (try/confirm/cancel) or a saga pair
//! (action/compensate) - and gets a tonic service implementing `dtx.v1.Participant`. For every
//! call it opens a local transaction on the service's pool, runs the handler through the
//! [`barrier`], commits, and maps the answer to the wire:
//!
//! | what happened                               | wire answer                       |
//! |---------------------------------------------|-----------------------------------|
//! | handler replied success / failure           | SUCCESS / FAILURE (EXECUTED)      |
//! | repeat                                      | stored first answer (DUPLICATE)   |
//! | cancel/compensate first                     | SUCCESS (EMPTY_ROLLBACK)          |
//! | try/action after its cancel/compensate      | FAILURE (SUSPENDED)               |
//! | cancel after confirm, confirm after cancel  | FAILURE (CONFLICT), reason        |
//! | try/action repeated with another request    | FAILURE (CONFLICT), reason        |
//! | handler error, database error, lock timeout | RETRY (rolled back; safe to retry)|
//! | unknown action kind / limits exceeded       | gRPC INVALID_ARGUMENT             |
//! | request does not decode, or is over the size limit | gRPC INVALID_ARGUMENT      |
//! | unknown handler                             | gRPC NOT_FOUND                    |
//! | action kind the handler does not have       | gRPC FAILED_PRECONDITION          |
//!
//! ```no_run
//! use dtx_sdk::barrier::Reply;
//! use dtx_sdk::server::ParticipantServer;
//! use dtx_sdk::sql::sqlx;
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let service = ParticipantServer::new(pool)
//!     .tcc(
//!         "reserve",
//!         |conn, req| Box::pin(async move {
//!             sqlx::query("UPDATE stock SET held = held + 1 WHERE sku = $1")
//!                 .bind(String::from_utf8_lossy(&req.payload).to_string())
//!                 .execute(&mut *conn)
//!                 .await?;
//!             Ok(Reply::ok())
//!         }),
//!         |_conn, _req| Box::pin(async move { Ok(Reply::ok()) }),
//!         |_conn, _req| Box::pin(async move { Ok(Reply::ok()) }),
//!     )
//!     .into_service();
//! tonic::transport::Server::builder()
//!     .add_service(service)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use dtx_proto::auth::CallVerifier;
use dtx_proto::backoff::Backoff;
use dtx_proto::codec::SizeGuard;
use dtx_proto::limits::{self, LimitError};
use dtx_proto::trace::{TRACEPARENT, TraceParent};
use dtx_proto::v1::participant_server::{Participant, ParticipantServer as WireServer};
use dtx_proto::v1::{
    BranchBatchAnswer, BranchBatchRequest, BranchBatchResponse, BranchRequest, BranchResponse,
    Outcome, OutcomeDetail,
};
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use futures::future::BoxFuture;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::barrier::{self, Action, Answer, BranchKey, Detail, HandlerError, Reply};
use crate::idempotency::RequestHash;
use crate::{Error, metrics};

/// One branch call as a handler sees it.
#[derive(Debug, Clone)]
pub struct BranchCall {
    /// The transaction (tenant-scoped, as the barrier keys it).
    pub xid: String,
    /// The branch or saga step.
    pub branch_id: String,
    /// The handler name the call addressed (one function may serve several names).
    pub handler: String,
    /// Which call this is.
    pub action: Action,
    /// The branch's payload.
    pub payload: Vec<u8>,
    /// The branch's headers (trace context among them).
    pub headers: BTreeMap<String, String>,
}

impl BranchCall {
    /// The trace context of this call (W3C `traceparent`): its trace id is the transaction's.
    pub fn trace(&self) -> Option<TraceParent> {
        TraceParent::of_headers(&self.headers)
    }
}

/// A business handler: runs inside the local transaction on `conn` and replies
/// [`Reply::Success`] / [`Reply::Failure`], or returns an error to roll back and be retried.
/// Any `|conn, call| Box::pin(async move { ... })` closure of that shape is one.
pub trait HandlerFn<C>:
    for<'c> Fn(&'c mut C, BranchCall) -> BoxFuture<'c, Result<Reply, HandlerError>>
    + Send
    + Sync
    + 'static
{
}

impl<C, F> HandlerFn<C> for F where
    F: for<'c> Fn(&'c mut C, BranchCall) -> BoxFuture<'c, Result<Reply, HandlerError>>
        + Send
        + Sync
        + 'static
{
}

type Handler<C> = Arc<dyn HandlerFn<C>>;

enum Handlers<C> {
    Tcc {
        try_: Handler<C>,
        confirm: Handler<C>,
        cancel: Handler<C>,
    },
    Saga {
        action: Handler<C>,
        compensate: Handler<C>,
    },
    /// Answers the check-backs of two-phase messages from the barrier (no business code).
    CheckBack,
}

/// What runs inside a call's local transaction.
enum Work<C> {
    /// The barrier around a business handler.
    Handler(Handler<C>),
    /// A two-phase message's check-back ([`barrier::check_back`]).
    CheckBack,
}

impl<C> Handlers<C> {
    fn for_action(&self, action: Action) -> Option<Work<C>> {
        let handler = match (self, action) {
            (Handlers::Tcc { try_, .. }, Action::Try) => try_,
            (Handlers::Tcc { confirm, .. }, Action::Confirm) => confirm,
            (Handlers::Tcc { cancel, .. }, Action::Cancel) => cancel,
            (Handlers::Saga { action, .. }, Action::Action) => action,
            (Handlers::Saga { compensate, .. }, Action::Compensate) => compensate,
            (Handlers::CheckBack, Action::CheckBack) => return Some(Work::CheckBack),
            _ => return None,
        };
        Some(Work::Handler(handler.clone()))
    }
}

/// Builds a `dtx.v1.Participant` service from named handlers over one database pool.
pub struct ParticipantServer<DB: Backend> {
    pool: Pool<DB>,
    handlers: HashMap<String, Handlers<DB::Conn>>,
    conflict_retries: u32,
    /// Names a caller's TLS certificate must carry; `None`: any caller.
    callers: Option<Vec<String>>,
    /// The coordinator's keys every call's `x-dtx-call-token` must verify with; `None`: calls
    /// are not checked.
    calls: Option<CallVerifier>,
}

impl<DB: Backend> ParticipantServer<DB> {
    /// A server whose handlers run on `pool` (which must hold the `dtx_barrier` table, see
    /// [`crate::migrate_barrier`]).
    pub fn new(pool: Pool<DB>) -> Self {
        ParticipantServer {
            pool,
            handlers: HashMap::new(),
            conflict_retries: 5,
            callers: None,
            calls: None,
        }
    }

    /// Obeys only the coordinator: every call must carry its signed token
    /// (`x-dtx-call-token`), bound to this call's xid, branch, action and handler and to one of
    /// the verifier's targets, checked before the barrier runs; anything else is
    /// UNAUTHENTICATED and nothing is written. Build the verifier from the coordinator's public
    /// key ([`CallVerifier::from_pem`]). Initiators' Trys carry the token the coordinator
    /// issued at registration (the SDK's client forwards it).
    pub fn verify_calls(mut self, verifier: CallVerifier) -> Self {
        self.calls = Some(verifier);
        self
    }

    /// Accepts calls only from callers whose TLS client certificate names one of `names` (a
    /// DNS name among its subject alternative names), e.g. the coordinator's; any other caller
    /// gets PERMISSION_DENIED and nothing runs. Serve over TLS with a client CA (tonic's
    /// `ServerTlsConfig::client_ca_root`) so that callers present a verified certificate.
    pub fn accept_callers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.callers = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Checks the caller (see [`ParticipantServer::accept_callers`] and
    /// [`ParticipantServer::verify_calls`]) and returns the request with its call's trace
    /// context ([`with_call_trace`]): what a service wrapping this server calls first.
    pub fn admit(&self, request: Request<BranchRequest>) -> Result<BranchRequest, Status> {
        if let Some(names) = &self.callers {
            check_caller(request.peer_certs().as_deref(), names)?;
        }
        if let Some(verifier) = &self.calls
            && let Err(refused) = verifier.verify_request(request.metadata(), request.get_ref())
        {
            tracing::warn!(
                xid = %request.get_ref().xid,
                branch = %request.get_ref().branch_id,
                error = %refused,
                "branch call refused"
            );
            metrics::refused();
            return Err(Status::unauthenticated(refused.0));
        }
        Ok(with_call_trace(request))
    }

    /// Registers a TCC resource: `name`'s try, confirm and cancel handlers.
    pub fn tcc<T, F, X>(mut self, name: impl Into<String>, try_: T, confirm: F, cancel: X) -> Self
    where
        T: HandlerFn<DB::Conn>,
        F: HandlerFn<DB::Conn>,
        X: HandlerFn<DB::Conn>,
    {
        let handlers = Handlers::Tcc {
            try_: Arc::new(try_),
            confirm: Arc::new(confirm),
            cancel: Arc::new(cancel),
        };
        self.handlers.insert(name.into(), handlers);
        self
    }

    /// Registers a saga step: `name`'s action and compensation handlers.
    pub fn saga<A, X>(mut self, name: impl Into<String>, action: A, compensate: X) -> Self
    where
        A: HandlerFn<DB::Conn>,
        X: HandlerFn<DB::Conn>,
    {
        let handlers = Handlers::Saga {
            action: Arc::new(action),
            compensate: Arc::new(compensate),
        };
        self.handlers.insert(name.into(), handlers);
        self
    }

    /// Answers the coordinator's check-backs of two-phase messages sent to handler `name` (the
    /// check-back target of the messages this service initiates), from the barrier table of
    /// this server's pool: see [`barrier::check_back`].
    pub fn message_check_back(mut self, name: impl Into<String>) -> Self {
        self.handlers.insert(name.into(), Handlers::CheckBack);
        self
    }

    /// How many times a local transaction that lost a lock conflict (deadlock, SQLite busy) is
    /// run again before the call answers RETRY. Default 5.
    pub fn conflict_retries(mut self, retries: u32) -> Self {
        self.conflict_retries = retries;
        self
    }

    /// The tonic service, ready for `Server::builder().add_service(..)`. It decodes requests up
    /// to the contract's [`limits::MAX_REQUEST_BYTES`], so one over a field limit gets that
    /// limit's message, and answers larger ones with INVALID_ARGUMENT naming the limits.
    pub fn into_service(self) -> SizeGuard<WireServer<Self>> {
        SizeGuard::new(WireServer::new(self).max_decoding_message_size(limits::MAX_REQUEST_BYTES))
    }

    /// Handles one call without gRPC (what the service does after decoding).
    pub async fn handle(&self, request: BranchRequest) -> Result<BranchResponse, Status> {
        let (work, call) = self.prepare(request)?;
        let trace_id = call.trace().map(|t| t.trace_hex()).unwrap_or_default();
        let action = call.action;
        let span = tracing::info_span!("branch", xid = %call.xid, branch = %call.branch_id, %action, %trace_id);
        let work = run_with_retries(self.pool.clone(), work, call, self.conflict_retries);
        // Instrumented, not entered: a guard held across `.await` would leak the span into
        // whatever else runs on this thread while the call is suspended. Detached: a caller
        // that goes away must not cut the local transaction midway (see `dtx_sql::detached`);
        // the call finishes and its answer waits in the barrier for the caller's retry.
        Ok(dtx_sql::detached(work.instrument(span)).await)
    }

    /// Checks a batch's caller once and each item's call token (as [`ParticipantServer::admit`]
    /// does for one call): each item's request, or the status a single call would have got.
    pub fn admit_batch(
        &self,
        request: Request<BranchBatchRequest>,
    ) -> Result<Vec<Result<BranchRequest, Status>>, Status> {
        if let Some(names) = &self.callers {
            check_caller(request.peer_certs().as_deref(), names)?;
        }
        let items = request.into_inner().items;
        if items.len() > limits::MAX_BATCH_ITEMS {
            return Err(Status::invalid_argument(format!(
                "items: {} is more than the limit of {} per batch",
                items.len(),
                limits::MAX_BATCH_ITEMS
            )));
        }
        Ok(items
            .into_iter()
            .map(|item| {
                let request = item.request.unwrap_or_default();
                if let Some(verifier) = &self.calls {
                    let refused = if item.call_token.is_empty() {
                        Err(dtx_proto::auth::CallTokenError(
                            "branch call refused: no call token in the batch item (this \
                             participant obeys only the coordinator, which signs every call)"
                                .into(),
                        ))
                    } else {
                        verifier.verify(&item.call_token, dtx_proto::auth::Call::of(&request))
                    };
                    if let Err(refused) = refused {
                        tracing::warn!(xid = %request.xid, branch = %request.branch_id, error = %refused, "branch call refused");
                        metrics::refused();
                        return Err(Status::unauthenticated(refused.0));
                    }
                }
                Ok(request)
            })
            .collect())
    }

    /// Handles a batch without gRPC: every item gets the answer [`ParticipantServer::handle`]
    /// would give it alone. The items run in one local transaction, each behind its own barrier
    /// row (a refusal rolls back to the barrier's savepoint, as alone), committed once. If any
    /// item errs (its handler, the database, a lock conflict) or the commit fails, the whole
    /// transaction rolls back and every item runs alone instead, with its own retries: an
    /// error may have ended the shared transaction, and an answer must never claim an effect
    /// that was not committed. Check-backs, which wait for other transactions, always run
    /// alone.
    pub async fn handle_batch(
        &self,
        items: Vec<Result<BranchRequest, Status>>,
    ) -> BranchBatchResponse {
        let mut answers: Vec<Option<Result<BranchResponse, Status>>> = Vec::new();
        let (mut together, mut alone) = (Vec::new(), Vec::new());
        for (i, item) in items.into_iter().enumerate() {
            answers.push(None);
            match item.and_then(|request| self.prepare(request)) {
                Err(status) => answers[i] = Some(Err(status)),
                Ok((Work::CheckBack, call)) => alone.push((i, Work::CheckBack, call)),
                Ok((work, call)) => together.push((i, work, call)),
            }
        }
        if together.len() == 1 {
            alone.append(&mut together);
        }
        let (pool, retries) = (self.pool.clone(), self.conflict_retries);
        let span = tracing::info_span!("branch batch", items = answers.len());
        let work = async move {
            let mut answered = Vec::new();
            if !together.is_empty() {
                let calls: Vec<(&Work<DB::Conn>, &BranchCall)> = together
                    .iter()
                    .map(|(_, work, call)| (work, call))
                    .collect();
                match run_batch_once(&pool, &calls).await {
                    Ok(batch) => {
                        for ((i, _, call), answer) in together.iter().zip(batch) {
                            metrics::call(&call.handler, call.action, Some(answer.detail));
                            answered.push((*i, to_wire(answer)));
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "batch rolled back; running its items alone");
                        alone.append(&mut together);
                    }
                }
            }
            let singles = alone.into_iter().map(|(i, work, call)| {
                let pool = pool.clone();
                async move { (i, run_with_retries(pool, work, call, retries).await) }
            });
            answered.extend(futures::future::join_all(singles).await);
            answered
        };
        for (i, answer) in dtx_sql::detached(work.instrument(span)).await {
            answers[i] = Some(Ok(answer));
        }
        BranchBatchResponse {
            answers: answers
                .into_iter()
                .map(|answer| match answer.expect("every item answered") {
                    Ok(response) => BranchBatchAnswer {
                        code: 0,
                        message: String::new(),
                        response: Some(response),
                    },
                    Err(status) => BranchBatchAnswer {
                        code: status.code() as i32,
                        message: status.message().to_string(),
                        response: None,
                    },
                })
                .collect(),
        }
    }

    /// A request as its handler will see it, or the status its call is answered with.
    fn prepare(&self, request: BranchRequest) -> Result<(Work<DB::Conn>, BranchCall), Status> {
        let action = Action::from_wire(request.action).ok_or_else(|| {
            Status::invalid_argument(format!(
                "action {} is not one of TRY, CONFIRM, CANCEL, ACTION, COMPENSATE, CHECK_BACK",
                request.action
            ))
        })?;
        validate(&request).map_err(|e| Status::invalid_argument(e.0))?;
        let handlers = self
            .handlers
            .get(&request.handler)
            .ok_or_else(|| Status::not_found(format!("no handler named {:?}", request.handler)))?;
        let work = handlers.for_action(action).ok_or_else(|| {
            Status::failed_precondition(format!(
                "handler {:?} has no {action} (TCC handlers take try/confirm/cancel, saga \
                 handlers action/compensate, message check-backs check_back)",
                request.handler
            ))
        })?;
        let call = BranchCall {
            xid: request.xid,
            branch_id: request.branch_id,
            handler: request.handler,
            action,
            payload: request.payload,
            headers: request.headers,
        };
        Ok((work, call))
    }
}

/// Waits before running a local transaction that lost a lock conflict again: 5 ms doubling up
/// to 80 ms.
const CONFLICT_RETRY: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(80));

/// Runs one call's local transaction, again while it loses lock conflicts.
async fn run_with_retries<DB: Backend>(
    pool: Pool<DB>,
    work: Work<DB::Conn>,
    call: BranchCall,
    conflict_retries: u32,
) -> BranchResponse {
    let (work, call) = (&work, &call);
    let ran = dtx_sql::rerun_lock_conflicts(
        conflict_retries,
        |n| CONFLICT_RETRY.delay(n, 0.0),
        |attempt, e: &Error| {
            metrics::lock_conflict(&call.handler);
            tracing::debug!(attempt, error = %e, "lock conflict, running the branch again");
        },
        || run_once(&pool, work, call),
    )
    .await;
    match ran {
        Ok(answer) => {
            metrics::call(&call.handler, call.action, Some(answer.detail));
            to_wire(answer)
        }
        Err(e) => {
            let kind = failure_kind(&e);
            if matches!(e, Error::Barrier(_)) {
                tracing::error!(error = %e, kind, "branch rolled back; answering RETRY");
            } else {
                tracing::warn!(error = %e, kind, "branch rolled back; answering RETRY");
            }
            metrics::call(&call.handler, call.action, None);
            BranchResponse {
                outcome: Outcome::Retry as i32,
                result: Vec::new(),
                message: e.to_string(),
                detail: OutcomeDetail::Unspecified as i32,
            }
        }
    }
}

async fn run_once<DB: Backend>(
    pool: &Pool<DB>,
    work: &Work<DB::Conn>,
    call: &BranchCall,
) -> Result<Answer, Error> {
    let mut answers = run_batch_once(pool, &[(work, call)]).await?;
    Ok(answers.pop().expect("one answer per call"))
}

/// Runs calls one after the other in one local transaction and commits it; on any error it
/// rolls back and nothing of any call stays.
async fn run_batch_once<DB: Backend>(
    pool: &Pool<DB>,
    calls: &[(&Work<DB::Conn>, &BranchCall)],
) -> Result<Vec<Answer>, Error> {
    let mut tx = DB::begin(pool).await?;
    let mut answers = Vec::with_capacity(calls.len());
    for (work, call) in calls {
        match run_in(DB::conn(&mut tx), work, call).await {
            Ok(answer) => answers.push(answer),
            Err(e) => {
                // Rolling back explicitly returns the connection clean; a failure here only
                // means the connection is gone, which drops the transaction anyway.
                let _ = tx.rollback().await;
                return Err(e);
            }
        }
    }
    tx.commit().await?;
    Ok(answers)
}

/// One call's barrier and handler on a connection inside a transaction.
async fn run_in<C: dtx_sql::Conn>(
    conn: &mut C,
    work: &Work<C>,
    call: &BranchCall,
) -> Result<Answer, Error> {
    // The handler name is part of the request: the same ids sent to another handler are a
    // different call. Headers are not (trace ids differ per attempt).
    let request = RequestHash::of_parts(&[call.handler.as_bytes(), &call.payload]);
    let key = BranchKey::new(&call.xid, &call.branch_id, call.action)?.with_request(request);
    match work {
        Work::Handler(handler) => {
            let (handler, owned) = (handler.clone(), call.clone());
            barrier::call(conn, key, move |conn| handler(conn, owned)).await
        }
        Work::CheckBack => barrier::check_back(conn, &call.xid).await,
    }
}

/// What failed, for the log: the handler's own error stays a handler error, the database's a
/// database error; only a barrier table the protocol cannot produce is an inconsistency.
fn failure_kind(e: &Error) -> &'static str {
    match e {
        Error::Handler(_) => "handler",
        Error::Database(_) => "database",
        Error::Limit(_) => "limit",
        Error::Barrier(_) => "barrier inconsistency",
        _ => "other",
    }
}

fn validate(request: &BranchRequest) -> Result<(), LimitError> {
    limits::check_scoped_xid(&request.xid)?;
    limits::check_branch_id("branch_id", &request.branch_id)?;
    limits::check_handler("handler", &request.handler)?;
    limits::check_payload("payload", &request.payload)?;
    limits::check_headers("headers", &request.headers)
}

fn to_wire(answer: Answer) -> BranchResponse {
    let detail = match answer.detail {
        Detail::Executed => OutcomeDetail::Executed,
        Detail::Duplicate => OutcomeDetail::Duplicate,
        Detail::EmptyRollback => OutcomeDetail::EmptyRollback,
        Detail::Suspended => OutcomeDetail::Suspended,
        Detail::NothingToUndo => OutcomeDetail::NothingToUndo,
        Detail::OutOfOrder => OutcomeDetail::OutOfOrder,
        Detail::Conflict => OutcomeDetail::Conflict,
    };
    let (outcome, result) = match answer.reply {
        Reply::Success(result) => (Outcome::Success, result),
        Reply::Failure(result) => (Outcome::Failure, result),
    };
    let message = if outcome == Outcome::Failure {
        String::from_utf8_lossy(&result).into_owned()
    } else {
        String::new()
    };
    BranchResponse {
        outcome: outcome as i32,
        result,
        message,
        detail: detail as i32,
    }
}

#[tonic::async_trait]
impl<DB: Backend> Participant for ParticipantServer<DB> {
    async fn branch(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        self.handle(self.admit(request)?).await.map(Response::new)
    }

    async fn branch_batch(
        &self,
        request: Request<BranchBatchRequest>,
    ) -> Result<Response<BranchBatchResponse>, Status> {
        let items = self.admit_batch(request)?;
        Ok(Response::new(self.handle_batch(items).await))
    }
}

/// Whether the caller's verified certificate names one of `names`.
fn check_caller(
    certs: Option<&Vec<tonic::transport::CertificateDer<'static>>>,
    names: &[String],
) -> Result<(), Status> {
    let Some(leaf) = certs.and_then(|certs| certs.first()) else {
        return Err(Status::permission_denied(
            "this participant accepts only callers with a TLS client certificate",
        ));
    };
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(|e| {
        Status::permission_denied(format!("the caller's certificate cannot be read: {e}"))
    })?;
    let named = names.iter().any(|name| {
        rustls_pki_types::ServerName::try_from(name.as_str())
            .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
    });
    if named {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "the caller's certificate names none of the accepted callers {names:?}"
        )))
    }
}

/// The request with its call's trace context (the `traceparent` of its gRPC metadata: the
/// span of this attempt) as its `traceparent` header, so a handler sees the trace it runs in.
/// A request without one keeps the transaction's stored context, if any.
pub fn with_call_trace(request: Request<BranchRequest>) -> BranchRequest {
    let trace = TraceParent::of_metadata(request.metadata());
    let mut request = request.into_inner();
    if let Some(trace) = trace
        && (request.headers.len() < limits::MAX_HEADERS
            || request.headers.contains_key(TRACEPARENT))
    {
        request
            .headers
            .insert(TRACEPARENT.to_string(), trace.to_string());
    }
    request
}
