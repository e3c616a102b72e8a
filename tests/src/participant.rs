//! A test participant: a "bank" that keeps the [`ledger`](crate::ledger) through the barrier,
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
//! or a duplicated delivery.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dtx_proto::v1::participant_server::{Participant, ParticipantServer as WireServer};
use dtx_proto::v1::{BranchRequest, BranchResponse};
use dtx_sdk::barrier::{Action, Reply};
use dtx_sdk::server::{BranchCall, ParticipantServer};
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use tonic::{Request, Response, Status};

use crate::ledger;

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
    /// The call fails with UNAVAILABLE before reaching the handler.
    UnavailableBefore,
    /// The call runs (effect committed), then the response is lost: UNAVAILABLE.
    UnavailableAfter,
    /// The call is delivered this long after it arrived - even if the caller gave up
    /// meanwhile, like a request stuck in the network (it runs in a task of its own).
    Delay(Duration),
    /// The call is delivered twice, concurrently; the first answer is returned.
    Duplicate,
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
}

/// Scripted faults per (branch_id, action); `"*"` matches every branch. Optionally also random
/// faults, drawn from a hash of (seed, xid, branch, action, attempt) so the same seed gives the
/// same fault to the same call whatever the timing.
#[derive(Clone, Default)]
pub struct Faults {
    script: Arc<Mutex<Script>>,
    random: Option<(u64, FaultRates)>,
    injected: Arc<std::sync::atomic::AtomicU64>,
    /// Every call that reached the wrapper, in arrival order.
    calls: Arc<Mutex<Vec<CallRecord>>>,
}

/// One call that reached the bank: when it arrived and finished, and what it answered.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub xid: String,
    pub branch: String,
    pub action: Action,
    pub started: tokio::time::Instant,
    pub finished: Option<tokio::time::Instant>,
    /// The answer (None if it failed with a gRPC error or is still running).
    pub answer: Option<BranchResponse>,
}

impl Faults {
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
            ..Faults::default()
        }
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn next(&self, xid: &str, branch: &str, action: Action) -> Option<Fault> {
        let fault = self
            .scripted(branch, action)
            .or_else(|| self.drawn(xid, branch, action));
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

    fn drawn(&self, xid: &str, branch: &str, action: Action) -> Option<Fault> {
        let (seed, r) = self.random?;
        let attempt = {
            let calls = self.calls.lock().unwrap();
            calls
                .iter()
                .filter(|c| c.xid == xid && c.branch == branch && c.action == action)
                .count()
        };
        let key = format!("{xid}/{branch}/{action}/{attempt}");
        let mut u = crate::seeded_unit(seed, key.as_bytes());
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
        } else if forward && draw(r.refuse_forward) {
            Some(Fault::Refuse)
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

    fn arrived(&self, request: &BranchRequest, action: Action) -> usize {
        let mut calls = self.calls.lock().unwrap();
        calls.push(CallRecord {
            xid: request.xid.clone(),
            branch: request.branch_id.clone(),
            action,
            started: tokio::time::Instant::now(),
            finished: None,
            answer: None,
        });
        calls.len() - 1
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
    let inflow = matches!(call.handler.as_str(), "deposit" | "credit");
    let (delta, held) = match (inflow, call.action) {
        (false, Action::Try) => (-amount, amount),
        (false, Action::Confirm) => (0, -amount),
        (false, Action::Cancel) => (amount, -amount),
        (false, Action::Action) => (-amount, 0),
        (false, Action::Compensate) => (amount, 0),
        (true, Action::Try | Action::Cancel) => (0, 0),
        (true, Action::Confirm | Action::Action) => (amount, 0),
        (true, Action::Compensate) => (-amount, 0),
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
                _ => effect(conn, &call).await,
            }
        })
    }
}

/// The bank participant: the ledger handlers behind the barrier, wrapped with fault injection.
pub struct Bank<DB: Backend> {
    inner: Arc<ParticipantServer<DB>>,
    faults: Faults,
    handler_faults: HandlerFaults,
}

impl<DB: Backend> Bank<DB>
where
    DB::Conn: 'static,
{
    pub fn new(pool: Pool<DB>, faults: Faults) -> Self {
        let handler_faults = HandlerFaults::default();
        let inner = ParticipantServer::new(pool)
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
            );
        Bank {
            inner: Arc::new(inner),
            faults,
            handler_faults,
        }
    }

    pub fn into_service(self) -> WireServer<Self> {
        WireServer::new(self)
    }

    async fn deliver(&self, request: BranchRequest) -> Result<BranchResponse, Status> {
        self.inner.handle(request).await
    }
}

#[tonic::async_trait]
impl<DB: Backend> Participant for Bank<DB>
where
    DB::Conn: 'static,
{
    async fn branch(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let request = request.into_inner();
        let Some(action) = Action::from_wire(request.action) else {
            return self.deliver(request).await.map(Response::new);
        };
        let index = self.faults.arrived(&request, action);
        let fault = self.faults.next(&request.xid, &request.branch_id, action);
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
            Some(Fault::Delay(d)) => {
                let inner = self.inner.clone();
                let faults = self.faults.clone();
                // Detached: the delivery happens even if the caller stops waiting.
                let late = tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let answer = inner.handle(request).await;
                    faults.answered(index, &answer);
                    answer
                });
                return late.await.expect("late delivery").map(Response::new);
            }
            Some(Fault::Duplicate) => {
                let (first, _second) =
                    tokio::join!(self.deliver(request.clone()), self.deliver(request));
                first
            }
            Some(fault @ (Fault::HandlerError | Fault::Refuse)) => {
                self.handler_faults.0.lock().unwrap().insert(
                    (request.xid.clone(), request.branch_id.clone(), action),
                    fault,
                );
                self.deliver(request).await
            }
            None => self.deliver(request).await,
        };
        self.faults.answered(index, &answer);
        answer.map(Response::new)
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
pub async fn direct<DB: Backend>(
    pool: &Pool<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    behave: Behave,
    tag: &str,
) -> Result<dtx_sdk::barrier::Answer, dtx_sdk::Error>
where
    DB::Conn: 'static,
{
    let key = dtx_sdk::barrier::BranchKey::new(xid, branch, action)?;
    let call = BranchCall {
        xid: xid.to_string(),
        branch_id: branch.to_string(),
        handler: "transfer".to_string(),
        action,
        payload: payload("acct", 10),
        headers: Default::default(),
    };
    let tag = tag.to_string();
    let mut tx = DB::begin(pool).await?;
    let answer = dtx_sdk::barrier::call(DB::conn(&mut tx), key, move |conn| {
        Box::pin(async move {
            effect(conn, &call).await?;
            match behave {
                Behave::Ok => Ok(Reply::Success(format!("{action}:{tag}").into_bytes())),
                Behave::Refuse => Ok(Reply::refuse(format!("refused:{tag}"))),
                Behave::Error => Err(format!("error:{tag}").into()),
            }
        })
    })
    .await;
    match answer {
        Ok(answer) => {
            tx.commit().await?;
            Ok(answer)
        }
        Err(e) => {
            tx.rollback().await.ok();
            Err(e)
        }
    }
}
