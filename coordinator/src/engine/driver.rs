//! The driver: performs what [`Job::next`] decides for one transaction - calls, durable
//! writes, waits - until it is terminal, parked, handed off or owned by someone else. The rules
//! (what may run, what an answer means, when to turn, park or hand off) are pure and live in
//! [`crate::domain::job`].
//!
//! Progress of individual steps is not written on the hot path: repeating a call is safe (the
//! participant's barrier answers repeats), so a crash costs repeated calls, not correctness.
//! The store is written only at the turn, at the end, when parking, when renewing the lease of
//! a long-running transaction, and when handing a slow retry back to recovery. Every write
//! carries the driver's fencing token; a fenced write means another coordinator took over, and
//! this driver stops.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dtx_proto::v1::BranchAction;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::metrics::outcome_label;
use super::participants::Call;
use super::{Active, Inner};
use crate::domain::alert;
use crate::domain::history::{Entry, Event};
use crate::domain::job::{CallOutcome, Job, Next, Phase};
use crate::domain::{Decision, Kind, TxStatus};
use crate::store::{Progress, Progressed};

/// What a participant is asked to do in `phase` of a transaction of `kind`.
fn action(kind: Kind, phase: Phase) -> BranchAction {
    match phase {
        // A message's delivery is an action that is never compensated.
        Phase::Forward => BranchAction::Action,
        Phase::Settle(Decision::Commit) if kind == Kind::Message => BranchAction::Action,
        Phase::Settle(Decision::Commit) => BranchAction::Confirm,
        Phase::Settle(Decision::Rollback) => BranchAction::Cancel,
        Phase::Settle(Decision::Compensate) => BranchAction::Compensate,
    }
}

/// The `action` label of the call metrics: `CONFIRM`, `CANCEL`, `ACTION`, `COMPENSATE`.
fn action_label(kind: Kind, phase: Phase) -> &'static str {
    action(kind, phase)
        .as_str_name()
        .trim_start_matches("BRANCH_ACTION_")
}

/// The participant call for step `i` in the job's phase.
fn call(job: &Job, i: usize) -> Call {
    let step = &job.steps[i];
    let payload = match job.phase {
        Phase::Forward => &step.forward_payload,
        Phase::Settle(_) => &step.settle_payload,
    };
    Call {
        target: step.row.target.clone(),
        xid: job.xid.clone(),
        branch_id: step.row.branch_id.clone(),
        action: action(job.kind, job.phase),
        handler: step.row.handler.clone(),
        payload: payload.clone(),
        headers: step.headers.clone(),
        timeout: step.policy.call_timeout,
    }
}

/// How a driver run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Terminal or parked, durably.
    Settled(TxStatus),
    /// Handed back to the store for recovery to continue later (slow retry, shutdown).
    HandedOff,
    /// Another coordinator owns it now (our fencing token is stale), or the store failed.
    Lost,
}

type Pending = FuturesUnordered<BoxFuture<'static, (usize, CallOutcome)>>;

/// Operators' RetryNow requests (see [`Active::nudge`]).
pub type Nudges = tokio::sync::mpsc::UnboundedReceiver<super::Nudge>;

/// Drives `job` until it settles, is handed off, or ownership is lost.
pub async fn drive(
    inner: Arc<Inner>,
    mut job: Job,
    active: Arc<Active>,
    mut nudges: Nudges,
) -> Ended {
    let lease = inner.config.lease;
    let handoff_after_ms = inner.config.handoff_after.as_millis() as i64;
    let mut renew_at = Instant::now() + lease / 3;
    let mut calls: Pending = FuturesUnordered::new();
    let mut shutdown = inner.shutdown.subscribe();
    // Branches whose attempts alert was written: one beyond the bound forces a write at once.
    let mut alerted: HashSet<String> = HashSet::new();
    publish(&active, &job, None);
    loop {
        let until_ms = match job.next(inner.now_ms(), handoff_after_ms) {
            Next::Start(started) => {
                for i in started {
                    let action = action_label(job.kind, job.phase);
                    let call = call(&job, i);
                    let inner = inner.clone();
                    calls.push(Box::pin(async move {
                        let (handler, started) = (call.handler.clone(), Instant::now());
                        let outcome = inner.participants.call(call).await;
                        let answer = outcome_label(&outcome);
                        inner
                            .metrics
                            .branch_call(&handler, action, answer, started.elapsed());
                        (i, outcome)
                    }));
                }
                continue;
            }
            Next::Turn(reason) => {
                let reason = reason.to_string();
                if !turn_to_compensation_durably(&inner, &mut job, &reason).await {
                    return Ended::Lost;
                }
                publish(&active, &job, Some(&reason));
                continue;
            }
            Next::Settle(to) => return settle(&inner, &mut job, &active, to, None).await,
            Next::Park(reason) => {
                inner.metrics.parked();
                tracing::error!(xid = %job.xid, %reason, "transaction needs attention");
                let to = TxStatus::NeedsAttention;
                return settle(&inner, &mut job, &active, to, Some(reason.to_string())).await;
            }
            Next::HandOff(due_ms) => return hand_off(&inner, &mut job, &active, due_ms).await,
            Next::Sleep(until_ms) => until_ms,
        };
        let wake = until_ms.map_or(renew_at, |t| {
            let wait = Duration::from_millis((t - inner.now_ms()).max(0) as u64);
            renew_at.min(Instant::now() + wait)
        });
        tokio::select! {
            Some((i, outcome)) = calls.next(), if !calls.is_empty() => {
                job.record(i, outcome, inner.now_ms(), rand::random());
                if job.steps[i].waiting() {
                    let action = action_label(job.kind, job.phase);
                    inner.metrics.retried(&job.steps[i].row.handler, action);
                }
                publish(&active, &job, None);
                if let Some(alerts) = &inner.config.alerts {
                    for branch in alert::over_attempts(job.history(), &alerts.rules) {
                        if alerted.insert(branch.to_string()) {
                            renew_at = Instant::now();
                        }
                    }
                }
            }
            Some(nudge) = nudges.recv() => {
                let (entry, reply) = *nudge;
                reply.send(job.retry_now(entry)).ok();
            }
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.changed() => {
                // Let in-flight calls finish (bounded by their timeouts) so their outcome is
                // known, then hand the transaction back for another instance to continue now.
                while let Some((i, outcome)) = calls.next().await {
                    job.record(i, outcome, inner.now_ms(), rand::random());
                }
                return hand_off(&inner, &mut job, &active, inner.now_ms()).await;
            }
        }
        if Instant::now() >= renew_at {
            let status = job.phase.status();
            let progress = inner.progress(
                &mut job,
                status,
                Some(inner.config.instance.clone()),
                Some(inner.now_ms() + lease.as_millis() as i64),
                None,
            );
            if !inner.write_fenced(progress).await {
                return Ended::Lost;
            }
            renew_at = Instant::now() + lease / 3;
        }
    }
}

/// RUNNING -> COMPENSATING, durably, before any compensation is sent; false if ownership is
/// lost.
async fn turn_to_compensation_durably(inner: &Inner, job: &mut Job, reason: &str) -> bool {
    job.turn_to_compensation(inner.now_ms());
    let due = inner.now_ms() + inner.config.lease.as_millis() as i64;
    let mut progress = inner.progress(
        job,
        TxStatus::Compensating,
        Some(inner.config.instance.clone()),
        Some(due),
        Some(reason.to_string()),
    );
    // The job is already in its compensation phase: the status change is the turn's own.
    progress.from = TxStatus::Running;
    let turned = Entry::tx(inner.now_ms(), Event::Status, Some(TxStatus::Compensating));
    progress
        .history
        .push(turned.detail(reason).by(inner.config.instance.as_str()));
    if !inner.write_fenced(progress).await {
        return false;
    }
    tracing::info!(xid = %job.xid, %reason, "saga turned to compensation");
    true
}

/// Writes the final (or parked) status; the transaction no longer belongs to anyone.
///
/// Once every Confirm/Cancel/compensation of a decided transaction was delivered, its outcome
/// is certain - recovery after a crash could only deliver them again - so waiters learn it
/// before the final row is written. A saga's success is announced only once durable: until
/// then a recovery past the deadline would compensate it instead.
async fn settle(
    inner: &Inner,
    job: &mut Job,
    active: &Active,
    to: TxStatus,
    reason: Option<String>,
) -> Ended {
    let announce = |active: &Active| {
        active.view.send_modify(|v| {
            v.status = to;
            if reason.is_some() {
                v.last_error = reason.clone();
            }
        })
    };
    let certain = job.phase != Phase::Forward && to.is_terminal();
    if certain {
        announce(active);
    }
    let progress = inner.progress(job, to, None, None, reason.clone());
    if !inner.write_fenced(progress).await {
        return Ended::Lost;
    }
    let age_ms = (inner.now_ms() - active.global.created_ms).max(0) as u64;
    inner
        .metrics
        .finished(job.kind, to, Duration::from_millis(age_ms));
    if !certain {
        announce(active);
    }
    Ended::Settled(to)
}

/// Records progress and releases ownership; recovery continues at `due_ms`.
async fn hand_off(inner: &Inner, job: &mut Job, active: &Active, due_ms: i64) -> Ended {
    let progress = inner.progress(job, job.phase.status(), None, Some(due_ms), None);
    if !inner.write_fenced(progress).await {
        return Ended::Lost;
    }
    publish(active, job, None);
    Ended::HandedOff
}

/// Shows the driver's current view to Get and Wait.
fn publish(active: &Active, job: &Job, last_error: Option<&str>) {
    active.view.send_modify(|v| {
        v.status = job.phase.status();
        v.branches = job.rows();
        if let Some(e) = last_error {
            v.last_error = Some(e.to_string());
        }
    });
}

impl Inner {
    /// A fenced progress write for `job`, moving it to `to`, with the job's history since its
    /// last write and the status change (if any), by this instance.
    pub(super) fn progress(
        &self,
        job: &mut Job,
        to: TxStatus,
        owner: Option<String>,
        due_ms: Option<i64>,
        last_error: Option<String>,
    ) -> Progress {
        let decision = to.implied_decision().or(match job.phase {
            Phase::Settle(d) => Some(d),
            Phase::Forward => None,
        });
        let from = job.phase.status();
        let mut history = job.take_history();
        if from != to {
            let entry = Entry::tx(self.now_ms(), Event::Status, Some(to));
            history.push(match &last_error {
                Some(reason) => entry.detail(reason.as_str()),
                None => entry,
            });
        }
        for entry in &mut history {
            entry
                .actor
                .get_or_insert_with(|| self.config.instance.clone());
        }
        let alerts = match &self.config.alerts {
            Some(a) => alert::raised_by(&job.xid, job.kind, job.fence, &history, &a.rules),
            None => Vec::new(),
        };
        Progress {
            xid: job.xid.clone(),
            fence: job.fence,
            new_fence: None,
            from: job.phase.status(),
            to,
            decision,
            owner,
            due_ms,
            last_error,
            branches: job.rows(),
            history,
            alerts,
        }
    }

    /// Applies a fenced write; false if the fence no longer holds or the store failed (the
    /// driver then stops and recovery takes over once the lease expires).
    pub(super) async fn write_fenced(&self, progress: Progress) -> bool {
        let xid = progress.xid.clone();
        let raised = !progress.alerts.is_empty();
        match self.store.progress(progress).await {
            Ok(Progressed::Applied) => {
                if raised {
                    self.wake_alerts.notify_one();
                }
                true
            }
            Ok(Progressed::Fenced) => {
                tracing::info!(%xid, "another coordinator owns the transaction now; stopping");
                false
            }
            Err(e) => {
                tracing::warn!(%xid, error = %e, "store write failed; recovery will continue the transaction");
                false
            }
        }
    }
}
