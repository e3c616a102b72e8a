//! Recovery: claims due work from the store and drives it; purges finished transactions.
//!
//! Due work is an undecided TCC transaction past its deadline (rolled back), a prepared
//! message past its check-back time (checked back), a transaction whose driver's lease expired
//! (its coordinator crashed or stalled), or a slow retry handed back to the store. Claims skip rows another instance has locked, so several coordinators on
//! one PostgreSQL or MySQL/MariaDB share the work without driving a transaction twice at once.

use std::time::Duration;

use super::Engine;
use crate::domain::job::Phase;
use crate::domain::{Decision, Kind, TxRecord, TxStatus};
use crate::error::Result;
use crate::store::{Progress, Progressed};

const DEADLINE: &str = "deadline passed before a decision";

pub(super) async fn run(engine: Engine) {
    let config = engine.inner.config.clone();
    let mut shutdown = engine.inner.shutdown.subscribe();
    let mut last_purge = tokio::time::Instant::now();
    loop {
        if *shutdown.borrow() {
            return;
        }
        match engine
            .inner
            .store
            .claim_due(&config.instance, config.lease, config.claim_batch)
            .await
        {
            Ok(records) => {
                let full = records.len() as i64 >= config.claim_batch;
                for record in records {
                    let xid = record.global.xid.clone();
                    if let Err(e) = take_over(&engine, record).await {
                        tracing::warn!(%xid, error = %e, "could not take over a due transaction");
                    }
                }
                if full {
                    continue; // more may be due: claim again right away
                }
            }
            Err(e) => {
                engine.inner.metrics.store_error("claim_due");
                tracing::warn!(error = %e, "recovery could not claim due work");
            }
        }
        if let Some(retention) = config.retention
            && last_purge.elapsed() >= Duration::from_secs(60)
        {
            last_purge = tokio::time::Instant::now();
            let before = engine.inner.now_ms() - retention.as_millis() as i64;
            match engine.inner.store.purge_finished(before, 500).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "purged finished transactions"),
                Err(e) => {
                    engine.inner.metrics.store_error("purge_finished");
                    tracing::warn!(error = %e, "purging finished transactions failed");
                }
            }
        }
        // Jitter spreads the polls of several instances.
        let jitter = config.poll_interval.mul_f64(rand::random::<f64>() * 0.2);
        tokio::select! {
            _ = tokio::time::sleep(config.poll_interval + jitter) => {}
            _ = engine.inner.wake_recovery.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Drives a claimed transaction (its fencing token is the one the claim installed).
async fn take_over(engine: &Engine, mut record: TxRecord) -> Result<()> {
    let g = &record.global;
    let (fence, claimed_in) = (g.fence, g.status);
    let phase = match (g.kind, g.status, g.decision) {
        (Kind::Tcc, TxStatus::Trying, _) => {
            // Undecided at its deadline: roll back (branches whose Try never ran get an
            // empty rollback from their barrier).
            let progress = Progress {
                xid: g.xid.clone(),
                fence,
                new_fence: None,
                from: TxStatus::Trying,
                to: TxStatus::RollingBack,
                decision: Some(Decision::Rollback),
                owner: Some(engine.inner.config.instance.clone()),
                due_ms: Some(engine.inner.now_ms() + engine.inner.config.lease.as_millis() as i64),
                last_error: Some(DEADLINE.into()),
                branches: Vec::new(),
                history: vec![engine.inner.decided(TxStatus::RollingBack, DEADLINE)],
                alerts: Vec::new(),
            };
            if engine.inner.store.progress(progress).await? != Progressed::Applied {
                return Ok(()); // a client's Rollback won the race; its driver runs it
            }
            tracing::info!(xid = %g.xid, "deadline passed undecided: rolling back");
            record.global.status = TxStatus::RollingBack;
            Phase::Settle(Decision::Rollback)
        }
        (Kind::Saga, TxStatus::Running, _) => Phase::Forward,
        (Kind::Message, TxStatus::Prepared, _) => {
            // The call may take its whole timeout: not on recovery's loop.
            let engine = engine.clone();
            tokio::spawn(async move { engine.check_back(record).await });
            return Ok(());
        }
        (_, TxStatus::Committing | TxStatus::RollingBack | TxStatus::Compensating, Some(d)) => {
            Phase::Settle(d)
        }
        (kind, status, decision) => {
            tracing::warn!(xid = %g.xid, %kind, %status, ?decision, "claimed a transaction with nothing to do");
            return Ok(());
        }
    };
    engine.inner.metrics.taken_over(claimed_in);
    tracing::info!(xid = %record.global.xid, status = %record.global.status, "taking over");
    let job = engine.job(&record, fence, phase)?.taken_over();
    engine.spawn(job, record.global);
    Ok(())
}
