//! Durable state behind a small trait, one implementation for all three databases.
//!
//! Every state change is one typed write ([`BeginTcc`], [`RegisterBranch`], [`Decide`],
//! [`SubmitSaga`], [`Progress`]): a conditional statement set (expected status, fencing token)
//! that either applies completely or answers, in its own outcome type, why not. Writes go through one
//! group-commit path per pool (`writer`): concurrent writes of many transactions are applied
//! in one database transaction and each caller is answered when that commit is durable. With a
//! batch size of one this is plain per-call commits; raising it is configuration.

mod alerts;
mod clock;
mod rows;
mod sql;
mod writer;
mod writes;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::domain::alert::Alert;
use crate::domain::history::Entry;
use crate::domain::{BranchRow, Decision, Fence, GlobalRow, Kind, TxRecord, TxStatus, Xid};
use crate::error::{Error, Result};

pub use clock::DbClock;
pub use sql::SqlStore;

/// Creates a TCC transaction in TRYING unless the xid exists.
#[derive(Debug, Clone)]
pub struct BeginTcc {
    pub xid: Xid,
    pub timeout_ms: i64,
    pub deadline_ms: i64,
}

/// Creates a saga or a prepared message (its whole definition in one row) unless the xid
/// exists.
#[derive(Debug, Clone)]
pub struct SubmitSaga {
    pub global: GlobalRow,
}

/// Adds a branch to a TRYING transaction before its deadline, within the branch limit; with
/// `begin` (timeout, deadline) it first begins the transaction if it does not exist.
#[derive(Debug, Clone)]
pub struct RegisterBranch {
    pub xid: Xid,
    pub branch: BranchRow,
    pub max_branches: i64,
    pub begin: Option<(i64, i64)>,
}

/// A TCC transaction TRYING (Commit only before its deadline) or a message PREPARED ->
/// COMMITTING/ROLLING_BACK, claiming it for `owner` with a fresh fencing token.
#[derive(Debug, Clone)]
pub struct Decide {
    pub xid: Xid,
    /// Applies only to a transaction of this kind.
    pub kind: Kind,
    pub decision: Decision,
    pub owner: String,
    pub fence: Fence,
    pub due_ms: i64,
    /// Recorded with the decision (who decided and why).
    pub history: Vec<Entry>,
}

/// A fenced change of a transaction's status, ownership and branch progress by its driver.
#[derive(Debug, Clone)]
pub struct Progress {
    pub xid: Xid,
    /// The fencing token the writer holds; the write applies only if it is still current.
    pub fence: Fence,
    /// A fresh token to install (a claim), or `None` to keep `fence`.
    pub new_fence: Option<Fence>,
    pub from: TxStatus,
    pub to: TxStatus,
    /// The decision recorded after the write: the one `to` stands for (NEEDS_ATTENTION keeps
    /// the transaction's). A write that would replace a recorded decision is `Fenced`.
    pub decision: Option<Decision>,
    /// `None` releases the transaction (for recovery to pick up at `due_ms`).
    pub owner: Option<String>,
    /// When recovery must look at it again; `None` once settled.
    pub due_ms: Option<i64>,
    /// Why the transaction is where it is (turned to compensation, parked); `None` keeps what
    /// is recorded.
    pub last_error: Option<String>,
    /// Branch states to record (inserted for saga steps seen the first time).
    pub branches: Vec<BranchRow>,
    /// History entries recorded with the change.
    pub history: Vec<Entry>,
    /// Alerts the change raises, stored in its commit (an id already stored is kept as it is).
    pub alerts: Vec<Alert>,
}

/// What [`Store::begin_tcc`] and [`Store::submit_saga`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The transaction row was created.
    Inserted,
    /// The xid already exists: this is its row (the caller decides whether that is a repeat).
    Exists(GlobalRow),
}

/// What [`Store::register_branch`] did.
#[derive(Debug, Clone, PartialEq)]
// Returned once per call, never stored: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Registered {
    /// The branch was added (`begun`: and the transaction created for it).
    Added { begun: bool },
    /// No transaction has this xid.
    Missing,
    /// The branch was not added: the transaction's current row and the branch if it exists.
    Refused {
        global: GlobalRow,
        existing: Option<BranchRow>,
    },
}

/// What [`Store::decide`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The decision is recorded: the transaction as it is now, and the branches to drive.
    Claimed {
        global: GlobalRow,
        branches: Vec<BranchRow>,
    },
    /// No transaction has this xid.
    Missing,
    /// Not of the kind, not undecided, or (TCC Commit) past the deadline: the transaction's
    /// row as it is.
    Exists(GlobalRow),
}

/// What [`Store::progress`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progressed {
    /// The change applied.
    Applied,
    /// The fencing token or expected status no longer matched: someone else owns it now.
    Fenced,
}

/// Which transactions [`Store::list`] returns, most recently changed first (by `updated_ms`,
/// then xid): the order of the `(status, updated_ms)` index the store already keeps, so
/// listing costs the write path nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Any of these; empty = every status.
    pub statuses: Vec<TxStatus>,
    pub kind: Option<Kind>,
    /// Only xids starting with this (validated against the xid charset, so it holds no `%`).
    pub xid_prefix: Option<String>,
    /// Only this tenant's transactions (the prefix applies to the xids as the tenant knows
    /// them); `None` lists every tenant's.
    pub tenant: Option<String>,
    /// Inclusive bounds on `created_ms` and `updated_ms`.
    pub created: (Option<i64>, Option<i64>),
    pub updated: (Option<i64>, Option<i64>),
    /// Strictly after this `(updated_ms, xid)` in the listing order (the previous page's last).
    pub after: Option<(i64, String)>,
    pub limit: i64,
}

/// Counts for operators: every (kind, status) present, and the oldest open transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub counts: Vec<(Kind, TxStatus, u64)>,
    /// `created_ms` of the oldest transaction that is not terminal.
    pub oldest_open_created_ms: Option<i64>,
}

/// Counters of the store's own work, for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Database transactions committed by writes and claims.
    pub commits: AtomicU64,
    /// Writes applied (each belongs to one commit).
    pub writes: AtomicU64,
    /// Writes that failed, by operation (in the order of [`WRITE_OPERATIONS`]).
    failed: [AtomicU64; WRITE_OPERATIONS.len()],
}

/// The write operations, as named in the `operation` label of `dtx_store_errors_total`.
pub const WRITE_OPERATIONS: [&str; 5] = [
    "begin_tcc",
    "submit_saga",
    "register_branch",
    "decide",
    "progress",
];

impl StoreStats {
    /// Counts a failed write of operation `index` in [`WRITE_OPERATIONS`].
    pub(crate) fn failed(&self, index: usize) {
        self.failed[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed writes by operation.
    pub fn failed_writes(&self) -> Vec<(&'static str, u64)> {
        WRITE_OPERATIONS
            .iter()
            .zip(&self.failed)
            .map(|(op, n)| (*op, n.load(Ordering::Relaxed)))
            .collect()
    }

    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.commits.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
        )
    }
}

/// The coordinator's durable state.
pub trait Store: Send + Sync + 'static {
    // Writes: each goes through the group-commit path and returns once it is durable.

    fn begin_tcc(&self, write: BeginTcc) -> BoxFuture<'_, Result<Created>>;

    fn submit_saga(&self, write: SubmitSaga) -> BoxFuture<'_, Result<Created>>;

    fn register_branch(&self, write: RegisterBranch) -> BoxFuture<'_, Result<Registered>>;

    fn decide(&self, write: Decide) -> BoxFuture<'_, Result<Decided>>;

    fn progress(&self, write: Progress) -> BoxFuture<'_, Result<Progressed>>;

    /// Reads a transaction and its branches.
    fn get<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Option<TxRecord>>>;

    /// Claims up to `limit` transactions whose `due_ms` passed (deadline of an undecided TCC
    /// transaction, expired lease, retry time) for `owner`, each with a fresh fencing token and
    /// `due_ms = now + lease`. Rows locked by another claimer are skipped.
    fn claim_due<'a>(
        &'a self,
        owner: &'a str,
        lease: Duration,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<TxRecord>>>;

    /// Deletes settled-terminal transactions last updated before `before_ms`, at most `batch`
    /// per round, until none is left. Returns how many transactions were deleted.
    fn purge_finished(&self, before_ms: i64, batch: i64) -> BoxFuture<'_, Result<u64>>;

    /// Transactions matching `query`, newest first, at most `query.limit` (without branches).
    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Vec<GlobalRow>>>;

    /// A transaction's history, oldest first.
    fn history<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Vec<Entry>>>;

    /// Counts by kind and status, and the oldest open transaction.
    fn tally(&self) -> BoxFuture<'_, Result<Tally>>;

    /// How many transactions are parked in NEEDS_ATTENTION, across every instance (the gauge
    /// operators alert on).
    fn count_parked(&self) -> BoxFuture<'_, Result<u64>>;

    /// `created_ms` of the oldest transaction not in a terminal status (one index step per
    /// open status, cheap enough for every scrape).
    fn oldest_open_created_ms(&self) -> BoxFuture<'_, Result<Option<i64>>>;

    fn stats(&self) -> &StoreStats;

    /// The database's clock: every lease, due time and deadline is read off it.
    fn clock(&self) -> &DbClock;

    /// Samples the database's time again (done at open and periodically by the engine).
    fn sync_clock(&self) -> BoxFuture<'_, Result<()>>;

    // Alerts.

    /// Open transactions (parked ones excepted: they have their own alert) created before
    /// `created_before_ms` that have no stuck alert yet, at most `limit` per status.
    fn stuck(&self, created_before_ms: i64, limit: i64) -> BoxFuture<'_, Result<Vec<GlobalRow>>>;

    /// Stores alerts due at once (an id already stored is kept); returns how many were new.
    fn add_alerts<'a>(&'a self, alerts: &'a [Alert]) -> BoxFuture<'a, Result<u64>>;

    /// Claims up to `limit` alerts due for delivery: they are not due again for `timeout`
    /// (a sender that dies mid-delivery leaves them to the next one after it).
    fn claim_alerts(&self, timeout: Duration, limit: i64) -> BoxFuture<'_, Result<Vec<Outgoing>>>;

    /// Records a claimed alert's delivery round.
    fn finish_alert<'a>(&'a self, id: &'a str, delivery: &'a Delivery)
    -> BoxFuture<'a, Result<()>>;
}

/// A claimed alert on its way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub id: String,
    /// The JSON event, as stored at creation.
    pub body: String,
    /// Delivery rounds before this one.
    pub attempts: i64,
    /// Fingerprints of the webhooks that already acknowledged it.
    pub delivered: Vec<String>,
}

/// How a delivery round of an alert ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Every webhook that acknowledged it so far (fingerprints).
    pub delivered: Vec<String>,
    /// When to try the others again; `None`: delivered everywhere.
    pub retry_at_ms: Option<i64>,
    /// Why the round did not reach every webhook.
    pub error: Option<String>,
}

/// How the store batches writes.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Most writes grouped into one database commit.
    pub max_batch: usize,
    /// Concurrent writer tasks (each holds one connection while it commits a batch).
    pub writers: usize,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_batch: 128,
            writers: 2,
            max_connections: 16,
        }
    }
}

/// Why a store could not be opened. Only start-up meets these, so they stay out of the
/// request path's [`Error`]; start-up turns them into sentences for the operator.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No store of that scheme.
    #[error("store URL {0:?} must start with sqlite://, postgres:// or mysql://")]
    Scheme(String),
    /// The database could not be reached, or refused the connection.
    #[error("{0}")]
    Connect(#[from] dtx_sql::sqlx::Error),
    /// The schema cannot be brought up to date.
    #[error("{0}")]
    Migrate(#[from] dtx_sql::sqlx::migrate::MigrateError),
    /// The first read (the database's clock) failed.
    #[error("{0}")]
    FirstRead(#[from] Error),
}

/// Opens the store a URL names (`sqlite://...`, `postgres://...`, `mysql://...`), creating
/// the schema if needed.
pub async fn open(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
    use dtx_sql::Dialect;
    match dtx_sql::dialect_of_url(url) {
        Some(Dialect::Postgres) => Ok(Arc::new(
            SqlStore::<dtx_sql::sqlx::Postgres>::open(url, options).await?,
        )),
        Some(Dialect::MySql) => Ok(Arc::new(
            SqlStore::<dtx_sql::sqlx::MySql>::open(url, options).await?,
        )),
        Some(Dialect::Sqlite) => Ok(Arc::new(
            SqlStore::<dtx_sql::sqlx::Sqlite>::open(url, options).await?,
        )),
        None => Err(OpenError::Scheme(url.to_string())),
    }
}
