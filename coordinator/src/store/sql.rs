//! The store on PostgreSQL, MySQL/MariaDB and SQLite: every statement the coordinator runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use dtx_sql::sqlx::Pool;
use dtx_sql::{Arg, Backend, Conn, Dialect, Schema, Sql, SqlRow, args, insert_ignore};
use futures::future::BoxFuture;

use super::clock::{DB_NOW_MS, DbClock};
use super::writer::Writer;
use super::{
    BeginTcc, Created, Decide, Decided, Delivery, ListQuery, Outgoing, Progress, Progressed,
    RegisterBranch, Registered, Store, StoreOptions, StoreStats, SubmitSaga, Tally,
};
use crate::domain::alert::Alert;
use crate::domain::history::{Entry, Event};
use crate::domain::record::{decode_headers, encode_headers};
use crate::domain::{BranchRow, BranchState, Decision, GlobalRow, Kind, TxRecord, TxStatus};
use crate::error::{Error, Result};

const SELECT_GLOBAL: &str = "SELECT xid, kind, status, decision, timeout_ms, deadline_ms, spec, \
     branch_count, owner, fence, due_ms, last_error, created_ms, updated_ms \
     FROM dtx_global WHERE xid = ?";

/// Columns of [`SELECT_GLOBAL`]; [`SELECT_TCC_RECORD`]'s branch columns follow them.
const GLOBAL_COLUMNS: usize = 14;

/// [`SELECT_GLOBAL`]'s and [`SELECT_BRANCHES`]' columns, one row per branch.
const SELECT_TCC_RECORD: &str = "SELECT g.xid, g.kind, g.status, g.decision, g.timeout_ms, \
     g.deadline_ms, g.spec, g.branch_count, g.owner, g.fence, g.due_ms, g.last_error, \
     g.created_ms, g.updated_ms, b.branch_id, b.seq, b.target, b.handler, b.payload, b.headers, \
     b.call_timeout_ms, b.status, b.attempts, b.last_error, b.result \
     FROM dtx_global g LEFT JOIN dtx_branch b ON b.xid = g.xid WHERE g.xid = ? ORDER BY b.seq";

const SELECT_BRANCHES: &str = "SELECT branch_id, seq, target, handler, payload, headers, \
     call_timeout_ms, status, attempts, last_error, result \
     FROM dtx_branch WHERE xid = ? ORDER BY seq";

const INSERT_GLOBAL: Sql = insert_ignore!(
    "dtx_global (xid, kind, status, decision, timeout_ms, deadline_ms, spec, branch_count, \
     owner, fence, due_ms, last_error, created_ms, updated_ms) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)"
);

/// Locks the TRYING row and counts the new branch in one statement: a concurrent decision
/// waits for it (and then sees the branch), or it waits for the decision (and then matches
/// nothing), so no branch is ever added behind a decision's back.
const COUNT_BRANCH: &str = "UPDATE dtx_global SET branch_count = branch_count + 1 \
     WHERE xid = ? AND kind = 'tcc' AND status = 'TRYING' AND deadline_ms > ? AND branch_count < ?";

const UNCOUNT_BRANCH: &str = "UPDATE dtx_global SET branch_count = branch_count - 1 WHERE xid = ?";

const INSERT_BRANCH: Sql = insert_ignore!(
    "dtx_branch (xid, branch_id, seq, target, handler, payload, headers, call_timeout_ms, \
     status, attempts, last_error, result, updated_ms) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, NULL, NULL, ?)"
);

const SELECT_BRANCH: &str = "SELECT branch_id, seq, target, handler, payload, headers, \
     call_timeout_ms, status, attempts, last_error, result \
     FROM dtx_branch WHERE xid = ? AND branch_id = ?";

/// A TCC transaction commits only before its deadline; a prepared message whenever its
/// initiator submits it.
const DECIDE_COMMIT: &str = "UPDATE dtx_global SET status = 'COMMITTING', decision = 'commit', \
     owner = ?, fence = ?, due_ms = ?, updated_ms = ? \
     WHERE xid = ? AND kind = ? \
     AND (status = 'PREPARED' OR (status = 'TRYING' AND deadline_ms > ?))";

const DECIDE_ROLLBACK: &str = "UPDATE dtx_global SET status = 'ROLLING_BACK', \
     decision = 'rollback', owner = ?, fence = ?, due_ms = ?, updated_ms = ? \
     WHERE xid = ? AND kind = ? AND status IN ('TRYING', 'PREPARED')";

/// A driver's change: only with its fencing token, from the status it expects, and never
/// replacing a recorded decision with another.
const PROGRESS: &str = "UPDATE dtx_global SET status = ?, decision = ?, \
     owner = ?, fence = ?, due_ms = ?, last_error = COALESCE(?, last_error), updated_ms = ? \
     WHERE xid = ? AND fence = ? AND status = ? AND (decision IS NULL OR decision = ?)";

/// Rows whose recovery time passed, with their previous owner. Other claimers skip the rows
/// this one locked.
const DUE: Sql = Sql {
    postgres: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ? \
               FOR UPDATE SKIP LOCKED",
    mysql: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ? \
            FOR UPDATE SKIP LOCKED",
    // SQLite has one writer at a time: BEGIN IMMEDIATE already excludes other claimers.
    sqlite: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ?",
};

const ANY_DUE: &str = "SELECT xid FROM dtx_global WHERE due_ms <= ? LIMIT 1";

const CLAIM: &str = "UPDATE dtx_global SET owner = ?, fence = ?, due_ms = ?, updated_ms = ? \
     WHERE xid = ? AND due_ms <= ?";

const PARKED: &str = "SELECT COUNT(*) FROM dtx_global WHERE status = 'NEEDS_ATTENTION'";

const SELECT_HISTORY: &str = "SELECT at_ms, event, branch_id, status, attempt, detail, actor \
     FROM dtx_history WHERE xid = ? ORDER BY seq";

/// Columns of [`SELECT_GLOBAL`] without its `WHERE`: the start of every listing.
const LIST_GLOBAL: &str = "SELECT xid, kind, status, decision, timeout_ms, deadline_ms, NULL, \
     branch_count, owner, fence, due_ms, last_error, created_ms, updated_ms FROM dtx_global";

const TALLY: &str = "SELECT kind, status, COUNT(*) FROM dtx_global GROUP BY kind, status";

/// The oldest row of one status: one step down the (status, created_ms) index.
const OLDEST_OF_STATUS: &str = "SELECT MIN(created_ms) FROM dtx_global WHERE status = ?";

const FINISHED: &str = "SELECT xid FROM dtx_global WHERE status IN \
     ('COMMITTED', 'ROLLED_BACK', 'SUCCEEDED', 'COMPENSATED') AND updated_ms < ? LIMIT ?";

/// `created_ms` of the oldest transaction in a non-terminal status: one index step per status.
async fn oldest_open<DB: Backend>(conn: &mut DB::Conn) -> Result<Option<i64>> {
    let mut oldest: Option<i64> = None;
    for status in TxStatus::ALL.iter().filter(|s| !s.is_terminal()) {
        if let Some(row) = conn
            .fetch_optional(OLDEST_OF_STATUS, args![status.as_str()])
            .await?
            && let Some(created) = row.opt_i64(0)?
        {
            oldest = Some(oldest.map_or(created, |o| o.min(created)));
        }
    }
    Ok(oldest)
}

/// The store on database `DB`. Cheap to clone (every field is shared).
pub struct SqlStore<DB: Backend> {
    pub(super) pool: Pool<DB>,
    writer: Writer,
    pub(super) stats: Arc<StoreStats>,
    pub(super) clock: Arc<DbClock>,
}

// Not derived: a derive would require `DB: Clone`, which database marker types are not.
impl<DB: Backend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            writer: self.writer.clone(),
            stats: self.stats.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<DB: Backend> SqlStore<DB> {
    /// Connects, applies the coordinator schema, and starts the writer tasks.
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self, super::OpenError> {
        let pool = DB::connect(url, options.max_connections).await?;
        DB::migrate(&pool, Schema::Coordinator).await?;
        let stats = Arc::new(StoreStats::default());
        let clock = Arc::new(DbClock::default());
        let writer = Writer::start::<DB>(pool.clone(), options, stats.clone(), clock.clone());
        let store = SqlStore {
            pool,
            writer,
            stats,
            clock,
        };
        store.sample_clock().await?;
        Ok(store)
    }

    /// Reads the database's time and records it on the clock.
    /// Samples the database's clock three times on one connection and keeps the sample with
    /// the shortest round trip: its midpoint error is smallest, and one sample delayed by a
    /// busy host cannot shift every lease and deadline by half its delay.
    async fn sample_clock(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut best: Option<(i64, Instant, Instant, i64)> = None;
        for _ in 0..3 {
            let sent = Instant::now();
            let row = conn
                .fetch_optional(DB_NOW_MS.pick(<DB::Conn as Conn>::DIALECT), &[])
                .await?
                .ok_or_else(|| corrupt("database time", "no row"))?;
            let received = Instant::now();
            if best.is_none_or(|(_, s, r, _)| received - sent < r - s) {
                best = Some((row.i64(0)?, sent, received, dtx_sql::now_ms()));
            }
        }
        if let Some((db_ms, sent, received, wall_ms)) = best {
            self.clock.record(db_ms, sent, received, wall_ms);
        }
        Ok(())
    }

    /// Runs `work` with a clone of this store on a task of its own: a request that goes away
    /// mid-query must not hand its connection back to the pool out of step (see
    /// `dtx_sql::detached`). Writes need no such care: the writer tasks run them.
    fn detach<T, F, Fut>(&self, work: F) -> BoxFuture<'static, Result<T>>
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        Box::pin(dtx_sql::detached(work(self.clone())))
    }

    async fn read(&self, xid: &str) -> Result<Option<TxRecord>> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let Some(global) = read_global(conn, xid).await? else {
            return Ok(None);
        };
        let branches = read_branches(conn, xid).await?;
        Ok(Some(TxRecord { global, branches }))
    }

    async fn claim(&self, owner: &str, lease: Duration, limit: i64) -> Result<Vec<TxRecord>> {
        let now = self.clock.now_ms();
        // A plain read first: an idle coordinator polls without opening write transactions.
        {
            let mut conn = self.pool.acquire().await?;
            if DB::pooled(&mut conn)
                .fetch_optional(ANY_DUE, args![now])
                .await?
                .is_none()
            {
                return Ok(Vec::new());
            }
        }
        let due_ms = now + lease.as_millis() as i64;
        let mut tx = DB::begin(&self.pool).await?;
        let conn = DB::conn(&mut tx);
        let rows = conn
            .fetch_all(DUE.pick(<DB::Conn as Conn>::DIALECT), args![now, limit])
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut history = Vec::with_capacity(rows.len());
        for row in rows {
            let xid = row.text(0)?;
            let fence = new_fence();
            let n = conn
                .execute(CLAIM, args![owner, fence, due_ms, now, xid.as_str(), now])
                .await?;
            if n == 1 {
                let detail = match row.opt_text(1)? {
                    Some(previous) => format!("lease of {previous} expired"),
                    None => "due".to_string(),
                };
                let entry = Entry::tx(now, Event::Takeover, None)
                    .detail(detail)
                    .by(owner);
                history.push((xid.clone(), entry));
                claimed.push(xid);
            }
        }
        insert_history(conn, &history, now).await?;
        tx.commit().await?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let mut records = Vec::with_capacity(claimed.len());
        for xid in claimed {
            if let Some(record) = self.read(&xid).await? {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// One index walk per status asked for (or one over all), each bounded by the page size,
    /// merged newest first.
    async fn list_rows(&self, q: &ListQuery) -> Result<Vec<GlobalRow>> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        // Every status when none is asked for: the one (status, updated_ms) index serves all.
        let mut statuses = match q.statuses.is_empty() {
            true => TxStatus::ALL.to_vec(),
            false => q.statuses.clone(),
        };
        statuses.sort_by_key(|s| s.as_str());
        statuses.dedup();
        let patterns = list_patterns(q);
        let mut rows = Vec::new();
        for status in statuses {
            let (sql, list) = list_statement(<DB::Conn as Conn>::DIALECT, q, status, &patterns);
            for row in conn.fetch_all_dynamic(sql, &list).await? {
                rows.push(global_from_row(&row)?);
            }
        }
        rows.sort_by(|a, b| (b.updated_ms, &b.xid).cmp(&(a.updated_ms, &a.xid)));
        rows.truncate(q.limit.max(0) as usize);
        Ok(rows)
    }

    async fn tally_rows(&self) -> Result<Tally> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut tally = Tally::default();
        for row in conn.fetch_all(TALLY, &[]).await? {
            let (kind, status) = (row.text(0)?, row.text(1)?);
            tally.counts.push((
                Kind::parse(&kind).ok_or_else(|| corrupt("kind", &kind))?,
                TxStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
                row.i64(2)?.max(0) as u64,
            ));
        }
        tally.oldest_open_created_ms = oldest_open::<DB>(conn).await?;
        Ok(tally)
    }

    async fn purge(&self, before_ms: i64, batch: i64) -> Result<u64> {
        let purged = dtx_sql::purge_batched(&self.pool, batch, |mut tx, limit| async move {
            let conn = DB::conn(&mut tx);
            let xids: Vec<String> = conn
                .fetch_all(FINISHED, args![before_ms, limit])
                .await?
                .iter()
                .map(|r| r.text(0))
                .collect::<std::result::Result<_, _>>()?;
            if !xids.is_empty() {
                let marks = vec!["?"; xids.len()].join(", ");
                let list: Vec<Arg<'_>> = xids.iter().map(Arg::from).collect();
                for table in ["dtx_history", "dtx_alert", "dtx_branch"] {
                    conn.execute_dynamic(
                        format!("DELETE FROM {table} WHERE xid IN ({marks})"),
                        &list,
                    )
                    .await?;
                }
                conn.execute_dynamic(
                    format!("DELETE FROM dtx_global WHERE xid IN ({marks})"),
                    &list,
                )
                .await?;
            }
            Ok::<_, dtx_sql::sqlx::Error>((tx, xids.len() as u64))
        })
        .await?;
        Ok(purged)
    }
}

impl<DB: Backend> Store for SqlStore<DB> {
    fn begin_tcc(&self, write: BeginTcc) -> BoxFuture<'_, Result<Created>> {
        Box::pin(self.writer.submit(write))
    }

    fn submit_saga(&self, write: SubmitSaga) -> BoxFuture<'_, Result<Created>> {
        Box::pin(self.writer.submit(write))
    }

    fn register_branch(&self, write: RegisterBranch) -> BoxFuture<'_, Result<Registered>> {
        Box::pin(self.writer.submit(write))
    }

    fn decide(&self, write: Decide) -> BoxFuture<'_, Result<Decided>> {
        Box::pin(self.writer.submit(write))
    }

    fn progress(&self, write: Progress) -> BoxFuture<'_, Result<Progressed>> {
        Box::pin(self.writer.submit(write))
    }

    fn get<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Option<TxRecord>>> {
        let xid = xid.to_owned();
        self.detach(move |store| async move { store.read(&xid).await })
    }

    fn claim_due<'a>(
        &'a self,
        owner: &'a str,
        lease: Duration,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<TxRecord>>> {
        let owner = owner.to_owned();
        self.detach(move |store| async move { store.claim(&owner, lease, limit).await })
    }

    fn purge_finished(&self, before_ms: i64, batch: i64) -> BoxFuture<'_, Result<u64>> {
        self.detach(move |store| async move { store.purge(before_ms, batch.max(1)).await })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Vec<GlobalRow>>> {
        let query = query.clone();
        self.detach(move |store| async move { store.list_rows(&query).await })
    }

    fn history<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Vec<Entry>>> {
        let xid = xid.to_owned();
        self.detach(move |store| async move {
            let mut conn = store.pool.acquire().await?;
            let rows = DB::pooled(&mut conn)
                .fetch_all(SELECT_HISTORY, args![xid.as_str()])
                .await?;
            rows.iter().map(entry_from_row).collect()
        })
    }

    fn tally(&self) -> BoxFuture<'_, Result<Tally>> {
        self.detach(|store| async move { store.tally_rows().await })
    }

    fn oldest_open_created_ms(&self) -> BoxFuture<'_, Result<Option<i64>>> {
        self.detach(|store| async move {
            let mut conn = store.pool.acquire().await?;
            oldest_open::<DB>(DB::pooled(&mut conn)).await
        })
    }

    fn count_parked(&self) -> BoxFuture<'_, Result<u64>> {
        self.detach(|store| async move {
            let mut conn = store.pool.acquire().await?;
            let row = DB::pooled(&mut conn).fetch_optional(PARKED, &[]).await?;
            Ok(row.map_or(Ok(0), |r| r.i64(0))?.max(0) as u64)
        })
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }

    fn clock(&self) -> &DbClock {
        &self.clock
    }

    fn sync_clock(&self) -> BoxFuture<'_, Result<()>> {
        self.detach(|store| async move { store.sample_clock().await })
    }

    fn stuck(&self, created_before_ms: i64, limit: i64) -> BoxFuture<'_, Result<Vec<GlobalRow>>> {
        self.detach(move |store| async move { store.stuck_rows(created_before_ms, limit).await })
    }

    fn add_alerts<'a>(&'a self, alerts: &'a [Alert]) -> BoxFuture<'a, Result<u64>> {
        let alerts = alerts.to_vec();
        self.detach(move |store| async move { store.add(&alerts).await })
    }

    fn claim_alerts(&self, timeout: Duration, limit: i64) -> BoxFuture<'_, Result<Vec<Outgoing>>> {
        self.detach(move |store| async move { store.claim_outgoing(timeout, limit).await })
    }

    fn finish_alert<'a>(
        &'a self,
        id: &'a str,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<()>> {
        let (id, delivery) = (id.to_owned(), delivery.clone());
        self.detach(move |store| async move { store.finish(&id, &delivery).await })
    }
}

/// A fresh fencing token.
pub(crate) fn new_fence() -> i64 {
    rand::random::<i64>() & i64::MAX
}

/// History entries of a batch, each with its xid, inserted before the batch commits.
pub(super) type History = Vec<(String, Entry)>;

/// What the writes of one batch share: the database's time, and the history entries and
/// alerts of what they changed.
pub(super) struct Batch {
    pub now: i64,
    pub history: History,
    pub alerts: Vec<Alert>,
}

impl Batch {
    pub(super) fn new(now: i64) -> Batch {
        Batch {
            now,
            history: History::new(),
            alerts: Vec::new(),
        }
    }

    fn push(&mut self, xid: &str, entry: Entry) {
        self.history.push((xid.to_string(), entry));
    }

    fn record(&mut self, xid: &str, entries: &[Entry]) {
        for entry in entries {
            self.push(xid, entry.clone());
        }
    }
}

/// A write the writer applies inside a batch's open transaction.
pub(super) trait Apply: Send + 'static {
    type Outcome: Send + 'static;

    /// The transaction it changes (batches apply writes in xid order).
    fn xid(&self) -> &str;

    fn apply<C: Conn>(
        &self,
        conn: &mut C,
        batch: &mut Batch,
    ) -> impl Future<Output = Result<Self::Outcome>> + Send;
}

impl Apply for BeginTcc {
    type Outcome = Created;

    fn xid(&self) -> &str {
        &self.xid
    }

    async fn apply<C: Conn>(&self, conn: &mut C, batch: &mut Batch) -> Result<Created> {
        let now = batch.now;
        let inserted =
            begin_tcc(conn, &self.xid, self.timeout_ms, self.deadline_ms, now, 0).await?;
        created_unless_exists(conn, &self.xid, inserted).await
    }
}

impl Apply for SubmitSaga {
    type Outcome = Created;

    fn xid(&self) -> &str {
        &self.global.xid
    }

    async fn apply<C: Conn>(&self, conn: &mut C, batch: &mut Batch) -> Result<Created> {
        let (g, now) = (&self.global, batch.now);
        let inserted = conn
            .execute(
                INSERT_GLOBAL.pick(C::DIALECT),
                args![
                    g.xid.as_str(),
                    g.kind.as_str(),
                    g.status.as_str(),
                    g.decision.map(Decision::as_str),
                    g.timeout_ms,
                    g.deadline_ms,
                    g.spec.as_ref(),
                    0i64,
                    g.owner.as_ref(),
                    g.fence,
                    g.due_ms,
                    now,
                    now
                ],
            )
            .await?;
        created_unless_exists(conn, &g.xid, inserted).await
    }
}

impl Apply for RegisterBranch {
    type Outcome = Registered;

    fn xid(&self) -> &str {
        &self.xid
    }

    async fn apply<C: Conn>(&self, conn: &mut C, batch: &mut Batch) -> Result<Registered> {
        let (xid, b, now) = (self.xid.as_str(), &self.branch, batch.now);
        // A branch that may begin its transaction is usually the first: insert the
        // transaction with this branch already counted (one statement, not three); if it
        // exists, count the branch under the row lock as any other.
        let begun = match self.begin {
            Some((timeout_ms, deadline_ms)) => {
                begin_tcc(conn, xid, timeout_ms, deadline_ms, now, 1).await? == 1
            }
            None => false,
        };
        let counted = if begun {
            1
        } else {
            conn.execute(COUNT_BRANCH, args![xid, now, self.max_branches])
                .await?
        };
        if counted == 1 {
            let headers = encode_headers(&b.headers);
            let inserted = conn
                .execute(
                    INSERT_BRANCH.pick(C::DIALECT),
                    args![
                        xid,
                        b.branch_id.as_str(),
                        b.seq,
                        b.target.as_str(),
                        b.handler.as_str(),
                        &b.payload,
                        &headers,
                        b.call_timeout_ms,
                        now
                    ],
                )
                .await?;
            if inserted == 1 {
                return Ok(Registered::Added { begun });
            }
            conn.execute(UNCOUNT_BRANCH, args![xid]).await?;
        }
        let Some(global) = read_global(conn, xid).await? else {
            return Ok(Registered::Missing);
        };
        let existing = read_branch(conn, xid, &b.branch_id).await?;
        Ok(Registered::Refused { global, existing })
    }
}

impl Apply for Decide {
    type Outcome = Decided;

    fn xid(&self) -> &str {
        &self.xid
    }

    async fn apply<C: Conn>(&self, conn: &mut C, batch: &mut Batch) -> Result<Decided> {
        let (xid, owner, now) = (self.xid.as_str(), self.owner.as_str(), batch.now);
        let kind = self.kind.as_str();
        let n = match self.decision {
            // Commit only before the deadline; Rollback whatever the deadline.
            Decision::Commit => {
                conn.execute(
                    DECIDE_COMMIT,
                    args![owner, self.fence, self.due_ms, now, xid, kind, now],
                )
                .await?
            }
            _ => {
                conn.execute(
                    DECIDE_ROLLBACK,
                    args![owner, self.fence, self.due_ms, now, xid, kind],
                )
                .await?
            }
        };
        if n == 1 {
            let TxRecord { global, branches } = read_tcc_record(conn, xid)
                .await?
                .ok_or_else(|| Error::Corrupt(format!("{xid} vanished while deciding")))?;
            batch.record(xid, &self.history);
            return Ok(Decided::Claimed { global, branches });
        }
        Ok(match read_global(conn, xid).await? {
            Some(row) => Decided::Exists(row),
            None => Decided::Missing,
        })
    }
}

impl Apply for Progress {
    type Outcome = Progressed;

    fn xid(&self) -> &str {
        &self.xid
    }

    async fn apply<C: Conn>(&self, conn: &mut C, batch: &mut Batch) -> Result<Progressed> {
        let progressed = progress(conn, self, batch.now).await?;
        if progressed == Progressed::Applied {
            batch.record(&self.xid, &self.history);
            batch.alerts.extend_from_slice(&self.alerts);
        }
        Ok(progressed)
    }
}

/// Inserts a TRYING TCC transaction with `branch_count` branches counted unless the xid
/// exists; 1 if it did.
async fn begin_tcc<C: Conn>(
    conn: &mut C,
    xid: &str,
    timeout_ms: i64,
    deadline_ms: i64,
    now: i64,
    branch_count: i64,
) -> Result<u64> {
    Ok(conn
        .execute(
            INSERT_GLOBAL.pick(C::DIALECT),
            args![
                xid,
                Kind::Tcc.as_str(),
                TxStatus::Trying.as_str(),
                None::<&str>,
                timeout_ms,
                deadline_ms,
                None::<&[u8]>,
                branch_count,
                None::<&str>,
                0i64,
                deadline_ms,
                now,
                now
            ],
        )
        .await?)
}

/// `Inserted`, or the row that was there before the insert was ignored. (Creations and
/// registrations are not history rows: the history derives them from the rows themselves, see
/// [`crate::domain::history::derived`].)
async fn created_unless_exists<C: Conn>(conn: &mut C, xid: &str, inserted: u64) -> Result<Created> {
    if inserted == 1 {
        return Ok(Created::Inserted);
    }
    read_global(conn, xid)
        .await?
        .map(Created::Exists)
        .ok_or_else(|| Error::Corrupt(format!("{xid} was neither inserted nor found")))
}

async fn progress<C: Conn>(conn: &mut C, p: &Progress, now: i64) -> Result<Progressed> {
    if !TxStatus::transition_allowed(p.from, p.to, p.decision) {
        return Err(Error::Corrupt(format!(
            "refusing to move {} from {} to {} with decision {:?}",
            p.xid, p.from, p.to, p.decision
        )));
    }
    let n = conn
        .execute(
            PROGRESS,
            args![
                p.to.as_str(),
                p.decision.map(Decision::as_str),
                p.owner.as_ref(),
                p.new_fence.unwrap_or(p.fence),
                p.due_ms,
                p.last_error.as_ref(),
                now,
                p.xid.as_str(),
                p.fence,
                p.from.as_str(),
                p.decision.map(Decision::as_str)
            ],
        )
        .await?;
    if n != 1 {
        return Ok(Progressed::Fenced);
    }
    if !p.branches.is_empty() {
        upsert_branches(conn, &p.xid, &p.branches, now).await?;
    }
    Ok(Progressed::Applied)
}

/// Records branch progress in one statement: inserts saga steps seen the first time, updates
/// state, attempts, last error and result of existing rows.
async fn upsert_branches<C: Conn>(
    conn: &mut C,
    xid: &str,
    branches: &[BranchRow],
    now: i64,
) -> Result<()> {
    let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let rows = vec![row; branches.len()].join(", ");
    let conflict = match C::DIALECT {
        Dialect::MySql => {
            "ON DUPLICATE KEY UPDATE status = VALUES(status), attempts = VALUES(attempts), \
             last_error = VALUES(last_error), result = VALUES(result), updated_ms = VALUES(updated_ms)"
        }
        Dialect::Postgres | Dialect::Sqlite => {
            "ON CONFLICT (xid, branch_id) DO UPDATE SET status = excluded.status, \
             attempts = excluded.attempts, last_error = excluded.last_error, \
             result = excluded.result, updated_ms = excluded.updated_ms"
        }
    };
    let sql = format!(
        "INSERT INTO dtx_branch (xid, branch_id, seq, target, handler, status, attempts, \
         last_error, result, updated_ms) VALUES {rows} {conflict}"
    );
    let mut list: Vec<Arg<'_>> = Vec::with_capacity(branches.len() * 10);
    for b in branches {
        list.extend_from_slice(args![
            xid,
            b.branch_id.as_str(),
            b.seq,
            b.target.as_str(),
            b.handler.as_str(),
            b.state.as_str(),
            b.attempts,
            b.last_error.as_ref(),
            b.result.as_ref(),
            now
        ]);
    }
    conn.execute_dynamic(sql, &list).await?;
    Ok(())
}

/// The listing statement for one status (or all), keyset-paginated newest first. Only
/// placeholders go into the text; xids compare bytewise in every dialect (PostgreSQL is told
/// so), matching the merge in Rust.
fn list_statement<'a>(
    dialect: Dialect,
    q: &'a ListQuery,
    status: TxStatus,
    patterns: &'a [(&'static str, String)],
) -> (String, Vec<Arg<'a>>) {
    let xid = match dialect {
        Dialect::Postgres => "xid COLLATE \"C\"",
        Dialect::MySql | Dialect::Sqlite => "xid",
    };
    let mut filters: Vec<String> = Vec::new();
    let mut list: Vec<Arg<'a>> = Vec::new();
    let mut filter = |sql: String, args: &[Arg<'a>]| {
        filters.push(sql);
        list.extend_from_slice(args);
    };
    filter("status = ?".into(), args![status.as_str()]);
    if let Some(kind) = q.kind {
        filter("kind = ?".into(), args![kind.as_str()]);
    }
    for (like, pattern) in patterns {
        filter(
            format!("{xid} {like} ? ESCAPE '!'"),
            args![pattern.as_str()],
        );
    }
    for (column, (from, to)) in [("created_ms", q.created), ("updated_ms", q.updated)] {
        if let Some(from) = from {
            filter(format!("{column} >= ?"), args![from]);
        }
        if let Some(to) = to {
            filter(format!("{column} <= ?"), args![to]);
        }
    }
    if let Some((updated, after)) = &q.after {
        filter(
            format!("updated_ms <= ? AND (updated_ms < ? OR {xid} < ?)"),
            args![*updated, *updated, after.as_str()],
        );
    }
    let filters = format!(" WHERE {}", filters.join(" AND "));
    list.push(Arg::from(q.limit.max(0)));
    let sql = format!("{LIST_GLOBAL}{filters} ORDER BY updated_ms DESC, {xid} DESC LIMIT ?");
    (sql, list)
}

/// The `LIKE` and `NOT LIKE` patterns of a listing's tenant and xid prefix, `_` escaped with
/// `!` (ids hold no `%` or `!`): a tenant's rows are `tenant/xid`, the default tenant's hold no
/// `/`.
fn list_patterns(q: &ListQuery) -> Vec<(&'static str, String)> {
    let escape = |s: &str| s.replace('_', "!_");
    let prefix = q.xid_prefix.as_deref().map(escape);
    match q.tenant.as_deref() {
        None => prefix
            .map(|p| ("LIKE", format!("{p}%")))
            .into_iter()
            .collect(),
        Some(dtx_proto::limits::DEFAULT_TENANT) => {
            let mut patterns = vec![("NOT LIKE", "%/%".to_string())];
            patterns.extend(prefix.map(|p| ("LIKE", format!("{p}%"))));
            patterns
        }
        Some(tenant) => vec![(
            "LIKE",
            format!("{}/{}%", escape(tenant), prefix.unwrap_or_default()),
        )],
    }
}

/// The next history sequence numbers for `n` entries committed at `now`: the database time
/// x 1000, strictly increasing within this process, so a transaction's entries sort in the
/// order they were written.
fn history_seqs(now: i64, n: usize) -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let n = n as i64;
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(last.max(now.saturating_mul(1000) - 1) + n)
        })
        .unwrap_or_else(|last| last);
    previous.max(now.saturating_mul(1000) - 1) + 1
}

/// Inserts a batch's history entries, a few hundred rows per statement.
pub(super) async fn insert_history<C: Conn>(
    conn: &mut C,
    history: &History,
    now: i64,
) -> Result<()> {
    const COLUMNS: usize = 9;
    let mut seq = history_seqs(now, history.len());
    for chunk in history.chunks(256) {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO dtx_history (seq, xid, at_ms, event, branch_id, status, attempt, \
             detail, actor) VALUES {rows}"
        );
        let mut list: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() * COLUMNS);
        for (xid, e) in chunk {
            list.push(Arg::from(seq));
            seq += 1;
            list.extend_from_slice(args![
                xid.as_str(),
                e.at_ms,
                e.event.as_str(),
                e.branch_id.as_ref(),
                e.status,
                e.attempt,
                e.detail.as_ref(),
                e.actor.as_ref()
            ]);
        }
        conn.execute_dynamic(sql, &list).await?;
    }
    Ok(())
}

fn entry_from_row<R: SqlRow>(r: &R) -> Result<Entry> {
    let event = r.text(1)?;
    let status = r.opt_text(3)?;
    Ok(Entry {
        at_ms: r.i64(0)?,
        event: Event::parse(&event).ok_or_else(|| corrupt("history event", &event))?,
        branch_id: r.opt_text(2)?,
        status: match status {
            Some(s) => Some(
                TxStatus::parse(&s)
                    .map(TxStatus::as_str)
                    .or_else(|| BranchState::parse(&s).map(BranchState::as_str))
                    .ok_or_else(|| corrupt("history status", &s))?,
            ),
            None => None,
        },
        attempt: r.i64(4)?,
        detail: r.opt_text(5)?,
        actor: r.opt_text(6)?,
    })
}

fn corrupt(what: &str, value: &str) -> Error {
    Error::Corrupt(format!("unknown {what} {value:?}"))
}

async fn read_global<C: Conn>(conn: &mut C, xid: &str) -> Result<Option<GlobalRow>> {
    match conn.fetch_optional(SELECT_GLOBAL, args![xid]).await? {
        Some(r) => Ok(Some(global_from_row(&r)?)),
        None => Ok(None),
    }
}

/// A TCC transaction and its branches in one statement (a TCC row has no `spec` blob to
/// repeat on every branch row).
async fn read_tcc_record<C: Conn>(conn: &mut C, xid: &str) -> Result<Option<TxRecord>> {
    let rows = conn.fetch_all(SELECT_TCC_RECORD, args![xid]).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let global = global_from_row(first)?;
    let mut branches = Vec::with_capacity(rows.len());
    for row in rows {
        let branch = Columns(row, GLOBAL_COLUMNS);
        // The LEFT JOIN's one row of a transaction without branches has no branch id.
        if branch.opt_text(0)?.is_some() {
            branches.push(branch_from_row(&branch)?);
        }
    }
    Ok(Some(TxRecord { global, branches }))
}

/// A row's columns from `.1` on, as a row of their own.
struct Columns<R>(R, usize);

impl<R: SqlRow> SqlRow for Columns<R> {
    fn i64(&self, idx: usize) -> Result<i64, dtx_sql::sqlx::Error> {
        self.0.i64(self.1 + idx)
    }
    fn opt_i64(&self, idx: usize) -> Result<Option<i64>, dtx_sql::sqlx::Error> {
        self.0.opt_i64(self.1 + idx)
    }
    fn text(&self, idx: usize) -> Result<String, dtx_sql::sqlx::Error> {
        self.0.text(self.1 + idx)
    }
    fn opt_text(&self, idx: usize) -> Result<Option<String>, dtx_sql::sqlx::Error> {
        self.0.opt_text(self.1 + idx)
    }
    fn bytes(&self, idx: usize) -> Result<Vec<u8>, dtx_sql::sqlx::Error> {
        self.0.bytes(self.1 + idx)
    }
    fn opt_bytes(&self, idx: usize) -> Result<Option<Vec<u8>>, dtx_sql::sqlx::Error> {
        self.0.opt_bytes(self.1 + idx)
    }
}

pub(super) fn global_from_row<R: SqlRow>(r: &R) -> Result<GlobalRow> {
    let kind = r.text(1)?;
    let status = r.text(2)?;
    let decision = r.opt_text(3)?;
    Ok(GlobalRow {
        xid: r.text(0)?,
        kind: Kind::parse(&kind).ok_or_else(|| corrupt("kind", &kind))?,
        status: TxStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        decision: match decision {
            Some(d) => Some(Decision::parse(&d).ok_or_else(|| corrupt("decision", &d))?),
            None => None,
        },
        timeout_ms: r.i64(4)?,
        deadline_ms: r.i64(5)?,
        spec: r.opt_bytes(6)?,
        branch_count: r.i64(7)?,
        owner: r.opt_text(8)?,
        fence: r.i64(9)?,
        due_ms: r.opt_i64(10)?,
        last_error: r.opt_text(11)?,
        created_ms: r.i64(12)?,
        updated_ms: r.i64(13)?,
    })
}

fn branch_from_row<R: SqlRow>(r: &R) -> Result<BranchRow> {
    let state = r.text(7)?;
    Ok(BranchRow {
        branch_id: r.text(0)?,
        seq: r.i64(1)?,
        target: r.text(2)?,
        handler: r.text(3)?,
        payload: r.opt_bytes(4)?.unwrap_or_default(),
        headers: decode_headers(&r.opt_bytes(5)?.unwrap_or_default()),
        call_timeout_ms: r.i64(6)?,
        state: BranchState::parse(&state).ok_or_else(|| corrupt("branch state", &state))?,
        attempts: r.i64(8)?,
        last_error: r.opt_text(9)?,
        result: r.opt_bytes(10)?,
    })
}

async fn read_branches<C: Conn>(conn: &mut C, xid: &str) -> Result<Vec<BranchRow>> {
    conn.fetch_all(SELECT_BRANCHES, args![xid])
        .await?
        .iter()
        .map(branch_from_row)
        .collect()
}

async fn read_branch<C: Conn>(
    conn: &mut C,
    xid: &str,
    branch_id: &str,
) -> Result<Option<BranchRow>> {
    match conn
        .fetch_optional(SELECT_BRANCH, args![xid, branch_id])
        .await?
    {
        Some(r) => Ok(Some(branch_from_row(&r)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing's tenant and prefix become LIKE patterns in which `_` is a character, not a
    /// wildcard: tenant `a_c` must not list tenant `abc`'s transactions, and the default
    /// tenant lists no scoped key even under a prefix the key starts with.
    #[test]
    fn listing_patterns_keep_tenants_apart() {
        let q = |tenant: Option<&str>, prefix: Option<&str>| ListQuery {
            tenant: tenant.map(String::from),
            xid_prefix: prefix.map(String::from),
            ..ListQuery::default()
        };
        let patterns = |tenant, prefix| {
            list_patterns(&q(tenant, prefix))
                .into_iter()
                .map(|(like, p)| format!("{like} {p}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(patterns(Some("a_c"), Some("o_1")), ["LIKE a!_c/o!_1%"]);
        assert_eq!(patterns(Some("acme"), None), ["LIKE acme/%"]);
        assert_eq!(
            patterns(Some(dtx_proto::limits::DEFAULT_TENANT), Some("a")),
            ["NOT LIKE %/%", "LIKE a%"]
        );
        assert_eq!(patterns(None, Some("x_")), ["LIKE x!_%"]);
        assert!(patterns(None, None).is_empty());
    }

    /// Every status, kind and decision spelled inside the store's SQL is one the enums parse.
    #[test]
    fn every_literal_in_the_sql_is_an_enum_spelling() {
        let mut statements = vec![
            SELECT_GLOBAL,
            SELECT_TCC_RECORD,
            SELECT_BRANCHES,
            COUNT_BRANCH,
            UNCOUNT_BRANCH,
            SELECT_BRANCH,
            DECIDE_COMMIT,
            DECIDE_ROLLBACK,
            PROGRESS,
            ANY_DUE,
            CLAIM,
            PARKED,
            SELECT_HISTORY,
            LIST_GLOBAL,
            TALLY,
            OLDEST_OF_STATUS,
            FINISHED,
        ];
        for sql in [INSERT_GLOBAL, INSERT_BRANCH, DUE] {
            statements.extend(sql.texts());
        }
        dtx_sql::assert_literals_known(
            &statements,
            &[
                TxStatus::SPELLINGS,
                BranchState::SPELLINGS,
                Kind::SPELLINGS,
                Decision::SPELLINGS,
            ],
        );
    }
}
