//! The writes a batch applies in one transaction: each change's statements, and the history
//! entries and alerts the batch inserts before it commits. The writer (`writer.rs`) runs them.

use std::sync::atomic::{AtomicI64, Ordering};

use dtx_sql::{Arg, Conn, Dialect, Sql, args, insert_ignore};

use super::rows::{ENTRY_COLUMNS, global_columns, read_branch, read_global, read_tcc_record};
use super::{
    BeginTcc, Created, Decide, Decided, Progress, Progressed, RegisterBranch, Registered,
    SubmitSaga,
};
use crate::domain::alert::Alert;
use crate::domain::history::Entry;
use crate::domain::record::encode_headers;
use crate::domain::{BranchRow, Decision, Kind, TxRecord, TxStatus};
use crate::error::{Error, Result};

const INSERT_GLOBAL: Sql = insert_ignore!(concat!(
    "dtx_global (",
    global_columns!("", "spec"),
    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)"
));

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

const INSERT_ALERT: Sql = insert_ignore!(
    "dtx_alert (id, xid, kind, body, created_ms, due_ms, attempts) VALUES (?, ?, ?, ?, ?, ?, 0)"
);

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
        let sql = format!("INSERT INTO dtx_history (seq, xid, {ENTRY_COLUMNS}) VALUES {rows}");
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

/// Inserts `alerts` (an id already stored is left as it is), in the caller's transaction.
pub(super) async fn insert_alerts<C: Conn>(
    conn: &mut C,
    alerts: &[Alert],
    now: i64,
) -> Result<u64> {
    let mut inserted = 0;
    for a in alerts {
        inserted += conn
            .execute(
                INSERT_ALERT.pick(C::DIALECT),
                args![
                    a.id.as_str(),
                    a.xid.as_str(),
                    a.kind.as_str(),
                    a.body.as_str(),
                    a.at_ms,
                    now
                ],
            )
            .await?;
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status, kind and decision spelled inside these statements is one the enums parse.
    #[test]
    fn every_literal_in_the_sql_is_an_enum_spelling() {
        let mut statements = vec![
            COUNT_BRANCH,
            UNCOUNT_BRANCH,
            DECIDE_COMMIT,
            DECIDE_ROLLBACK,
            PROGRESS,
        ];
        for sql in [INSERT_GLOBAL, INSERT_BRANCH, INSERT_ALERT] {
            statements.extend(sql.texts());
        }
        dtx_sql::assert_literals_known(
            &statements,
            &[
                TxStatus::SPELLINGS,
                crate::domain::BranchState::SPELLINGS,
                Kind::SPELLINGS,
                Decision::SPELLINGS,
                crate::domain::alert::AlertKind::SPELLINGS,
            ],
        );
    }
}
