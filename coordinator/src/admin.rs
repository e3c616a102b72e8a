//! The `dtx.v1.Admin` service: listing, describing and acting on transactions for operators
//! (the `dtx` CLI, the web console, scripts). Conversion only; the rules are in
//! [`crate::engine`].

use dtx_proto::codec::SizeGuard;
use dtx_proto::limits::{self, LimitError};
use dtx_proto::reason::Reason;
use dtx_proto::v1 as wire;
use dtx_proto::v1::admin_server::{Admin, AdminServer};
use tonic::{Request, Response, Status};

use crate::auth::{Auth, Caller};
use crate::domain::history::{Entry, Event};
use crate::domain::{GlobalRow, Kind, TxRecord, TxStatus};
use crate::engine::{Acted, Engine, Operator};
use crate::error::Error;
use crate::grpc::{wire_kind, wire_status, wire_transaction};
use crate::store::ListQuery;

pub use crate::auth::{ANONYMOUS, OPERATOR_HEADER};

/// The gRPC face of the engine's operator actions and reads.
pub struct AdminService {
    engine: Engine,
    auth: Auth,
}

impl AdminService {
    /// The service itself, for the HTTP/JSON front end (which calls its methods directly).
    pub fn plain(engine: Engine, auth: Auth) -> Self {
        AdminService { engine, auth }
    }

    pub fn new(engine: Engine, auth: Auth) -> SizeGuard<AdminServer<Self>> {
        SizeGuard::new(
            AdminServer::new(AdminService { engine, auth })
                .max_decoding_message_size(limits::MAX_REQUEST_BYTES),
        )
    }

    /// The caller of `Admin/<method>`, checked before anything else happens.
    fn caller<T>(&self, request: &Request<T>, method: &str) -> Result<Caller, Status> {
        self.auth
            .caller(request.metadata(), &format!("dtx.v1.Admin/{method}"))
    }

    async fn act(
        &self,
        request: Request<wire::AdminActionRequest>,
        action: Action,
    ) -> Result<Response<wire::TransactionDetail>, Status> {
        let caller = self.caller(&request, action.method())?;
        let req = request.into_inner();
        Ok(Response::new(
            act(&self.engine, &caller, action, &req.xid, req.reason).await?,
        ))
    }
}

/// An operator action of the Admin service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Resume,
    ForceRollback,
    RetryNow,
}

impl Action {
    /// The Admin RPC of the action.
    pub fn method(self) -> &'static str {
        match self {
            Action::Resume => "Resume",
            Action::ForceRollback => "ForceRollback",
            Action::RetryNow => "RetryNow",
        }
    }
}

/// Checks the input, applies `action` for `caller` (an operator; the action is recorded under
/// its subject) to its tenant's `xid`, and answers the transaction after it (the one path
/// behind the gRPC actions and the web console's).
pub async fn act(
    engine: &Engine,
    caller: &Caller,
    action: Action,
    xid: &str,
    reason: String,
) -> Result<wire::TransactionDetail, Status> {
    let key = caller.scope(xid)?;
    limits::check_reason("reason", &reason).map_err(Error::from)?;
    let by = Operator {
        name: caller.subject.clone(),
        reason,
    };
    let _: Acted = match action {
        Action::Resume => engine.admin_resume(&key, &by).await?,
        Action::ForceRollback => engine.force_rollback(&key, &by).await?,
        Action::RetryNow => engine.retry_now(&key, &by).await?,
    };
    detail(engine, caller, xid).await
}

/// The caller's transaction `xid`, its branches and its history.
pub async fn detail(
    engine: &Engine,
    caller: &Caller,
    xid: &str,
) -> Result<wire::TransactionDetail, Status> {
    let described = engine.describe(&caller.scope(xid)?).await?;
    Ok(wire_detail(described.record, described.history))
}

/// One page of the listing `req` asks for, of the caller's tenant.
pub async fn list(
    engine: &Engine,
    caller: &Caller,
    req: wire::ListTransactionsRequest,
) -> Result<wire::ListTransactionsResponse, Status> {
    let mut query = list_query(req, engine.now_ms())?;
    query.tenant = Some(caller.tenant.clone());
    let limit = query.limit as usize;
    // One more than the page tells whether another page follows.
    query.limit += 1;
    let mut rows = engine.list(&query).await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_page_token = match rows.last() {
        Some(last) if more => page_token(last),
        _ => String::new(),
    };
    let transactions = rows
        .into_iter()
        .map(|global| {
            wire_transaction(TxRecord {
                global,
                branches: Vec::new(),
            })
        })
        .collect();
    Ok(wire::ListTransactionsResponse {
        transactions,
        next_page_token,
    })
}

/// Counts by kind and status, the parked count and the oldest open transaction's age.
pub async fn stats(engine: &Engine) -> Result<wire::StatsResponse, Status> {
    let tally = engine.tally().await?;
    let now = engine.now_ms();
    let needs_attention = tally
        .counts
        .iter()
        .filter(|(_, s, _)| *s == TxStatus::NeedsAttention)
        .map(|(_, _, n)| n)
        .sum();
    Ok(wire::StatsResponse {
        counts: tally
            .counts
            .into_iter()
            .map(|(kind, status, count)| wire::stats_response::Count {
                kind: wire_kind(kind) as i32,
                status: wire_status(status) as i32,
                count,
            })
            .collect(),
        needs_attention,
        oldest_open_age_ms: tally
            .oldest_open_created_ms
            .map_or(0, |created| (now - created).max(0) as u64),
    })
}

fn domain_status(status: i32) -> Result<TxStatus, Status> {
    let wire = wire::TxStatus::try_from(status).ok();
    TxStatus::ALL
        .iter()
        .copied()
        .find(|s| Some(wire_status(*s)) == wire)
        .ok_or_else(|| {
            Reason::InvalidRequest.status(format!("statuses: {status} is not a TxStatus"))
        })
}

/// A page token: the last row's update time and xid (`~` is outside the xid charset).
fn page_token(row: &GlobalRow) -> String {
    format!("{}~{}", row.updated_ms, row.xid)
}

fn parse_page_token(token: &str) -> Result<Option<(i64, String)>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || Reason::InvalidRequest.status("page_token is not one this service issued");
    let (created, xid) = token.split_once('~').ok_or_else(bad)?;
    limits::check_scoped_xid(xid).map_err(|_| bad())?;
    Ok(Some((created.parse().map_err(|_| bad())?, xid.to_string())))
}

/// `0` is "unbounded" on the wire.
fn bound(ms: i64) -> Option<i64> {
    (ms != 0).then_some(ms)
}

fn list_query(req: wire::ListTransactionsRequest, now_ms: i64) -> Result<ListQuery, Status> {
    let mut statuses = req
        .statuses
        .iter()
        .map(|s| domain_status(*s))
        .collect::<Result<Vec<_>, _>>()?;
    if req.needs_attention {
        statuses.push(TxStatus::NeedsAttention);
    }
    let kind = match wire::TxKind::try_from(req.kind) {
        Ok(wire::TxKind::Unspecified) => None,
        Ok(wire::TxKind::Tcc) => Some(Kind::Tcc),
        Ok(wire::TxKind::Saga) => Some(Kind::Saga),
        Ok(wire::TxKind::Message) => Some(Kind::Message),
        Err(_) => return Err(Reason::InvalidRequest.status("kind is not a TxKind")),
    };
    let xid_prefix = match req.xid_prefix.as_str() {
        "" => None,
        prefix => {
            limits::check_xid(prefix)
                .map_err(|e| Error::from(LimitError(e.0.replacen("xid", "xid_prefix", 1))))?;
            Some(prefix.to_string())
        }
    };
    if req.limit > limits::MAX_LIST_LIMIT {
        return Err(Reason::InvalidRequest.status(format!(
            "limit is {}, above the maximum page of {}",
            req.limit,
            limits::MAX_LIST_LIMIT
        )));
    }
    let limit = match req.limit {
        0 => limits::DEFAULT_LIST_LIMIT,
        n => n,
    };
    let mut updated_to = bound(req.updated_to_unix_ms);
    if req.older_than_ms > 0 {
        let older = now_ms.saturating_sub(req.older_than_ms.min(i64::MAX as u64) as i64);
        updated_to = Some(updated_to.map_or(older, |to| to.min(older)));
    }
    Ok(ListQuery {
        statuses,
        kind,
        xid_prefix,
        created: (
            bound(req.created_from_unix_ms),
            bound(req.created_to_unix_ms),
        ),
        updated: (bound(req.updated_from_unix_ms), updated_to),
        tenant: None,
        after: parse_page_token(&req.page_token)?,
        limit: i64::from(limit),
    })
}

fn wire_history_kind(event: Event) -> wire::HistoryKind {
    match event {
        Event::Created => wire::HistoryKind::Created,
        Event::Registered => wire::HistoryKind::Registered,
        Event::Decided => wire::HistoryKind::Decided,
        Event::Status => wire::HistoryKind::Status,
        Event::Branch => wire::HistoryKind::Branch,
        Event::AttemptFailed => wire::HistoryKind::AttemptFailed,
        Event::AttemptUnknown => wire::HistoryKind::AttemptUnknown,
        Event::Takeover => wire::HistoryKind::Takeover,
        Event::Operator => wire::HistoryKind::Operator,
    }
}

fn wire_detail(record: TxRecord, history: Vec<Entry>) -> wire::TransactionDetail {
    let owner = record.global.owner.clone().unwrap_or_default();
    let due = record.global.due_ms.unwrap_or_default();
    wire::TransactionDetail {
        transaction: Some(wire_transaction(record)),
        owner,
        due_unix_ms: due,
        history: history
            .into_iter()
            .map(|e| wire::HistoryEvent {
                at_unix_ms: e.at_ms,
                kind: wire_history_kind(e.event) as i32,
                branch_id: e.branch_id.unwrap_or_default(),
                status: e.status.unwrap_or_default().to_string(),
                attempt: e.attempt.clamp(0, i64::from(u32::MAX)) as u32,
                detail: e.detail.unwrap_or_default(),
                actor: e.actor.unwrap_or_default(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_transactions(
        &self,
        request: Request<wire::ListTransactionsRequest>,
    ) -> Result<Response<wire::ListTransactionsResponse>, Status> {
        let caller = self.caller(&request, "ListTransactions")?;
        Ok(Response::new(
            list(&self.engine, &caller, request.into_inner()).await?,
        ))
    }

    async fn describe_transaction(
        &self,
        request: Request<wire::DescribeTransactionRequest>,
    ) -> Result<Response<wire::TransactionDetail>, Status> {
        let caller = self.caller(&request, "DescribeTransaction")?;
        let xid = request.into_inner().xid;
        Ok(Response::new(detail(&self.engine, &caller, &xid).await?))
    }

    async fn resume(
        &self,
        request: Request<wire::AdminActionRequest>,
    ) -> Result<Response<wire::TransactionDetail>, Status> {
        self.act(request, Action::Resume).await
    }

    async fn force_rollback(
        &self,
        request: Request<wire::AdminActionRequest>,
    ) -> Result<Response<wire::TransactionDetail>, Status> {
        self.act(request, Action::ForceRollback).await
    }

    async fn retry_now(
        &self,
        request: Request<wire::AdminActionRequest>,
    ) -> Result<Response<wire::TransactionDetail>, Status> {
        self.act(request, Action::RetryNow).await
    }

    async fn stats(
        &self,
        request: Request<wire::StatsRequest>,
    ) -> Result<Response<wire::StatsResponse>, Status> {
        self.caller(&request, "Stats")?;
        Ok(Response::new(stats(&self.engine).await?))
    }
}
