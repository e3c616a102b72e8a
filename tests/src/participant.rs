//! A test participant: a "bank" that keeps the [`crate::ledger`] through the barrier,
//! behind a fault-injecting gRPC wrapper.
//!
//! Handlers (payload `"<account>:<amount>"`):
//! * TCC `transfer`: Try holds the amount (balance -= a, held += a), Confirm releases the hold
//!   (held -= a), Cancel gives it back (balance += a, held -= a).
//! * TCC `deposit`: Try and Cancel only record themselves, Confirm adds the amount.
//! * saga `debit`: Action takes the amount (balance -= a), Compensate gives it back.
//! * saga `credit`: Action adds the amount, Compensate takes it back.
//!
//! A TCC `transfer` + `deposit`, or a saga `debit` + `credit`, moves money without creating or
//! destroying any: the sum of all balances is an invariant once everything settled.
//!
//! Every effect is also logged in `effects`, so tests count executions from the business tables.
//! A balance that would go negative is a business refusal (FAILURE).
//!
//! [`Faults`] scripts what the next calls of a (branch, action) experience: the handler erroring
//! (RETRY), a refusal, `UNAVAILABLE` before or *after* the effect (a lost response), a delay,
//! a duplicated delivery, or a status-only answer (gRPC `UNIMPLEMENTED`, or a plain HTTP 404
//! without `grpc-status` when served through [`Bank::into_http_service`]) before or after the
//! effect. It can also deliver phase two out of order: once a Confirm succeeded, a Cancel of
//! the same branch arrives as if from a coordinator (and the reverse), see
//! [`FaultRates::reorder`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dtx_proto::v1::participant_server::{Participant, ParticipantServer as WireServer};
use dtx_proto::v1::{
    BranchBatchAnswer, BranchBatchRequest, BranchBatchResponse, BranchRequest, BranchResponse,
};
use dtx_sdk::barrier::{Action, Reply};
use dtx_sdk::server::{BranchCall, ParticipantServer};
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use tonic::{Request, Response, Status};

use crate::ledger;
use crate::net::{MisrouteProxy, Replace404};

/// Encodes a ledger payload.
pub fn payload(account: &str, amount: i64) -> Vec<u8> {
    format!("{account}:{amount}").into_bytes()
}

fn parse(payload: &[u8]) -> Result<(String, i64), String> {
    let text = std::str::from_utf8(payload).map_err(|e| e.to_string())?;
    let (account, amount) = text
        .split_once(':')
        .ok_or("payload is not account:amount")?;
    Ok((
        account.to_string(),
        amount.parse().map_err(|e| format!("{e}"))?,
    ))
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The handler returns an error (rolled back; the participant answers RETRY).
    HandlerError,
    /// The handler refuses (FAILURE).
    Refuse,
    /// The handler refuses with this message (e.g. text that must be shown as text).
    RefuseWith(String),
    /// The call fails with UNAVAILABLE before reaching the handler.
    UnavailableBefore,
    /// The call runs (effect committed), then the response is lost: UNAVAILABLE.
    UnavailableAfter,
    /// The call is delivered this long after it arrived - even if the caller gave up
    /// meanwhile, like a request stuck in the network (it runs in a task of its own).
    Delay(Duration),
    /// The call is delivered twice, concurrently; the first answer is returned.
    Duplicate,
    /// The caller goes away this long after the call arrived (its deadline, a reset stream):
    /// the delivery's future is dropped wherever it stands, the way a server drops the handler
    /// of a reset HTTP/2 stream, and the caller sees CANCELLED.
    Abandon(Duration),
    /// A status-only answer instead of the participant's response: the call never reaches
    /// the barrier (`after: false`) or runs and its answer is replaced (`after: true`).
    Status { how: StatusAnswer, after: bool },
    /// The handler makes its change, then the participant dies mid-transaction (the handler
    /// panics): the database rolls back its open transaction - in a batch, every item's - and
    /// the caller sees UNAVAILABLE.
    Die,
}

/// A status-only answer, the kind a proxy or a replica mid-deploy gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusAnswer {
    /// gRPC `UNIMPLEMENTED`.
    Unimplemented,
    /// A plain HTTP 404 without `grpc-status` (needs [`Bank::into_http_service`]; served
    /// without it, the caller sees an empty response: unknown as well).
    Http404,
}

/// Faults still to happen, per (branch_id, action).
type Script = HashMap<(String, Action), VecDeque<Fault>>;

/// Probabilities (each 0..1) of the faults drawn for calls no script covers.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultRates {
    /// The handler errors: rolled back, answered RETRY.
    pub handler_error: f64,
    /// UNAVAILABLE before the call reaches the barrier.
    pub unavailable_before: f64,
    /// The effect commits, then the response is lost (UNAVAILABLE).
    pub lost_response: f64,
    /// Delivered twice at once.
    pub duplicate: f64,
    /// Try/Action only: delivered `late_by` later, past the caller's timeout, so the
    /// Cancel/compensation can overtake it.
    pub late_forward: f64,
    pub late_by: Duration,
    /// Try/Action only: a business refusal.
    pub refuse_forward: f64,
    /// Any call (forward or phase two): delivered `slow_by` later, in a task of its own, so
    /// it is still in flight when its coordinator is killed and lands afterwards.
    pub slow: f64,
    pub slow_by: Duration,
    /// A status-only answer (UNIMPLEMENTED or HTTP 404, half each) without running the call.
    pub status_before: f64,
    /// The call runs, then its answer is replaced by a status-only one.
    pub status_after: f64,
    /// Outage windows `(every, lasting)`: every call arriving within the first `lasting` of
    /// each `every` (counted from the start of the run) gets a status-only answer, before or
    /// after its effect (half each).
    pub status_window: Option<(Duration, Duration)>,
    /// TCC phase two out of order: once a branch's Confirm succeeded, its Cancel is delivered
    /// too (and a Confirm after a successful Cancel), directly at the participant.
    pub reorder: f64,
    /// Any call: the caller goes away at a random moment within `abandon_within` of its
    /// arrival, usually while the participant is mid-way through its local transaction.
    pub abandon: f64,
    pub abandon_within: Duration,
    /// Batch items only: [`Fault::Die`] (the whole batch's transaction is lost).
    pub die_in_batch: f64,
}

/// Scripted faults per (branch_id, action); `"*"` matches every branch. Optionally also random
/// faults, drawn from a hash of (seed, xid, branch, action, attempt) so the same seed gives the
/// same fault to the same call whatever the timing.
#[derive(Clone, Default)]
pub struct Faults {
    script: Arc<Mutex<Script>>,
    random: Option<(u64, FaultRates)>,
    /// Rates for particular transactions, instead of `random`'s.
    per_xid: Arc<Mutex<HashMap<String, FaultRates>>>,
    injected: Arc<std::sync::atomic::AtomicU64>,
    /// Every call that reached the wrapper, in arrival order.
    calls: Arc<Mutex<Vec<CallRecord>>>,
    /// Where status windows are counted from.
    origin: Option<tokio::time::Instant>,
    /// Told the xid of every call that is made slow (the chaos killer aims at its driver).
    slow_calls: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// Branches whose phase two was already delivered out of order once.
    reordered: Arc<Mutex<HashSet<(String, String)>>>,
    /// Calls so far per (xid, branch, action): the attempt number a random fault is drawn
    /// for (a scan of `calls` under its lock made every call O(calls) and stalled long runs).
    attempts: Arc<Mutex<HashMap<CallKey, usize>>>,
    /// `None`: `BranchBatch` is answered UNIMPLEMENTED (the default: a participant built
    /// before batches); `Some`: batches are taken, and each one's size is recorded here.
    batches: Arc<Mutex<Option<Vec<usize>>>>,
}

/// One call that reached the bank: when it arrived and finished, and what it answered.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub xid: String,
    pub branch: String,
    pub action: Action,
    pub started: tokio::time::Instant,
    pub finished: Option<tokio::time::Instant>,
    /// The answer (None if it failed with a gRPC error, was replaced by a status, is still
    /// running, or its caller went away).
    pub answer: Option<BranchResponse>,
    /// The caller's address (one connection per coordinator process).
    pub peer: Option<SocketAddr>,
    /// Delivered in a task of its own (delayed): it ran even if its caller went away.
    pub detached: bool,
    /// Not sent by a coordinator: delivered by the fault injector (out-of-order phase two).
    pub injected: bool,
    /// The call's trace context as the handler saw it.
    pub traceparent: Option<String>,
}

impl Faults {
    /// The bank takes `BranchBatch` calls from now on (see [`Faults::batch_sizes`]).
    pub fn take_batches(&self) {
        self.batches.lock().unwrap().get_or_insert_with(Vec::new);
    }

    /// Scripted faults not yet met by a call.
    pub fn scripted_left(&self) -> usize {
        self.script.lock().unwrap().values().map(|f| f.len()).sum()
    }

    /// How many calls each batch the bank took held, in arrival order.
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone().unwrap_or_default()
    }

    /// The next calls of (branch, action) experience `faults`, in order.
    pub fn push(&self, branch: &str, action: Action, faults: impl IntoIterator<Item = Fault>) {
        self.script
            .lock()
            .unwrap()
            .entry((branch.to_string(), action))
            .or_default()
            .extend(faults);
    }

    /// Random faults at `rates`, seeded.
    pub fn random(seed: u64, rates: FaultRates) -> Faults {
        Faults {
            random: Some((seed, rates)),
            origin: Some(tokio::time::Instant::now()),
            ..Faults::default()
        }
    }

    /// The calls of transaction `xid` draw their random faults at `rates` (needs
    /// [`Faults::random`] for the seed).
    pub fn set_rates(&self, xid: &str, rates: FaultRates) {
        self.per_xid.lock().unwrap().insert(xid.to_string(), rates);
    }

    /// From now on, the xid of every call made slow is sent to the returned receiver.
    pub fn watch_slow_calls(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.slow_calls = Some(tx);
        rx
    }

    fn rates(&self, xid: &str) -> Option<(u64, FaultRates)> {
        let (seed, default) = self.random?;
        let rates = self.per_xid.lock().unwrap().get(xid).copied();
        Some((seed, rates.unwrap_or(default)))
    }

    /// Whether a successful phase-two call of (xid, branch) is followed by its opposite.
    fn reorder(&self, xid: &str, branch: &str) -> bool {
        let Some((seed, r)) = self.rates(xid) else {
            return false;
        };
        let key = format!("{xid}/{branch}/reorder");
        crate::seeded_unit(seed, key.as_bytes()) < r.reorder
            && self
                .reordered
                .lock()
                .unwrap()
                .insert((xid.to_string(), branch.to_string()))
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn next(&self, request: &BranchRequest, action: Action) -> Option<Fault> {
        self.next_of(request, action, false)
    }

    /// [`Faults::next`] for an item of a batch (which may also draw [`Fault::Die`]).
    fn next_in_batch(&self, request: &BranchRequest, action: Action) -> Option<Fault> {
        self.next_of(request, action, true)
    }

    fn next_of(&self, request: &BranchRequest, action: Action, batched: bool) -> Option<Fault> {
        let (xid, branch) = (request.xid.as_str(), request.branch_id.as_str());
        // A message's delivery has no business refusal: one parks the message for a person.
        let refusable = action.is_forward() && request.handler != DELIVER;
        let fault = self
            .scripted(branch, action)
            .or_else(|| self.drawn(xid, branch, action, refusable, batched));
        if fault.is_some() {
            self.injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fault
    }

    fn scripted(&self, branch: &str, action: Action) -> Option<Fault> {
        let mut script = self.script.lock().unwrap();
        for key in [(branch.to_string(), action), ("*".to_string(), action)] {
            if let Some(fault) = script.get_mut(&key).and_then(VecDeque::pop_front) {
                return Some(fault);
            }
        }
        None
    }

    fn drawn(
        &self,
        xid: &str,
        branch: &str,
        action: Action,
        refusable: bool,
        batched: bool,
    ) -> Option<Fault> {
        let (seed, r) = self.rates(xid)?;
        let attempt = self
            .attempts
            .lock()
            .unwrap()
            .get(&(xid.to_string(), branch.to_string(), action))
            .copied()
            .unwrap_or(0);
        let key = format!("{xid}/{branch}/{action}/{attempt}");
        let mut u = crate::seeded_unit(seed, key.as_bytes());
        let v = crate::seeded_unit(seed, format!("{key}/how").as_bytes());
        let how = if v < 0.5 {
            StatusAnswer::Unimplemented
        } else {
            StatusAnswer::Http404
        };
        let after = (v * 4.0) as u32 % 2 == 1;
        if let (Some((every, lasting)), Some(origin)) = (r.status_window, self.origin) {
            let every = every.as_millis().max(1);
            if origin.elapsed().as_millis() % every < lasting.as_millis() {
                return Some(Fault::Status { how, after });
            }
        }
        let forward = action.is_forward();
        let mut draw = |p: f64| {
            let hit = u < p;
            u -= p;
            hit
        };
        if draw(r.handler_error) {
            Some(Fault::HandlerError)
        } else if draw(r.unavailable_before) {
            Some(Fault::UnavailableBefore)
        } else if draw(r.lost_response) {
            Some(Fault::UnavailableAfter)
        } else if draw(r.duplicate) {
            Some(Fault::Duplicate)
        } else if forward && draw(r.late_forward) {
            Some(Fault::Delay(r.late_by))
        } else if refusable && draw(r.refuse_forward) {
            Some(Fault::Refuse)
        } else if draw(r.slow) {
            Some(Fault::Delay(r.slow_by))
        } else if draw(r.status_before) {
            Some(Fault::Status { how, after: false })
        } else if draw(r.status_after) {
            Some(Fault::Status { how, after: true })
        } else if draw(r.abandon) {
            Some(Fault::Abandon(r.abandon_within.mul_f64(v)))
        } else if batched && draw(r.die_in_batch) {
            Some(Fault::Die)
        } else {
            None
        }
    }

    /// How many calls of (branch, action) reached this participant.
    pub fn calls(&self, branch: &str, action: Action) -> usize {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.branch == branch && c.action == action)
            .count()
    }

    /// All calls so far, in arrival order.
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.calls.lock().unwrap().clone()
    }

    fn arrived(
        &self,
        request: &BranchRequest,
        action: Action,
        peer: Option<SocketAddr>,
        injected: bool,
    ) -> usize {
        *self
            .attempts
            .lock()
            .unwrap()
            .entry((request.xid.clone(), request.branch_id.clone(), action))
            .or_default() += 1;
        let mut calls = self.calls.lock().unwrap();
        calls.push(CallRecord {
            xid: request.xid.clone(),
            branch: request.branch_id.clone(),
            action,
            started: tokio::time::Instant::now(),
            finished: None,
            answer: None,
            peer,
            detached: false,
            injected,
            traceparent: request.headers.get(dtx_proto::trace::TRACEPARENT).cloned(),
        });
        calls.len() - 1
    }

    fn detached(&self, index: usize) {
        self.calls.lock().unwrap()[index].detached = true;
    }

    fn is_detached(&self, index: usize) -> bool {
        self.calls.lock().unwrap()[index].detached
    }

    fn answered(&self, index: usize, answer: &Result<BranchResponse, Status>) {
        let mut calls = self.calls.lock().unwrap();
        calls[index].finished = Some(tokio::time::Instant::now());
        calls[index].answer = answer.as_ref().ok().cloned();
    }
}

/// Thread-safe marker so handler closures can read the scripted "refuse/error" faults.
#[derive(Clone, Default)]
struct HandlerFaults(Arc<Mutex<HashMap<CallKey, Fault>>>);

/// (xid, branch_id, action) of one call.
type CallKey = (String, String, Action);

/// Runs the ledger effect of one call.
async fn effect<C: dtx_sql::Conn>(
    conn: &mut C,
    call: &BranchCall,
) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
    let (account, amount) = parse(&call.payload)?;
    let inflow = matches!(call.handler.as_str(), "deposit" | "credit" | DELIVER);
    let (delta, held) = match (inflow, call.action) {
        (false, Action::Try) => (-amount, amount),
        (false, Action::Confirm) => (0, -amount),
        (false, Action::Cancel) => (amount, -amount),
        (false, Action::Action) => (-amount, 0),
        (false, Action::Compensate) => (amount, 0),
        (true, Action::Try | Action::Cancel) => (0, 0),
        (true, Action::Confirm | Action::Action) => (amount, 0),
        (true, Action::Compensate) => (-amount, 0),
        (_, Action::CheckBack | Action::Message) => {
            return Err("the ledger is no two-phase message's".into());
        }
    };
    let applied = ledger::apply(
        conn,
        &account,
        delta,
        held,
        &call.xid,
        &call.branch_id,
        call.action.as_str(),
    )
    .await;
    match applied {
        Ok(()) => Ok(Reply::Success(
            format!(
                "{}:{}:{}",
                call.action,
                call.branch_id,
                uuid::Uuid::new_v4()
            )
            .into_bytes(),
        )),
        Err(dtx_sql::sqlx::Error::Protocol(msg)) if call.action.is_forward() => {
            Ok(Reply::refuse(msg))
        }
        Err(e) => Err(e.into()),
    }
}

fn ledger_handler<C: dtx_sql::Conn + 'static>(
    faults: HandlerFaults,
) -> impl dtx_sdk::server::HandlerFn<C> {
    move |conn, call| {
        let fault = faults.0.lock().unwrap().remove(&(
            call.xid.clone(),
            call.branch_id.clone(),
            call.action,
        ));
        Box::pin(async move {
            match fault {
                Some(Fault::HandlerError) => Err("injected handler error".into()),
                Some(Fault::Refuse) => {
                    // Make a change first: the refusal must undo it.
                    let _ = effect(conn, &call).await;
                    Ok(Reply::refuse("injected refusal"))
                }
                Some(Fault::RefuseWith(message)) => {
                    let _ = effect(conn, &call).await;
                    Ok(Reply::refuse(message))
                }
                Some(Fault::Die) => {
                    let _ = effect(conn, &call).await;
                    std::panic::panic_any(DIED);
                }
                _ => effect(conn, &call).await,
            }
        })
    }
}

/// What a participant that died mid-transaction ([`Fault::Die`]) panics with, and what its
/// caller is answered (see [`quiet_deaths`]).
pub const DIED: &str = "injected: the participant died mid-transaction";

/// Keeps the panics of [`Fault::Die`] out of the test output (other panics print as before).
pub fn quiet_deaths() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&DIED) {
                previous(info);
            }
        }));
    });
}

/// The bank's handler for message deliveries: a credit, which the random faults never refuse
/// (a delivery that refuses parks its message for a person).
pub const DELIVER: &str = "deliver";

/// The handler answering the check-backs of the messages the bank's orders send.
pub const ORDERS_CHECK_BACK: &str = "orders.check_back";

/// The bank participant: the ledger handlers behind the barrier, wrapped with fault injection.
pub struct Bank<DB: Backend> {
    inner: Arc<ParticipantServer<DB>>,
    faults: Faults,
    handler_faults: HandlerFaults,
}

impl<DB: Backend> Bank<DB> {
    pub fn new(pool: Pool<DB>, faults: Faults) -> Self {
        Self::accepting(pool, faults, None)
    }

    /// A bank that takes calls only from callers whose certificate names one of `callers`.
    pub fn accepting(pool: Pool<DB>, faults: Faults, callers: Option<&[&str]>) -> Self {
        Self::configured(pool, faults, |server| match callers {
            Some(callers) => server.accept_callers(callers.iter().copied()),
            None => server,
        })
    }

    /// A bank whose participant server `configure` sets up (who it accepts calls from).
    pub fn configured(
        pool: Pool<DB>,
        faults: Faults,
        configure: impl FnOnce(ParticipantServer<DB>) -> ParticipantServer<DB>,
    ) -> Self {
        let handler_faults = HandlerFaults::default();
        let inner = configure(ParticipantServer::new(pool))
            .tcc(
                "transfer",
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
            )
            .tcc(
                "deposit",
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
            )
            .saga(
                "debit",
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
            )
            .saga(
                "credit",
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
            )
            .saga(
                DELIVER,
                ledger_handler(handler_faults.clone()),
                ledger_handler(handler_faults.clone()),
            )
            // The bank also initiates two-phase messages (its orders, see the message tests).
            .message_check_back(ORDERS_CHECK_BACK);
        Bank {
            inner: Arc::new(inner),
            faults,
            handler_faults,
        }
    }

    pub fn into_service(self) -> WireServer<Self> {
        WireServer::new(self)
    }

    /// Runs the call; a handler that died ([`Fault::Die`]) is answered UNAVAILABLE.
    async fn deliver(&self, request: BranchRequest) -> Result<BranchResponse, Status> {
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.handle(request).await })
            .await
            .unwrap_or_else(|_| Err(Status::unavailable(DIED)))
    }
}

impl<DB: Backend> Bank<DB> {
    /// The service behind a proxy that turns answers marked by a [`Fault::Status`] with
    /// [`StatusAnswer::Http404`] into a plain HTTP 404 without `grpc-status`.
    pub fn into_http_service(self) -> MisrouteProxy<WireServer<Self>> {
        MisrouteProxy::marked(self.into_service())
    }

    /// After a successful Confirm (Cancel) of a TCC branch, maybe deliver its Cancel
    /// (Confirm) too, the way a second coordinator with the opposite decision would.
    fn maybe_reorder(&self, request: &BranchRequest, action: Action, ok: bool) {
        let opposite = match action {
            Action::Confirm => Action::Cancel,
            Action::Cancel => Action::Confirm,
            _ => return,
        };
        if !ok || !self.faults.reorder(&request.xid, &request.branch_id) {
            return;
        }
        let mut late = request.clone();
        late.action = opposite.to_wire().expect("a wire action") as i32;
        let (inner, faults) = (self.inner.clone(), self.faults.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let index = faults.arrived(&late, opposite, None, true);
            faults
                .injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answer = inner.handle(late).await;
            faults.answered(index, &answer);
        });
    }
}

fn status_only(how: StatusAnswer) -> Result<Response<BranchResponse>, Status> {
    match how {
        StatusAnswer::Unimplemented => Err(Status::unimplemented(
            "injected: dtx.v1.Participant is not served here",
        )),
        StatusAnswer::Http404 => {
            let mut response = Response::new(BranchResponse::default());
            response.extensions_mut().insert(Replace404);
            Ok(response)
        }
    }
}

#[tonic::async_trait]
impl<DB: Backend> Participant for Bank<DB> {
    async fn branch(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let peer = request.remote_addr();
        let request = self.inner.admit(request)?;
        let Some(action) = Action::from_wire(request.action) else {
            return self.deliver(request).await.map(Response::new);
        };
        let index = self.faults.arrived(&request, action, peer, false);
        let fault = self.faults.next(&request, action);
        let sent = request.clone();
        let answer = match fault {
            Some(Fault::UnavailableBefore) => {
                Err(Status::unavailable("injected: unavailable before the call"))
            }
            Some(Fault::UnavailableAfter) => match self.deliver(request).await {
                Ok(_) => Err(Status::unavailable(
                    "injected: response lost after the call",
                )),
                Err(e) => Err(e),
            },
            Some(Fault::Status { how, after }) => {
                if after {
                    let ran = self.deliver(request).await;
                    let ok = ran
                        .as_ref()
                        .is_ok_and(|r| r.outcome() == dtx_proto::v1::Outcome::Success);
                    self.maybe_reorder(&sent, action, ok);
                }
                self.faults.answered(index, &Err(Status::unknown("status")));
                return status_only(how);
            }
            Some(Fault::Delay(d)) => {
                if let Some(slow) = &self.faults.slow_calls {
                    slow.send(request.xid.clone()).ok();
                }
                self.faults.detached(index);
                let inner = self.inner.clone();
                let faults = self.faults.clone();
                // Detached: the delivery happens even if the caller stops waiting.
                let late = tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let answer = inner.handle(request).await;
                    faults.answered(index, &answer);
                    answer
                });
                late.await.expect("late delivery")
            }
            Some(Fault::Abandon(after)) => {
                match tokio::time::timeout(after, self.deliver(request)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(Status::cancelled("injected: the caller went away mid-call")),
                }
            }
            Some(Fault::Duplicate) => {
                let (first, _second) =
                    tokio::join!(self.deliver(request.clone()), self.deliver(request));
                first
            }
            Some(
                fault @ (Fault::HandlerError | Fault::Refuse | Fault::RefuseWith(_) | Fault::Die),
            ) => {
                self.handler_faults.0.lock().unwrap().insert(
                    (request.xid.clone(), request.branch_id.clone(), action),
                    fault,
                );
                self.deliver(request).await
            }
            None => self.deliver(request).await,
        };
        if !self.faults.is_detached(index) {
            self.faults.answered(index, &answer);
        }
        let ok = answer
            .as_ref()
            .is_ok_and(|r| r.outcome() == dtx_proto::v1::Outcome::Success);
        self.maybe_reorder(&sent, action, ok);
        answer.map(Response::new)
    }

    /// Unless [`Faults::take_batches`] was called, answers UNIMPLEMENTED, as a participant
    /// built before `BranchBatch` does, so coordinators send it single calls. Taking batches,
    /// each item is logged and meets its scripted or random fault like a single call, the way
    /// a batch can: a handler fault (refusal, error, [`Fault::Die`]) applies to its item inside
    /// the batch's transaction; a status-only answer replaces its item's answer (the item runs
    /// first when `after`); the other faults of the wire (unavailable before or after, delay,
    /// duplicate, abandon) happen to the whole batch, as one call.
    async fn branch_batch(
        &self,
        request: Request<BranchBatchRequest>,
    ) -> Result<Response<BranchBatchResponse>, Status> {
        if self.faults.batches.lock().unwrap().is_none() {
            return Err(Status::unimplemented(
                "this participant takes branch calls one at a time",
            ));
        }
        let peer = request.remote_addr();
        let mut items = self.inner.admit_batch(request)?;
        let mut logged = Vec::new();
        let mut replaced = Vec::new();
        let mut wire_fault = None;
        for (item, admitted) in items.iter_mut().enumerate() {
            let Ok(request) = admitted else { continue };
            let Some(action) = Action::from_wire(request.action) else {
                continue;
            };
            let index = self.faults.arrived(request, action, peer, false);
            logged.push((item, index, request.clone(), action));
            match self.faults.next_in_batch(request, action) {
                Some(
                    fault @ (Fault::HandlerError
                    | Fault::Refuse
                    | Fault::RefuseWith(_)
                    | Fault::Die),
                ) => {
                    let key = (request.xid.clone(), request.branch_id.clone(), action);
                    self.handler_faults.0.lock().unwrap().insert(key, fault);
                }
                Some(Fault::Status { after, .. }) => {
                    let status = Status::unimplemented("injected: a status-only item answer");
                    if !after {
                        *admitted = Err(status.clone());
                    }
                    replaced.push((item, status));
                }
                Some(fault) => wire_fault = wire_fault.or(Some(fault)),
                None => {}
            }
        }
        if let Some(sizes) = self.faults.batches.lock().unwrap().as_mut() {
            sizes.push(items.len());
        }
        let inner = self.inner.clone();
        // A panicking handler ([`Fault::Die`]) unwinds through the batch's open transaction,
        // which the database rolls back: the participant died mid-transaction.
        let run = |items: Vec<Result<BranchRequest, Status>>| {
            let inner = inner.clone();
            async move {
                tokio::spawn(async move { inner.handle_batch(items).await })
                    .await
                    .map_err(|_| Status::unavailable(DIED))
            }
        };
        let answered = match wire_fault {
            None => run(items).await,
            Some(Fault::UnavailableBefore) => Err(Status::unavailable(
                "injected: unavailable before the batch",
            )),
            Some(Fault::UnavailableAfter) => run(items)
                .await
                .and(Err(Status::unavailable("injected: batch response lost"))),
            Some(Fault::Delay(d)) => {
                if let Some(slow) = &self.faults.slow_calls {
                    for (_, _, request, _) in &logged {
                        slow.send(request.xid.clone()).ok();
                    }
                }
                // Delivered even if the caller stops waiting.
                let late = run(items);
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    late.await
                })
                .await
                .expect("late delivery")
            }
            Some(Fault::Abandon(after)) => match tokio::time::timeout(after, run(items)).await {
                Ok(answer) => answer,
                Err(_) => Err(Status::cancelled(
                    "injected: the caller went away mid-batch",
                )),
            },
            Some(Fault::Duplicate) => {
                let (first, _second) = tokio::join!(run(items.clone()), run(items));
                first
            }
            Some(other) => unreachable!("{other:?} is an item's fault"),
        };
        let answered = answered.map(|mut response| {
            for (item, status) in replaced {
                response.answers[item] = BranchBatchAnswer {
                    code: status.code() as i32,
                    message: status.message().to_string(),
                    response: None,
                };
            }
            response
        });
        for (item, index, request, action) in logged {
            let answer = match &answered {
                Err(status) => Err(status.clone()),
                Ok(response) => match &response.answers[item] {
                    BranchBatchAnswer {
                        code: 0, response, ..
                    } => Ok(response.clone().unwrap_or_default()),
                    other => Err(Status::new(other.code.into(), other.message.clone())),
                },
            };
            self.faults.answered(index, &answer);
            let ok = answer
                .as_ref()
                .is_ok_and(|r| r.outcome() == dtx_proto::v1::Outcome::Success);
            self.maybe_reorder(&request, action, ok);
        }
        answered.map(Response::new)
    }
}

/// What a handler does in a direct barrier call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behave {
    /// Apply the ledger effect and reply success with result `"<action>:<tag>"`.
    Ok,
    /// Apply the effect, then refuse (the effect must be undone).
    Refuse,
    /// Apply the effect, then return an error (everything must roll back).
    Error,
}

/// One barrier call on `pool` in its own transaction, the way a service embeds the barrier
/// without the gRPC helper: account `acct`, amount 10. Commits on `Ok`, rolls back on `Err`.
/// No request hash (see [`crate::barrier::call`] for a call that carries one).
pub async fn direct<DB: Backend>(
    pool: &Pool<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    behave: Behave,
    tag: &str,
) -> Result<dtx_sdk::barrier::Answer, dtx_sdk::Error> {
    crate::barrier::call(pool, xid, branch, action, behave, tag, None).await
}
