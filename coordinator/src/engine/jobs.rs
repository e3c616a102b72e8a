//! The transactions this instance drives: building a driver's job from a stored record and
//! running the driver in the background, visible to Get and Wait while it runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dtx_proto::limits;
use dtx_proto::v1::SubmitSagaRequest;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::{Active, Engine, View, driver};
use crate::domain::backoff::RetryPolicy;
use crate::domain::graph::Graph;
use crate::domain::job::{Job, Phase, StepRun};
use crate::domain::saga::{SagaPlan, Step};
use crate::domain::{BranchId, BranchRow, BranchState, Decision, Fence, GlobalRow, Kind, TxRecord};
use crate::error::{Error, Result};

impl Engine {
    pub(super) fn active(&self, xid: &str) -> Option<Arc<Active>> {
        self.inner
            .active
            .lock()
            .expect("active lock")
            .get(xid)
            .cloned()
    }

    /// Builds the driver's job for a record in `phase`, holding `fence`.
    pub(super) fn job(&self, record: &TxRecord, fence: Fence, phase: Phase) -> Result<Job> {
        let g = &record.global;
        let (graph, steps) = match g.kind {
            Kind::Tcc => {
                let steps = record
                    .branches
                    .iter()
                    .map(|b| {
                        let policy = RetryPolicy {
                            call_timeout: if b.call_timeout_ms > 0 {
                                Duration::from_millis(b.call_timeout_ms as u64)
                            } else {
                                limits::DEFAULT_CALL_TIMEOUT
                            },
                            ..RetryPolicy::default()
                        };
                        let mut row = b.clone();
                        let (payload, headers) = (
                            std::mem::take(&mut row.payload),
                            std::mem::take(&mut row.headers),
                        );
                        StepRun::new(row, Vec::new(), payload, headers, policy)
                    })
                    .collect::<Vec<_>>();
                (Graph::independent(steps.len()), steps)
            }
            Kind::Saga => {
                let spec = g
                    .spec
                    .as_deref()
                    .ok_or_else(|| Error::Corrupt(format!("saga {:?} has no definition", g.xid)))?;
                let request = SubmitSagaRequest::decode(spec)
                    .map_err(|e| Error::Corrupt(format!("saga {:?} definition: {e}", g.xid)))?;
                let plan = SagaPlan::from_request(&request)?;
                let steps = planned_steps(record, plan.steps, |s| {
                    (s.action_payload, s.compensate_payload)
                });
                (plan.graph, steps)
            }
            Kind::Message => {
                let plan = self.message_plan(g)?;
                // A delivery is the message's phase two: an action that is never undone.
                let mut steps =
                    planned_steps(record, plan.steps, |s| (Vec::new(), s.action_payload));
                // A dropped message's deliveries never happen.
                if phase == Phase::Settle(Decision::Rollback) {
                    for step in &mut steps {
                        step.row.state = BranchState::Skipped;
                    }
                }
                (plan.graph, steps)
            }
        };
        Ok(Job::new(
            g.xid.clone(),
            g.kind,
            fence,
            phase,
            (g.kind == Kind::Saga).then_some(g.deadline_ms),
            graph,
            steps,
        ))
    }

    /// Runs a driver for `job` in the background, visible to Get/Wait while it runs.
    pub(super) fn spawn(&self, job: Job, global: GlobalRow) {
        let xid = job.xid.clone();
        let (nudge, nudges) = mpsc::unbounded_channel();
        let active = Arc::new(Active {
            global,
            view: watch::channel(View {
                status: job.phase.status(),
                branches: Vec::new(),
                last_error: None,
                ended: None,
            })
            .0,
            nudge,
        });
        self.inner
            .active
            .lock()
            .expect("active lock")
            .insert(xid.clone(), active.clone());
        let inner = self.inner.clone();
        inner.drivers.fetch_add(1, Ordering::SeqCst);
        let span = tracing::info_span!("tx", xid = %xid, kind = %job.kind);
        tokio::spawn(
            async move {
                let ended = driver::drive(inner.clone(), job, active.clone(), nudges).await;
                tracing::debug!(?ended, "driver ended");
                active.view.send_modify(|v| v.ended = Some(ended));
                let mut map = inner.active.lock().expect("active lock");
                if map.get(&xid).is_some_and(|a| Arc::ptr_eq(a, &active)) {
                    map.remove(&xid);
                }
                drop(map);
                inner.drivers.fetch_sub(1, Ordering::SeqCst);
            }
            .instrument(span),
        );
    }
}

/// The driver's steps of a planned definition (saga or message), each with the row recorded for
/// it if any (else a fresh one in definition order); `payloads` gives each step's forward and
/// phase-two payloads.
fn planned_steps(
    record: &TxRecord,
    steps: Vec<Step>,
    payloads: impl Fn(Step) -> (Vec<u8>, Vec<u8>),
) -> Vec<StepRun> {
    let recorded: HashMap<&str, &BranchRow> = record
        .branches
        .iter()
        .map(|b| (b.branch_id.as_str(), b))
        .collect();
    steps
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let row = recorded
                .get(s.name.as_str())
                .map(|r| (*r).clone())
                .unwrap_or_else(|| BranchRow {
                    branch_id: BranchId::checked(s.name.clone()),
                    seq: i as i64,
                    target: s.target.clone(),
                    handler: s.handler.clone(),
                    ..BranchRow::default()
                });
            let (headers, retry) = (s.headers.clone(), s.retry);
            let (forward, settle) = payloads(s);
            StepRun::new(row, forward, settle, headers, retry)
        })
        .collect()
}
