//! Operator actions on a transaction.

use super::Engine;
use crate::domain::job::resumed;
use crate::domain::{GlobalRow, TxRecord, TxStatus};
use crate::error::{Error, Result};
use crate::store::{Progress, Progressed};

impl Engine {
    /// Operator action: drives a parked transaction's decided phase again.
    pub async fn resume(&self, xid: &str) -> Result<TxRecord> {
        let record = self.get(xid).await?;
        let (phase, branches) = resumed(&record)?;
        let g = &record.global;
        let fence = crate::store::new_fence();
        let progress = Progress {
            xid: xid.to_string(),
            fence: g.fence,
            new_fence: Some(fence),
            from: TxStatus::NeedsAttention,
            to: phase.status(),
            decision: g.decision,
            owner: Some(self.inner.config.instance.clone()),
            due_ms: Some(self.inner.now_ms() + self.inner.config.lease.as_millis() as i64),
            last_error: None,
            branches: branches.clone(),
        };
        match self.inner.store.progress(progress).await? {
            Progressed::Applied => {
                let resumed = TxRecord {
                    global: GlobalRow {
                        status: phase.status(),
                        fence,
                        ..g.clone()
                    },
                    branches,
                };
                self.spawn(self.job(&resumed, fence, phase)?, resumed.global);
                tracing::info!(%xid, "resumed by an operator");
                self.get(xid).await
            }
            Progressed::Fenced => Err(Error::WrongState(format!(
                "transaction {xid:?} changed while resuming; read it again"
            ))),
        }
    }
}
