//! Operator actions (Resume, ForceRollback, RetryNow) and the reads behind the admin API.
//!
//! Every action reads the durable row, decides from its status whether it applies (a repeat
//! once it took effect is a no-op, an action that cannot apply is `WrongState`), and applies as
//! one fenced write that carries the operator's history entry, so the action and its record
//! commit together.

use super::Engine;
use crate::domain::history::{Entry, Event};
use crate::domain::job::{Phase, resumed};
use crate::domain::{Decision, Fence, GlobalRow, Kind, TxRecord, TxStatus};
use crate::error::{Error, Result};
use crate::store::{ListQuery, Progress, Progressed, Tally};

/// Who asks for an action, and why (both kept in the history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub reason: String,
}

impl Operator {
    fn entry(&self, now_ms: i64, action: &str, status: Option<TxStatus>) -> Entry {
        Entry::tx(now_ms, Event::Operator, status)
            .detail(format!("{action}: {}", self.reason))
            .by(self.name.as_str())
    }
}

/// A transaction as an operator sees it.
#[derive(Debug, Clone)]
pub struct Described {
    pub record: TxRecord,
    pub history: Vec<Entry>,
}

/// What an action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acted {
    Applied,
    /// It had taken effect already (or there was nothing to do): nothing changed.
    AlreadyDone,
}

impl Engine {
    /// Coordinator.Resume: drives a parked transaction's decided phase again; refused unless
    /// it is parked.
    pub async fn resume(&self, xid: &str, by: &Operator) -> Result<TxRecord> {
        let record = self.stored(xid).await?;
        self.resume_parked(record, by).await?;
        self.get(xid).await
    }

    /// Admin.Resume: as [`Engine::resume`], and a no-op once the decision is being (or was)
    /// carried out.
    pub async fn admin_resume(&self, xid: &str, by: &Operator) -> Result<Acted> {
        let record = self.stored(xid).await?;
        let g = &record.global;
        match g.status {
            TxStatus::NeedsAttention => self.resume_parked(record, by).await,
            _ if g.decision.is_some() => Ok(Acted::AlreadyDone),
            status => Err(Error::WrongState(format!(
                "transaction {xid:?} is {status}: nothing was decided, so nothing to resume"
            ))),
        }
    }

    async fn resume_parked(&self, record: TxRecord, by: &Operator) -> Result<Acted> {
        let (phase, branches) = resumed(&record)?;
        let g = &record.global;
        let xid = g.xid.as_str();
        let now = self.inner.now_ms();
        let fence = Fence::fresh();
        let progress = Progress {
            xid: g.xid.clone(),
            fence: g.fence,
            new_fence: Some(fence),
            from: TxStatus::NeedsAttention,
            to: phase.status(),
            decision: g.decision,
            owner: Some(self.inner.config.instance.clone()),
            due_ms: Some(now + self.inner.config.lease.as_millis() as i64),
            last_error: None,
            branches: branches.clone(),
            history: vec![by.entry(now, "resume", Some(phase.status()))],
            alerts: Vec::new(),
        };
        self.fenced(progress, "resuming").await?;
        let resumed = TxRecord {
            global: GlobalRow {
                status: phase.status(),
                fence,
                ..g.clone()
            },
            branches,
        };
        self.spawn(self.job(&resumed, fence, phase)?, resumed.global);
        tracing::info!(%xid, operator = %by.name, reason = %by.reason, "resumed by an operator");
        Ok(Acted::Applied)
    }

    /// Rolls back an undecided TCC transaction or turns a running saga to compensation.
    pub async fn force_rollback(&self, xid: &str, by: &Operator) -> Result<Acted> {
        let record = self.stored(xid).await?;
        let g = &record.global;
        let now = self.inner.now_ms();
        match (g.kind, g.status) {
            (Kind::Tcc, TxStatus::Trying) => {
                let entry = by.entry(now, "force rollback", Some(TxStatus::RollingBack));
                self.decide_with(g.xid.clone(), Kind::Tcc, Decision::Rollback, entry)
                    .await?;
                Ok(Acted::Applied)
            }
            (Kind::Saga, TxStatus::Running) => self.compensate_running(record, by).await,
            // Dropping it could contradict a local commit: the both-or-neither promise is the
            // check-back's to keep.
            (Kind::Message, TxStatus::Prepared) => Err(Error::WrongState(format!(
                "message {xid:?} is PREPARED: only its check-back can tell whether its local \
                 transaction committed (RetryNow checks back now)"
            ))),
            (_, TxStatus::RollingBack | TxStatus::RolledBack)
            | (_, TxStatus::Compensating | TxStatus::Compensated) => Ok(Acted::AlreadyDone),
            (_, TxStatus::NeedsAttention) => Err(Error::WrongState(format!(
                "transaction {xid:?} is parked with decision {}: its decision is final, use Resume",
                g.decision.map_or("none", Decision::as_str)
            ))),
            (_, status) => Err(Error::WrongState(format!(
                "transaction {xid:?} is {status}: too late to roll back"
            ))),
        }
    }

    /// RUNNING -> COMPENSATING under a fresh fence: whichever driver ran it forward is fenced
    /// off at its next write; every step that may have run is compensated (a late action is
    /// stopped by its participant's barrier).
    async fn compensate_running(&self, record: TxRecord, by: &Operator) -> Result<Acted> {
        let g = &record.global;
        let now = self.inner.now_ms();
        let fence = Fence::fresh();
        let mut job = self.job(&record, fence, Phase::Forward)?.taken_over();
        job.turn_to_compensation(now);
        let reason = format!("forced by {}: {}", by.name, by.reason);
        let mut history = job.take_history();
        history.push(by.entry(now, "force rollback", Some(TxStatus::Compensating)));
        let progress = Progress {
            xid: g.xid.clone(),
            fence: g.fence,
            new_fence: Some(fence),
            from: TxStatus::Running,
            to: TxStatus::Compensating,
            decision: Some(Decision::Compensate),
            owner: Some(self.inner.config.instance.clone()),
            due_ms: Some(now + self.inner.config.lease.as_millis() as i64),
            last_error: Some(reason.clone()),
            branches: job.rows(),
            history,
            alerts: Vec::new(),
        };
        self.fenced(progress, "turning it to compensation").await?;
        let global = GlobalRow {
            status: TxStatus::Compensating,
            decision: Some(Decision::Compensate),
            fence,
            last_error: Some(reason),
            ..g.clone()
        };
        self.spawn(job, global);
        tracing::info!(xid = %g.xid, operator = %by.name, "saga forced to compensate");
        Ok(Acted::Applied)
    }

    /// Retries now what waits for a retry: a step in backoff in this instance's driver, or a
    /// transaction handed back to recovery with a later due time.
    pub async fn retry_now(&self, xid: &str, by: &Operator) -> Result<Acted> {
        let record = self.stored(xid).await?;
        let g = &record.global;
        let now = self.inner.now_ms();
        match (g.kind, g.status) {
            (_, status) if status.is_terminal() => {
                return Err(Error::WrongState(format!(
                    "transaction {xid:?} is {status}: nothing left to retry"
                )));
            }
            (_, TxStatus::NeedsAttention) => {
                return Err(Error::WrongState(format!(
                    "transaction {xid:?} is parked (NEEDS_ATTENTION): use Resume"
                )));
            }
            (Kind::Tcc, TxStatus::Trying) => {
                return Err(Error::WrongState(format!(
                    "transaction {xid:?} is TRYING: undecided, nothing to retry"
                )));
            }
            _ => {}
        }
        if let Some(active) = self.active(xid) {
            let entry = by.entry(now, "retry now", None);
            let (reply, done) = tokio::sync::oneshot::channel();
            if active.nudge.send(Box::new((entry, reply))).is_ok()
                && let Ok(retried) = done.await
            {
                return Ok(if retried > 0 {
                    Acted::Applied
                } else {
                    Acted::AlreadyDone
                });
            }
        }
        let due = g.due_ms.unwrap_or(i64::MAX);
        match &g.owner {
            Some(owner) if due > now => Err(Error::WrongState(format!(
                "transaction {xid:?} is being driven by coordinator instance {owner}: retry it \
                 there, or wait for its own retry"
            ))),
            _ if due <= now => Ok(Acted::AlreadyDone),
            _ => {
                let progress = Progress {
                    xid: g.xid.clone(),
                    fence: g.fence,
                    new_fence: None,
                    from: g.status,
                    to: g.status,
                    decision: g.decision,
                    owner: None,
                    due_ms: Some(now),
                    last_error: None,
                    branches: Vec::new(),
                    history: vec![by.entry(now, "retry now", None)],
                    alerts: Vec::new(),
                };
                self.fenced(progress, "scheduling its retry").await?;
                self.inner.wake_recovery.notify_one();
                Ok(Acted::Applied)
            }
        }
    }

    /// The transaction, its branches and its history.
    pub async fn describe(&self, xid: &str) -> Result<Described> {
        let record = self.get(xid).await?;
        let stored = self.inner.store.history(xid).await?;
        let history = crate::domain::history::derived(&record, stored);
        Ok(Described { record, history })
    }

    pub async fn list(&self, query: &ListQuery) -> Result<Vec<GlobalRow>> {
        self.inner.store.list(query).await
    }

    /// How many of `tenant`'s transactions are in flight (not finished, not parked for a
    /// person), counting no further than `up_to`: one bounded index walk per status.
    pub async fn count_in_flight(&self, tenant: &str, up_to: u64) -> Result<u64> {
        let query = ListQuery {
            statuses: TxStatus::ALL
                .iter()
                .copied()
                .filter(|s| !s.is_terminal() && *s != TxStatus::NeedsAttention)
                .collect(),
            tenant: Some(tenant.to_string()),
            limit: i64::try_from(up_to).unwrap_or(i64::MAX),
            ..ListQuery::default()
        };
        Ok(self.inner.store.list(&query).await?.len() as u64)
    }

    pub async fn tally(&self) -> Result<Tally> {
        self.inner.store.tally().await
    }

    /// Now on the database's clock.
    pub fn now_ms(&self) -> i64 {
        self.inner.now_ms()
    }

    /// The durable record (not a driver's live view: actions need its fence and owner).
    async fn stored(&self, xid: &str) -> Result<TxRecord> {
        dtx_proto::limits::check_scoped_xid(xid)?;
        self.inner
            .store
            .get(xid)
            .await?
            .ok_or_else(|| Error::UnknownXid(xid.to_string()))
    }

    /// Applies an operator's fenced write; a lost race is `WrongState` (read it again).
    async fn fenced(&self, progress: Progress, doing: &str) -> Result<()> {
        let xid = progress.xid.clone();
        match self.inner.store.progress(progress).await? {
            Progressed::Applied => Ok(()),
            Progressed::Fenced => Err(Error::WrongState(format!(
                "transaction {xid:?} changed while {doing}; read it again"
            ))),
        }
    }
}
