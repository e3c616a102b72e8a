//! TCC: Begin, RegisterBranch, Commit and Rollback. The instance that records the decision
//! drives phase two at once.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dtx_proto::limits;

use super::Engine;
use crate::domain::history::Entry;
use crate::domain::job::Phase;
use crate::domain::tcc::{Undecided, refused_registration, unapplied_decision};
use crate::domain::{
    BranchId, BranchRow, Decision, Fence, GlobalRow, Kind, TxRecord, TxStatus, Xid,
};
use crate::error::{Error, Result};
use crate::store::{BeginTcc, Created, Decide, Decided, RegisterBranch, Registered};

/// Identity and content of a branch to register.
#[derive(Debug, Clone)]
pub struct NewBranch {
    pub branch_id: String,
    pub target: String,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub call_timeout: Duration,
    /// Begin the transaction with this timeout if it does not exist yet (saves a round trip).
    pub begin_timeout: Option<Duration>,
}

impl Engine {
    /// Begins a TCC transaction; an identical repeat returns the existing one.
    pub async fn begin(&self, xid: Option<String>, timeout_ms: u64) -> Result<GlobalRow> {
        let xid = match xid {
            Some(xid) => Xid::parse(xid)?,
            None => Xid::generate(),
        };
        let timeout = limits::timeout(
            "timeout_ms",
            timeout_ms,
            limits::DEFAULT_TX_TIMEOUT,
            limits::MAX_TX_TIMEOUT,
        )?;
        let now = self.inner.now_ms();
        let timeout_ms = timeout.as_millis() as i64;
        let deadline_ms = now + timeout_ms;
        let written = self
            .inner
            .store
            .begin_tcc(BeginTcc {
                xid: xid.clone(),
                timeout_ms,
                deadline_ms,
            })
            .await?;
        match written {
            Created::Inserted => {
                self.inner.metrics.started(Kind::Tcc);
                Ok(GlobalRow {
                    xid,
                    kind: Kind::Tcc,
                    status: TxStatus::Trying,
                    decision: None,
                    timeout_ms,
                    deadline_ms,
                    spec: None,
                    branch_count: 0,
                    owner: None,
                    fence: Fence::UNCLAIMED,
                    due_ms: Some(deadline_ms),
                    last_error: None,
                    created_ms: now,
                    updated_ms: now,
                })
            }
            Created::Exists(row) if row.kind == Kind::Tcc && row.timeout_ms == timeout_ms => {
                Ok(row)
            }
            Created::Exists(row) => Err(Error::Conflict(format!(
                "xid {xid:?} is already used by a {} transaction with timeout {} ms",
                row.kind, row.timeout_ms
            ))),
        }
    }

    /// Registers a branch before its Try is invoked.
    pub async fn register_branch(&self, xid: String, branch: NewBranch) -> Result<()> {
        let xid = Xid::parse(xid)?;
        let begin = branch.begin_timeout.map(|t| {
            let timeout_ms = t.as_millis() as i64;
            (timeout_ms, self.inner.now_ms() + timeout_ms)
        });
        let branch_id = BranchId::parse("branch_id", branch.branch_id)?;
        limits::check_target("target", &branch.target)?;
        self.check_target(&branch.target)?;
        limits::check_handler("handler", &branch.handler)?;
        limits::check_payload("payload", &branch.payload)?;
        limits::check_headers("headers", &branch.headers)?;
        let per_ms = crate::domain::history::SEQ_PER_MS;
        let seq = self.inner.now_ms() * per_ms
            + self.inner.seq.fetch_add(1, Ordering::Relaxed) as i64 % per_ms;
        let row = BranchRow {
            branch_id,
            seq,
            target: branch.target,
            handler: branch.handler,
            payload: branch.payload,
            headers: branch.headers,
            call_timeout_ms: branch.call_timeout.as_millis() as i64,
            ..BranchRow::default()
        };
        let written = self
            .inner
            .store
            .register_branch(RegisterBranch {
                xid: xid.clone(),
                branch: row.clone(),
                max_branches: limits::MAX_BRANCHES as i64,
                begin,
            })
            .await?;
        match written {
            Registered::Added { begun } => {
                if begun {
                    self.inner.metrics.started(Kind::Tcc);
                }
                Ok(())
            }
            Registered::Missing => Err(Error::UnknownXid(xid.into())),
            Registered::Refused { global, existing } => {
                refused_registration(&row, &global, existing.as_ref(), self.inner.now_ms())
            }
        }
    }

    /// Records a TCC transaction's Commit or Rollback, or a message's Submit (`Commit`) or
    /// Abort (`Rollback`), and drives phase two. With `wait`, returns once the transaction
    /// settled or the wait elapsed.
    pub async fn decide(
        &self,
        xid: String,
        kind: Kind,
        decision: Decision,
        wait: Option<Duration>,
    ) -> Result<TxStatus> {
        let xid = Xid::parse(xid)?;
        let why = match (kind, decision) {
            (Kind::Message, Decision::Commit) => "submitted by the initiator".to_string(),
            (Kind::Message, _) => "aborted by the initiator".to_string(),
            _ => format!("{decision} asked by the initiator"),
        };
        let status = Phase::Settle(decision).status();
        let entry = self.inner.decided(status, &why);
        let status = self.decide_with(xid.clone(), kind, decision, entry).await?;
        match wait {
            Some(wait) => Ok(self.wait(&xid, wait).await?.global.status),
            None => Ok(status),
        }
    }

    /// Records `decision` with its history entry and drives phase two; returns the status the
    /// transaction is in (an identical repeat answers the current one).
    pub(super) async fn decide_with(
        &self,
        xid: Xid,
        kind: Kind,
        decision: Decision,
        entry: Entry,
    ) -> Result<TxStatus> {
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let fence = Fence::fresh();
        let due_ms = self.inner.now_ms() + self.inner.config.lease.as_millis() as i64;
        let written = self
            .inner
            .store
            .decide(Decide {
                xid: xid.clone(),
                kind,
                decision,
                owner: self.inner.config.instance.clone(),
                fence,
                due_ms,
                history: vec![entry],
            })
            .await?;
        Ok(match written {
            Decided::Claimed { global, branches } => {
                let phase = Phase::Settle(decision);
                let record = TxRecord { global, branches };
                let job = self.job(&record, fence, phase)?;
                self.spawn(job, record.global);
                phase.status()
            }
            Decided::Missing => return Err(Error::UnknownXid(xid.into())),
            Decided::Exists(mut row) => {
                // Answer with the status Get and Wait see: the stored row may lag the driver's
                // live view (its final write is group-committed after waiters learned it).
                if let Ok(live) = self.get(&xid).await {
                    row.status = live.global.status;
                }
                match unapplied_decision(kind, decision, &row)? {
                    Undecided::Repeat(status) => status,
                    Undecided::Late => {
                        let why = "rollback: the deadline passed before Commit";
                        let entry = self.inner.decided(TxStatus::RollingBack, why);
                        let late = self.decide_with(xid.clone(), kind, Decision::Rollback, entry);
                        let status = Box::pin(late).await?;
                        return Err(Error::Decided {
                            message: format!(
                                "transaction {xid:?} passed its deadline before Commit and is rolled back"
                            ),
                            status,
                        });
                    }
                }
            }
        })
    }
}
