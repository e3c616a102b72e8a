//! Sagas: one write stores the whole definition, then this instance runs it.

use dtx_proto::trace::TRACEPARENT;
use dtx_proto::v1::SubmitSagaRequest;
use prost::Message;

use super::Engine;
use crate::domain::job::Phase;
use crate::domain::saga::SagaPlan;
use crate::domain::{Fence, GlobalRow, Kind, TxRecord, TxStatus, Xid};
use crate::error::{Error, Result};
use crate::store::{Created, SubmitSaga};

impl Engine {
    /// Validates and stores a saga in one write, then runs it. An identical repeat returns the
    /// existing saga.
    pub async fn submit_saga(&self, mut request: SubmitSagaRequest) -> Result<GlobalRow> {
        // How long the caller waits is not part of the definition.
        request.wait_timeout_ms = 0;
        let (xid, plan) = self.admit_saga(&mut request)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        // Canonical form: the resolved timeout, so "0 (default)" and "60000" are the same saga.
        request.timeout_ms = plan.timeout.as_millis() as u64;
        let spec = request.encode_to_vec();
        let now = self.inner.now_ms();
        let fence = Fence::fresh();
        let global = GlobalRow {
            xid: xid.clone(),
            kind: Kind::Saga,
            status: TxStatus::Running,
            decision: None,
            timeout_ms: request.timeout_ms as i64,
            deadline_ms: now + request.timeout_ms as i64,
            spec: Some(spec),
            branch_count: request.steps.len() as i64,
            owner: Some(self.inner.config.instance.clone()),
            fence,
            due_ms: Some(now + self.inner.config.lease.as_millis() as i64),
            last_error: None,
            created_ms: now,
            updated_ms: now,
        };
        match self
            .inner
            .store
            .submit_saga(SubmitSaga {
                global: global.clone(),
            })
            .await?
        {
            Created::Inserted => {
                self.inner.metrics.started(Kind::Saga);
                let record = TxRecord {
                    global: global.clone(),
                    branches: Vec::new(),
                };
                let job = self.job(&record, fence, Phase::Forward)?;
                self.spawn(job, record.global);
                Ok(global)
            }
            Created::Exists(row)
                if row.kind == Kind::Saga && same_definition(&row.spec, &request, untraced) =>
            {
                Ok(row)
            }
            Created::Exists(row) => Err(Error::Conflict(format!(
                "xid {xid:?} is already used by {}",
                match row.kind {
                    Kind::Saga => "a different saga definition",
                    Kind::Tcc => "a TCC transaction",
                    Kind::Message => "a message",
                }
            ))),
        }
    }
}

impl Engine {
    /// A submitted saga as it enters, in one step: its xid (the caller's, checked, or a fresh
    /// one, written back into the definition), its plan (limits, names, dependencies) and every
    /// step's target against the allowlist. Nothing is stored unless all of it holds.
    fn admit_saga(&self, request: &mut SubmitSagaRequest) -> Result<(Xid, SagaPlan)> {
        let xid = entering_xid(&mut request.xid)?;
        let plan = SagaPlan::from_request(request)?;
        for step in &plan.steps {
            self.check_target(&step.target)?;
        }
        Ok((xid, plan))
    }
}

/// The xid of a definition as it enters: the caller's, checked, or a fresh one for a caller
/// that named none; written back so the stored definition carries it.
pub(super) fn entering_xid(field: &mut String) -> Result<Xid> {
    let xid = match field.as_str() {
        "" => Xid::generate(),
        _ => Xid::parse(std::mem::take(field))?,
    };
    *field = xid.to_string();
    Ok(xid)
}

/// Whether a stored definition is `request` again, compared without what `untraced` removes:
/// the trace context, which a repeat from another attempt of the caller carries anew.
pub(super) fn same_definition<M: Message + Default + PartialEq + Clone>(
    stored: &Option<Vec<u8>>,
    request: &M,
    untraced: fn(&mut M),
) -> bool {
    let Some(mut stored) = stored.as_deref().and_then(|spec| M::decode(spec).ok()) else {
        return false;
    };
    let mut request = request.clone();
    untraced(&mut stored);
    untraced(&mut request);
    stored == request
}

/// A saga definition without its trace context.
fn untraced(request: &mut SubmitSagaRequest) {
    request.headers.remove(TRACEPARENT);
    for step in &mut request.steps {
        step.headers.remove(TRACEPARENT);
    }
}
