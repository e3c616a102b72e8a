//! The branch barrier: makes repeated, concurrent and out-of-order branch calls safe.
//!
//! Every branch call writes a row keyed by (xid, branch_id, action) into `dtx_barrier` *inside
//! the same local transaction as the business change*. The unique key, not a prior check, decides
//! what happens:
//!
//! | call                         | row insert                       | answer                          |
//! |------------------------------|----------------------------------|---------------------------------|
//! | Try/Action, first            | own row inserted                 | run the handler, store outcome  |
//! | Try/Action, repeat           | own row exists, same request     | stored first outcome and result |
//! | Try/Action, other request    | own row exists, other hash       | FAILURE (conflict), no effect   |
//! | Try/Action after Cancel      | row exists, written by Cancel    | rejected (suspended), no effect |
//! | Confirm/Cancel, first        | phase-two slot inserted          | run the handler                 |
//! | Confirm/Cancel, repeat       | slot exists, same op             | success, no effect              |
//! | Cancel after Confirm (or rev)| slot exists, other op            | FAILURE (conflict), no effect   |
//! | Compensate, repeat           | own row exists                   | success, no effect              |
//! | Cancel before Try            | Try's row inserted *by Cancel*   | success (empty rollback)        |
//! | Cancel of a refused Try      | Try's row says failure           | success, nothing to undo        |
//! | message's local transaction  | message slot inserted            | run the business, commit        |
//! | message check-back, no slot  | slot inserted *by the check-back*| FAILURE (drop); the late local transaction cannot commit |
//! | message check-back, committed| slot exists, written by the local transaction | SUCCESS (deliver) |
//!
//! Two-phase messages (see [`prepare_message`] and [`check_back`]) use the same unique key: the
//! check-back never guesses, it waits for a local transaction still holding the slot.
//!
//! **Phase two is one-way.** A TCC branch has one phase-two slot, the row `(xid, branch,
//! "phase2")`: Confirm and Cancel both insert it with their name in `written_by`, so the unique
//! key - not a check before the insert - decides which one ran, even when they race; the loser
//! reads the winner's name and answers a conflict (a person forced the other decision at the
//! participant; the coordinator parks the transaction for them). Each op also keeps its own row
//! (`confirm`/`cancel`), which readers of the table and rows from before the slot rely on. A
//! saga has no such pair: its compensation *follows* its action, so Compensate takes no slot.
//!
//! **The request is checked.** A Try/Action row stores the hash of its request
//! ([`BranchKey::with_request`]); a repeat with another hash is a conflict, not a replay of a
//! result that belongs to a different request. Rows without a hash (written before the column
//! existed, or by a caller that gave none) are accepted unchecked.
//!
//! Concurrent duplicates wait on the unique key of the first one and then see its committed row.
//! On MySQL/MariaDB the barrier uses `INSERT IGNORE` plus locking reads of rows that exist,
//! never `SELECT ... FOR UPDATE` on a missing row, so REPEATABLE READ gap locks cannot deadlock
//! two inserters; [`crate::server`] additionally runs its transactions at READ COMMITTED and
//! retries the rare deadlock victim.
//!
//! Use it directly with [`call`] inside your own transaction, or let
//! [`crate::server::ParticipantServer`] do it for every gRPC branch call.

mod message;
mod sql;

use dtx_proto::limits;
use dtx_proto::v1::BranchAction;
use dtx_sql::{Conn, now_ms};
use futures::future::BoxFuture;

pub use message::{MESSAGE_BRANCH, Prepared, check_back, prepare_message};
pub use sql::purge_older_than;

pub use dtx_idempotency::HandlerError;

use crate::Error;
use crate::idempotency::RequestHash;

dtx_sql::db_enum! {
    /// The action of a branch call; `as_str` is the name stored in `dtx_barrier.action` (and
    /// `written_by`).
    pub enum Action {
        /// A TCC branch's reservation.
        Try = "try",
        /// A TCC branch's commit of its reservation.
        Confirm = "confirm",
        /// A TCC branch's release of its reservation (or a null compensation, with no Try).
        Cancel = "cancel",
        /// A saga step's forward action.
        Action = "action",
        /// A saga step's compensation.
        Compensate = "compensate",
        /// The coordinator asking whether a two-phase message's local transaction committed.
        CheckBack = "check_back",
        /// A two-phase message's local transaction (no wire action: the initiator writes it).
        Message = "message",
    }
}

impl Action {
    /// Try and Action run business code whose outcome repeats must get back.
    pub fn is_forward(self) -> bool {
        matches!(self, Action::Try | Action::Action)
    }

    /// Confirm and Cancel: the two TCC decisions, mutually exclusive through the branch's
    /// phase-two slot. (Compensate is not one: it follows a saga action by design.)
    pub fn is_phase_two(self) -> bool {
        matches!(self, Action::Confirm | Action::Cancel)
    }

    /// The forward action a Cancel/Compensate undoes.
    pub fn undoes(self) -> Option<Action> {
        match self {
            Action::Cancel => Some(Action::Try),
            Action::Compensate => Some(Action::Action),
            _ => None,
        }
    }

    /// Converts the wire enum; `None` for `UNSPECIFIED` or unknown values.
    pub fn from_wire(value: i32) -> Option<Action> {
        match BranchAction::try_from(value).ok()? {
            BranchAction::Try => Some(Action::Try),
            BranchAction::Confirm => Some(Action::Confirm),
            BranchAction::Cancel => Some(Action::Cancel),
            BranchAction::Action => Some(Action::Action),
            BranchAction::Compensate => Some(Action::Compensate),
            BranchAction::CheckBack => Some(Action::CheckBack),
            BranchAction::Unspecified => None,
        }
    }

    /// The wire enum; `None` for [`Action::Message`], which no call carries.
    pub fn to_wire(self) -> Option<BranchAction> {
        Some(match self {
            Action::Try => BranchAction::Try,
            Action::Confirm => BranchAction::Confirm,
            Action::Cancel => BranchAction::Cancel,
            Action::Action => BranchAction::Action,
            Action::Compensate => BranchAction::Compensate,
            Action::CheckBack => BranchAction::CheckBack,
            Action::Message => return None,
        })
    }
}

/// Identifies one branch call: the barrier's unique key, and the request it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchKey<'a> {
    /// The transaction (tenant-scoped, as the coordinator sends it).
    pub xid: &'a str,
    /// The branch or saga step.
    pub branch_id: &'a str,
    /// Which call this is.
    pub action: Action,
    /// The request's hash, stored with a Try/Action row so a repeat with another request is a
    /// conflict. `None`: no check (the stored first result is replayed to any repeat).
    pub request: Option<RequestHash>,
}

impl<'a> BranchKey<'a> {
    /// Checks the ids against the contract's limits (they must fit the barrier's key columns).
    pub fn new(xid: &'a str, branch_id: &'a str, action: Action) -> Result<Self, Error> {
        limits::check_scoped_xid(xid)?;
        limits::check_branch_id("branch_id", branch_id)?;
        Ok(BranchKey {
            xid,
            branch_id,
            action,
            request: None,
        })
    }

    /// Checks repeats of a Try/Action against `request` (for example
    /// `RequestHash::of_bytes(payload)`); ignored by the other actions.
    pub fn with_request(mut self, request: RequestHash) -> Self {
        self.request = Some(request);
        self
    }
}

/// What a handler decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done; the payload is the result repeats get back (Try/Action).
    Success(Vec<u8>),
    /// An explicit business refusal: the handler's changes are undone and the refusal is
    /// recorded, so repeats get the same answer. Only meaningful for Try/Action; from
    /// Confirm/Cancel/Compensate it parks the transaction for an operator.
    Failure(Vec<u8>),
}

impl Reply {
    /// Success with an empty result.
    pub fn ok() -> Self {
        Reply::Success(Vec::new())
    }

    /// A refusal carrying a human-readable reason.
    pub fn refuse(reason: impl Into<String>) -> Self {
        Reply::Failure(reason.into().into_bytes())
    }
}

/// Why the barrier answered as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The handler ran in this call.
    Executed,
    /// A repeat, answered from the stored first outcome (or, for Confirm/Cancel/Compensate,
    /// simply acknowledged).
    Duplicate,
    /// Cancel/Compensate before its Try/Action: recorded, and the late Try/Action is blocked.
    EmptyRollback,
    /// Try/Action after its Cancel/Compensate: rejected without effect.
    Suspended,
    /// Cancel/Compensate of a Try/Action that was refused: nothing to undo.
    NothingToUndo,
    /// Confirm of a Try that never succeeded: refused, nothing recorded (a protocol violation
    /// an operator must look at).
    OutOfOrder,
    /// The call contradicts the branch's record: Cancel after its Confirm (or the reverse), or
    /// a Try/Action repeated with another request. Refused, no effect, nothing recorded.
    Conflict,
}

/// The barrier's answer to one branch call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// What the caller is told.
    pub reply: Reply,
    /// Why, for metrics and logs (first run, repeat, null compensation, ...).
    pub detail: Detail,
}

impl Answer {
    fn new(reply: Reply, detail: Detail) -> Self {
        Answer { reply, detail }
    }

    /// Whether the call succeeded (first time or as a repeat).
    pub fn is_success(&self) -> bool {
        matches!(self.reply, Reply::Success(_))
    }
}

/// A stored barrier row, as far as the barrier needs it.
#[derive(Debug)]
struct Row {
    written_by: Action,
    outcome: sql::Outcome,
    result: Vec<u8>,
    /// Hex hash of the Try/Action request; `None` on rows without one.
    request_hash: Option<String>,
}

/// Runs one branch call through the barrier inside the caller's open transaction.
///
/// `handler` is called at most once, only when this is the first arrival of the call and it
/// may have an effect. After `Ok`, commit the transaction; after `Err`, roll it back (the
/// barrier row goes with it, so a retry runs again).
///
/// A handler's [`Reply::Failure`] is isolated with a savepoint: the handler's own changes are
/// undone; a refused Try/Action keeps its barrier row with the refusal (repeats get the same
/// answer), a refused Confirm/Cancel/Compensate keeps nothing (so it can run again once an
/// operator fixed the cause). Committing after `Ok` is therefore always right.
pub async fn call<C, F>(conn: &mut C, key: BranchKey<'_>, handler: F) -> Result<Answer, Error>
where
    C: Conn,
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<Reply, HandlerError>>,
{
    if matches!(key.action, Action::CheckBack | Action::Message) {
        return Err(Error::Barrier(format!(
            "{} is a two-phase message's, not a branch call's: use check_back/prepare_message",
            key.action
        )));
    }
    match key.action.undoes() {
        None if key.action.is_forward() => forward(conn, key, handler).await,
        None => confirm(conn, key, handler).await,
        Some(origin) => undo(conn, key, origin, handler).await,
    }
}

async fn forward<C, F>(conn: &mut C, key: BranchKey<'_>, handler: F) -> Result<Answer, Error>
where
    C: Conn,
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<Reply, HandlerError>>,
{
    let own = sql::RowKey::of(key.xid, key.branch_id, key.action);
    let request = key.request.map(|h| h.to_hex());
    let inserted = sql::insert(
        conn,
        sql::NewRow {
            key: own,
            written_by: key.action,
            outcome: sql::Outcome::Pending,
            request_hash: request.as_deref(),
        },
    )
    .await?;
    if !inserted {
        let row = sql::read(conn, own)
            .await?
            .ok_or_else(|| Error::Barrier(format!("barrier row of {key:?} vanished")))?;
        return Ok(repeat_of_forward(key, request.as_deref(), row));
    }
    let savepoint = sql::savepoint(conn).await?;
    let reply = handler(conn).await.map_err(Error::Handler)?;
    let (outcome, result) = match &reply {
        Reply::Success(result) => (sql::Outcome::Success, result),
        Reply::Failure(result) => (sql::Outcome::Failure, result),
    };
    savepoint
        .end(conn, outcome == sql::Outcome::Success)
        .await?;
    limits::check_payload("handler result", result)?;
    sql::record(conn, own, outcome, result).await?;
    Ok(Answer::new(reply, Detail::Executed))
}

/// A Try/Action whose row already exists: the stored first outcome, a conflict if it was
/// written for another request, or suspended if a Cancel/Compensate claimed the row first.
fn repeat_of_forward(key: BranchKey<'_>, request: Option<&str>, row: Row) -> Answer {
    let action = key.action;
    if row.written_by != action {
        return Answer::new(
            Reply::refuse(format!(
                "suspended: {} arrived after its {}",
                action, row.written_by
            )),
            Detail::Suspended,
        );
    }
    if let (Some(stored), Some(request)) = (row.request_hash.as_deref(), request)
        && stored != request
    {
        return Answer::new(
            Reply::refuse(format!(
                "{action} refused: branch {}/{} was tried with a different request",
                key.xid, key.branch_id
            )),
            Detail::Conflict,
        );
    }
    let reply = if row.outcome == sql::Outcome::Failure {
        Reply::Failure(row.result)
    } else {
        Reply::Success(row.result)
    };
    Answer::new(reply, Detail::Duplicate)
}

async fn confirm<C, F>(conn: &mut C, key: BranchKey<'_>, handler: F) -> Result<Answer, Error>
where
    C: Conn,
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<Reply, HandlerError>>,
{
    let savepoint = sql::savepoint(conn).await?;
    if let Some(answer) = claim_phase_two(conn, key).await? {
        savepoint.release(conn).await?;
        return Ok(answer);
    }
    if !insert_own(conn, key).await? {
        // A Confirm that ran before its slot existed (written by an older barrier).
        savepoint.release(conn).await?;
        return Ok(Answer::new(Reply::ok(), Detail::Duplicate));
    }
    // Confirm is only ever sent after every Try answered success; anything else is a protocol
    // violation that must reach an operator rather than confirm a reservation that isn't there.
    // Rolling back to the savepoint frees the slot again: nothing was decided here.
    let tried = sql::read(conn, sql::RowKey::of(key.xid, key.branch_id, Action::Try)).await?;
    let problem = match tried {
        Some(row) if row.written_by == Action::Try && row.outcome == sql::Outcome::Success => None,
        None => Some("never ran (or its barrier row was purged)".to_string()),
        Some(row) if row.written_by != Action::Try => {
            Some(format!("was blocked by {}", row.written_by))
        }
        Some(_) => Some("was refused".to_string()),
    };
    if let Some(problem) = problem {
        savepoint.rollback(conn).await?;
        let message = format!(
            "confirm of xid {} branch {} rejected: its try {problem}",
            key.xid, key.branch_id
        );
        return Ok(Answer::new(Reply::refuse(message), Detail::OutOfOrder));
    }
    run_undoable(conn, savepoint, handler).await
}

async fn undo<C, F>(
    conn: &mut C,
    key: BranchKey<'_>,
    origin: Action,
    handler: F,
) -> Result<Answer, Error>
where
    C: Conn,
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<Reply, HandlerError>>,
{
    let savepoint = sql::savepoint(conn).await?;
    if key.action.is_phase_two()
        && let Some(answer) = claim_phase_two(conn, key).await?
    {
        savepoint.release(conn).await?;
        return Ok(answer);
    }
    // Claim the origin's row: if that succeeds the Try/Action never ran (and now never will),
    // so there is nothing to undo.
    let origin_row = sql::RowKey::of(key.xid, key.branch_id, origin);
    let claimed_origin = sql::insert(
        conn,
        sql::NewRow {
            key: origin_row,
            written_by: key.action,
            outcome: sql::Outcome::Empty,
            request_hash: None,
        },
    )
    .await?;
    let first = insert_own(conn, key).await?;
    let detail = if !first {
        Some(Detail::Duplicate)
    } else if claimed_origin {
        Some(Detail::EmptyRollback)
    } else {
        let row = sql::read(conn, origin_row).await?;
        row.is_some_and(|row| row.outcome == sql::Outcome::Failure)
            .then_some(Detail::NothingToUndo)
    };
    if let Some(detail) = detail {
        savepoint.release(conn).await?;
        return Ok(Answer::new(Reply::ok(), detail));
    }
    run_undoable(conn, savepoint, handler).await
}

/// Inserts the call's own Confirm/Cancel/Compensate row; false if it exists (a repeat).
async fn insert_own<C: Conn>(conn: &mut C, key: BranchKey<'_>) -> Result<bool, Error> {
    sql::insert(
        conn,
        sql::NewRow {
            key: sql::RowKey::of(key.xid, key.branch_id, key.action),
            written_by: key.action,
            outcome: sql::Outcome::Success,
            request_hash: None,
        },
    )
    .await
}

/// Takes the branch's phase-two slot for this Confirm/Cancel. `None`: taken now, go on.
/// Otherwise the answer: a quiet duplicate if this op holds it, a conflict if the other one
/// does. Concurrent claimants wait on the slot's key for the first one's commit and then read
/// its committed row (a locking read of an existing row: no gap locks).
async fn claim_phase_two<C: Conn>(
    conn: &mut C,
    key: BranchKey<'_>,
) -> Result<Option<Answer>, Error> {
    let op = key.action;
    let (xid, branch) = (key.xid, key.branch_id);
    let slot = sql::RowKey::slot(xid, branch, sql::Slot::PhaseTwo);
    let claim = sql::NewRow {
        key: slot,
        written_by: op,
        outcome: sql::Outcome::Success,
        request_hash: None,
    };
    if sql::insert(conn, claim).await? {
        return Ok(None);
    }
    let holder = sql::read(conn, slot)
        .await?
        .ok_or_else(|| Error::Barrier(format!("phase-two slot of {xid}/{branch} vanished")))?
        .written_by;
    if holder == op {
        return Ok(Some(Answer::new(Reply::ok(), Detail::Duplicate)));
    }
    let reason = format!(
        "{op} refused: branch {xid}/{branch} was already {}",
        decided(holder)
    );
    tracing::warn!(xid, branch, %reason, "phase-two conflict at the barrier");
    Ok(Some(Answer::new(Reply::refuse(reason), Detail::Conflict)))
}

/// How a conflict names the op holding the slot.
fn decided(holder: Action) -> String {
    match holder {
        Action::Confirm => "confirmed".to_string(),
        Action::Cancel => "cancelled".to_string(),
        other => format!("taken by {other}"),
    }
}

/// Runs a Confirm/Cancel/Compensate handler after its barrier rows were written under the open
/// savepoint: a refusal rolls the rows back too, so the call can run again later.
async fn run_undoable<C, F>(
    conn: &mut C,
    savepoint: dtx_sql::Savepoint,
    handler: F,
) -> Result<Answer, Error>
where
    C: Conn,
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<Reply, HandlerError>>,
{
    let reply = handler(conn).await.map_err(Error::Handler)?;
    let keep = matches!(reply, Reply::Success(_));
    savepoint.end(conn, keep).await?;
    Ok(Answer::new(reply, Detail::Executed))
}

/// Deletes barrier rows created before `now - retention`, at most `batch` per statement, until
/// none is left; returns how many were deleted. The window must outlive the coordinator's longest
/// retry horizon, or a very late repeat would find no row and run again.
pub async fn purge<DB: dtx_sql::Backend>(
    pool: &dtx_sql::sqlx::Pool<DB>,
    retention: std::time::Duration,
    batch: u32,
) -> Result<u64, Error> {
    let cutoff = now_ms() - retention.as_millis() as i64;
    purge_older_than::<DB>(pool, cutoff, batch).await
}

/// Runs [`purge`] every `interval` in the background until the returned handle is aborted or
/// dropped with the runtime. Errors are logged and retried at the next tick.
pub fn spawn_retention<DB: dtx_sql::Backend>(
    pool: dtx_sql::sqlx::Pool<DB>,
    retention: std::time::Duration,
    batch: u32,
    interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            match purge::<DB>(&pool, retention, batch).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "barrier retention purged rows"),
                Err(e) => {
                    tracing::warn!(error = %e, "barrier retention failed; retrying next tick")
                }
            }
        }
    })
}
