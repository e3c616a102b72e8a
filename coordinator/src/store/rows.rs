//! Reading the coordinator's rows: each column list declared once (as a macro, so statements
//! are still `&'static str` built at compile time), the statements that select them, and their
//! decoding in the order the lists give.

use dtx_sql::{Arg, Conn, SqlRow, args};

use crate::domain::history::{Entry, Event};
use crate::domain::record::decode_headers;
use crate::domain::{
    BranchId, BranchRow, BranchState, Decision, Fence, GlobalRow, Kind, TxRecord, TxStatus, Xid,
};
use crate::error::{Error, Result};

// Identifiers bind as the text or integer the columns hold.
impl<'a> From<&'a Xid> for Arg<'a> {
    fn from(xid: &'a Xid) -> Self {
        Arg::from(xid.as_str())
    }
}

impl<'a> From<&'a BranchId> for Arg<'a> {
    fn from(id: &'a BranchId) -> Self {
        Arg::from(id.as_str())
    }
}

impl From<Fence> for Arg<'_> {
    fn from(fence: Fence) -> Self {
        Arg::from(fence.get())
    }
}

/// `dtx_global`'s columns in the order [`global_from_row`] decodes them. `$t` prefixes each
/// column (`""`, or a table alias such as `"g."`); `$spec` is the spec column, or `"NULL"` where
/// a listing does not need the blob.
macro_rules! global_columns {
    ($t:literal, $spec:literal) => {
        concat!(
            $t,
            "xid, ",
            $t,
            "kind, ",
            $t,
            "status, ",
            $t,
            "decision, ",
            $t,
            "timeout_ms, ",
            $t,
            "deadline_ms, ",
            $spec,
            ", ",
            $t,
            "branch_count, ",
            $t,
            "owner, ",
            $t,
            "fence, ",
            $t,
            "due_ms, ",
            $t,
            "last_error, ",
            $t,
            "created_ms, ",
            $t,
            "updated_ms"
        )
    };
}
pub(super) use global_columns;

/// `dtx_branch`'s columns in the order [`branch_from_row`] decodes them, each prefixed by `$t`.
macro_rules! branch_columns {
    ($t:literal) => {
        concat!(
            $t,
            "branch_id, ",
            $t,
            "seq, ",
            $t,
            "target, ",
            $t,
            "handler, ",
            $t,
            "payload, ",
            $t,
            "headers, ",
            $t,
            "call_timeout_ms, ",
            $t,
            "status, ",
            $t,
            "attempts, ",
            $t,
            "last_error, ",
            $t,
            "result"
        )
    };
}

/// `dtx_history`'s columns of one entry, in the order [`entry_from_row`] decodes them.
macro_rules! entry_columns {
    () => {
        "at_ms, event, branch_id, status, attempt, detail, actor"
    };
}

/// [`entry_columns`], for statements built at run time.
pub(super) const ENTRY_COLUMNS: &str = entry_columns!();

/// How many columns [`global_columns`] lists; [`SELECT_TCC_RECORD`]'s branch columns follow.
const GLOBAL_COLUMNS: usize = 14;

const SELECT_GLOBAL: &str = concat!(
    "SELECT ",
    global_columns!("", "spec"),
    " FROM dtx_global WHERE xid = ?"
);

/// [`SELECT_GLOBAL`]'s and [`SELECT_BRANCHES`]' columns, one row per branch.
const SELECT_TCC_RECORD: &str = concat!(
    "SELECT ",
    global_columns!("g.", "g.spec"),
    ", ",
    branch_columns!("b."),
    " FROM dtx_global g LEFT JOIN dtx_branch b ON b.xid = g.xid WHERE g.xid = ? ORDER BY b.seq"
);

const SELECT_BRANCHES: &str = concat!(
    "SELECT ",
    branch_columns!(""),
    " FROM dtx_branch WHERE xid = ? ORDER BY seq"
);

const SELECT_BRANCH: &str = concat!(
    "SELECT ",
    branch_columns!(""),
    " FROM dtx_branch WHERE xid = ? AND branch_id = ?"
);

pub(super) const SELECT_HISTORY: &str = concat!(
    "SELECT ",
    entry_columns!(),
    " FROM dtx_history WHERE xid = ? ORDER BY seq"
);

/// [`SELECT_GLOBAL`]'s columns (without the spec blob) and no `WHERE`: the start of every
/// listing.
pub(super) const LIST_GLOBAL: &str =
    concat!("SELECT ", global_columns!("", "NULL"), " FROM dtx_global");

pub(super) fn entry_from_row<R: SqlRow>(r: &R) -> Result<Entry> {
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

pub(super) fn corrupt(what: &str, value: &str) -> Error {
    Error::Corrupt(format!("unknown {what} {value:?}"))
}

pub(super) async fn read_global<C: Conn>(conn: &mut C, xid: &str) -> Result<Option<GlobalRow>> {
    match conn.fetch_optional(SELECT_GLOBAL, args![xid]).await? {
        Some(r) => Ok(Some(global_from_row(&r)?)),
        None => Ok(None),
    }
}

/// A TCC transaction and its branches in one statement (a TCC row has no `spec` blob to
/// repeat on every branch row).
pub(super) async fn read_tcc_record<C: Conn>(conn: &mut C, xid: &str) -> Result<Option<TxRecord>> {
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
        xid: Xid::checked(r.text(0)?),
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
        fence: Fence::stored(r.i64(9)?),
        due_ms: r.opt_i64(10)?,
        last_error: r.opt_text(11)?,
        created_ms: r.i64(12)?,
        updated_ms: r.i64(13)?,
    })
}

fn branch_from_row<R: SqlRow>(r: &R) -> Result<BranchRow> {
    let state = r.text(7)?;
    Ok(BranchRow {
        branch_id: BranchId::checked(r.text(0)?),
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

pub(super) async fn read_branches<C: Conn>(conn: &mut C, xid: &str) -> Result<Vec<BranchRow>> {
    conn.fetch_all(SELECT_BRANCHES, args![xid])
        .await?
        .iter()
        .map(branch_from_row)
        .collect()
}

pub(super) async fn read_branch<C: Conn>(
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

    #[test]
    fn the_column_lists_agree_with_their_decoders() {
        let count = |list: &str| list.split(", ").count();
        assert_eq!(count(global_columns!("", "spec")), GLOBAL_COLUMNS);
        assert_eq!(count(branch_columns!("")), 11);
        assert_eq!(count(ENTRY_COLUMNS), 7);
    }

    /// Every status, kind and decision spelled inside these statements is one the enums parse.
    #[test]
    fn every_literal_in_the_sql_is_an_enum_spelling() {
        dtx_sql::assert_literals_known(
            &[
                SELECT_GLOBAL,
                SELECT_TCC_RECORD,
                SELECT_BRANCHES,
                SELECT_BRANCH,
                SELECT_HISTORY,
                LIST_GLOBAL,
            ],
            &[TxStatus::SPELLINGS, BranchState::SPELLINGS, Kind::SPELLINGS],
        );
    }
}
