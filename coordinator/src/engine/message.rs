//! Two-phase messages: PrepareMessage stores the definition in PREPARED; Submit and Abort are
//! decisions like a TCC Commit and Rollback ([`Engine::decide`] with [`Kind::Message`]);
//! recovery checks back on a prepared message whose initiator went silent and follows the
//! answer - delivered, dropped, or (any other answer) asked again later.

use dtx_proto::trace::TRACEPARENT;
use dtx_proto::v1::{BranchAction, PrepareMessageRequest};
use prost::Message;
use tokio::time::Instant;

use super::Engine;
use super::metrics::outcome_label;
use super::participants::Call;
use super::saga::{entering_xid, same_definition};
use crate::domain::history::{Entry, Event};
use crate::domain::job::{CallOutcome, Phase};
use crate::domain::message::{MessagePlan, next_check_back_ms};
use crate::domain::{BranchId, Decision, Fence, GlobalRow, Kind, TxRecord, TxStatus};
use crate::error::{Error, Result};
use crate::store::{Created, Progress, Progressed, SubmitSaga};

impl Engine {
    /// Validates and stores a message in PREPARED (one write); nothing is delivered before it
    /// is submitted or its check-back finds the local commit. An identical repeat returns the
    /// existing message.
    pub async fn prepare_message(&self, mut request: PrepareMessageRequest) -> Result<GlobalRow> {
        let xid = entering_xid(&mut request.xid)?;
        let plan = MessagePlan::from_request(&request, self.inner.config.check_back_after)?;
        for branch in &request.branches {
            self.check_target(&branch.target)?;
        }
        self.check_target(&plan.check_back.target)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        // Canonical form: the resolved delay, so "0 (default)" and its value are one message.
        let after_ms = plan.check_back_after.as_millis() as i64;
        request.check_back_after_ms = after_ms as u64;
        let now = self.inner.now_ms();
        let global = GlobalRow {
            xid: xid.clone(),
            kind: Kind::Message,
            status: TxStatus::Prepared,
            decision: None,
            timeout_ms: after_ms,
            deadline_ms: now + after_ms,
            spec: Some(request.encode_to_vec()),
            branch_count: request.branches.len() as i64,
            owner: None,
            fence: Fence::UNCLAIMED,
            due_ms: Some(now + after_ms),
            last_error: None,
            created_ms: now,
            updated_ms: now,
        };
        let write = SubmitSaga {
            global: global.clone(),
        };
        match self.inner.store.submit_saga(write).await? {
            Created::Inserted => {
                self.inner.metrics.started(Kind::Message);
                Ok(global)
            }
            Created::Exists(row)
                if row.kind == Kind::Message && same_definition(&row.spec, &request, untraced) =>
            {
                Ok(row)
            }
            Created::Exists(row) => Err(Error::Conflict(format!(
                "xid {xid:?} is already used by {}",
                match row.kind {
                    Kind::Message => "a different message definition",
                    Kind::Saga => "a saga",
                    Kind::Tcc => "a TCC transaction",
                }
            ))),
        }
    }

    /// The definition of a stored message.
    pub(super) fn message_plan(&self, global: &GlobalRow) -> Result<MessagePlan> {
        let xid = &global.xid;
        let spec = global
            .spec
            .as_deref()
            .ok_or_else(|| Error::Corrupt(format!("message {xid:?} has no definition")))?;
        let request = PrepareMessageRequest::decode(spec)
            .map_err(|e| Error::Corrupt(format!("message {xid:?} definition: {e}")))?;
        Ok(MessagePlan::from_request(
            &request,
            self.inner.config.check_back_after,
        )?)
    }

    /// Asks the initiator's service whether a claimed PREPARED message's local transaction
    /// committed, and follows the answer: SUCCESS delivers, FAILURE drops, anything else
    /// (unknown, not sent) releases it to be asked again after a backoff.
    pub(super) async fn check_back(&self, record: TxRecord) {
        let g = record.global;
        let plan = match self.message_plan(&g) {
            Ok(plan) => plan,
            Err(e) => {
                tracing::error!(xid = %g.xid, error = %e, "cannot check back on a message");
                return;
            }
        };
        let check_back = &plan.check_back;
        let call = Call {
            target: check_back.target.clone(),
            xid: g.xid.clone(),
            branch_id: BranchId::checked(dtx_proto::MESSAGE_BRANCH.to_string()),
            action: BranchAction::CheckBack,
            handler: check_back.handler.clone(),
            payload: Vec::new(),
            headers: check_back.headers.clone(),
            timeout: check_back.policy.call_timeout,
        };
        let started = Instant::now();
        let outcome = self.inner.participants.call(call).await;
        self.inner.metrics.branch_call(
            &check_back.handler,
            "CHECK_BACK",
            outcome_label(&outcome),
            started.elapsed(),
        );
        let now = self.inner.now_ms();
        let instance = self.inner.config.instance.clone();
        let (to, decision, detail) = match outcome {
            CallOutcome::Success(_) => (
                TxStatus::Committing,
                Some(Decision::Commit),
                "check-back: the local transaction committed".to_string(),
            ),
            CallOutcome::Failure(m) => (
                TxStatus::RollingBack,
                Some(Decision::Rollback),
                format!("check-back: the local transaction did not commit ({m})"),
            ),
            CallOutcome::Unknown(m) | CallOutcome::NotSent(m) => {
                (TxStatus::Prepared, None, format!("check-back: {m}"))
            }
        };
        let (owner, due_ms, entry, last_error) = match decision {
            Some(_) => {
                let lease = self.inner.config.lease.as_millis() as i64;
                let entry = Entry::tx(now, Event::Decided, Some(to));
                (Some(instance.clone()), Some(now + lease), entry, None)
            }
            None => {
                let policy = &check_back.policy;
                let due = next_check_back_ms(policy, g.deadline_ms, now, rand::random());
                let entry = Entry::tx(now, Event::AttemptUnknown, None);
                (None, Some(due), entry, Some(detail.clone()))
            }
        };
        let progress = Progress {
            xid: g.xid.clone(),
            fence: g.fence,
            new_fence: None,
            from: TxStatus::Prepared,
            to,
            decision,
            owner: owner.clone(),
            due_ms,
            last_error,
            branches: Vec::new(),
            history: vec![entry.detail(detail.as_str()).by(instance)],
            alerts: Vec::new(),
        };
        match self.inner.store.progress(progress).await {
            Ok(Progressed::Applied) => {}
            // Submitted or aborted meanwhile (or claimed again after our lease): theirs.
            Ok(Progressed::Fenced) => return,
            Err(e) => {
                tracing::warn!(xid = %g.xid, error = %e, "could not record a check-back's answer; it is asked again");
                return;
            }
        }
        let Some(decision) = decision else {
            tracing::info!(xid = %g.xid, %detail, "message checked back without an answer; asking again later");
            return;
        };
        tracing::info!(xid = %g.xid, %detail, "message checked back");
        let global = GlobalRow {
            status: to,
            decision: Some(decision),
            owner,
            due_ms,
            ..g
        };
        let record = TxRecord {
            global,
            branches: record.branches,
        };
        match self.job(&record, record.global.fence, Phase::Settle(decision)) {
            Ok(job) => self.spawn(job, record.global),
            Err(e) => {
                tracing::error!(xid = %record.global.xid, error = %e, "cannot drive a checked-back message")
            }
        }
    }
}

/// A message definition without the trace context: a repeat from another attempt of the
/// caller carries another one.
fn untraced(request: &mut PrepareMessageRequest) {
    request.headers.remove(TRACEPARENT);
    for branch in &mut request.branches {
        branch.headers.remove(TRACEPARENT);
    }
}
