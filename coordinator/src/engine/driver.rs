//! The driver: carries one transaction from where it stands to a terminal status.
//!
//! One mechanism serves TCC and sagas. A transaction is a graph of steps (TCC branches have no
//! edges) in one of two phases:
//! * **forward** (saga RUNNING): start each step once its dependencies are done; retry an
//!   unknown outcome with backoff up to the step's attempt budget. A refusal, an exhausted
//!   budget or the deadline *turns* the saga to compensation: no new step starts, in-flight
//!   calls are awaited, the turn is written durably, then compensation begins;
//! * **settle** (TCC COMMITTING/ROLLING_BACK, saga COMPENSATING): Confirm/Cancel/compensate
//!   every step that needs it, in reverse dependency order, retrying unknown outcomes until
//!   they succeed. A refusal marks the step STUCK; once nothing else can progress the
//!   transaction parks in NEEDS_ATTENTION.
//!
//! Progress of individual steps is not written on the hot path: repeating a call is safe (the
//! participant's barrier answers repeats), so a crash costs repeated calls, not correctness.
//! The store is written only at the turn, at the end, when parking, when renewing the lease of
//! a long-running transaction, and when handing a slow retry back to recovery. Every write
//! carries the driver's fencing token; a fenced write means another coordinator took over, and
//! this driver stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dtx_proto::v1::BranchAction;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::participants::{Call, CallOutcome};
use super::{Active, Inner};
use crate::domain::backoff::RetryPolicy;
use crate::domain::graph::{
    Graph, forward_complete, saga_needs_compensation, take_over_forward, tcc_needs_settling,
    turn_to_compensation,
};
use crate::domain::{BranchRow, BranchState, Decision, Kind, TxStatus};
use crate::store::{Progress, Progressed};

/// Where a transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Settle(Decision),
}

impl Phase {
    pub fn status(self) -> TxStatus {
        match self {
            Phase::Forward => TxStatus::Running,
            Phase::Settle(d) => TxStatus::of_decision(d).0,
        }
    }
}

/// One step as the driver runs it.
#[derive(Debug, Clone)]
pub struct StepRun {
    /// Identity, state, attempts, last error and result, as recorded.
    pub row: BranchRow,
    pub forward_payload: Vec<u8>,
    pub settle_payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub policy: RetryPolicy,
    /// Not before this instant (backoff).
    next_at: Option<Instant>,
    in_flight: bool,
}

impl StepRun {
    pub fn new(
        row: BranchRow,
        forward_payload: Vec<u8>,
        settle_payload: Vec<u8>,
        headers: BTreeMap<String, String>,
        policy: RetryPolicy,
    ) -> Self {
        StepRun {
            row,
            forward_payload,
            settle_payload,
            headers,
            policy,
            next_at: None,
            in_flight: false,
        }
    }
}

/// Everything needed to drive one transaction.
pub struct Job {
    pub xid: String,
    pub kind: Kind,
    pub fence: i64,
    pub phase: Phase,
    /// Forward progress must finish before this (Unix ms); sagas only.
    pub deadline_ms: Option<i64>,
    pub graph: Graph,
    pub steps: Vec<StepRun>,
}

/// Why the forward phase turns to compensation (kept as the transaction's last error).
struct Turn(String);

impl Job {
    /// Prepares a job read back from the store by recovery: in the forward phase every step
    /// not recorded as settled may have been sent by the previous driver.
    pub fn taken_over(mut self) -> Job {
        if self.phase == Phase::Forward {
            let mut states = self.states();
            take_over_forward(&mut states);
            for (step, state) in self.steps.iter_mut().zip(states) {
                step.row.state = state;
            }
        }
        self
    }

    fn needs(&self) -> fn(BranchState) -> bool {
        match self.kind {
            Kind::Tcc => tcc_needs_settling,
            Kind::Saga => saga_needs_compensation,
        }
    }

    fn states(&self) -> Vec<BranchState> {
        self.steps.iter().map(|s| s.row.state).collect()
    }

    fn rows(&self) -> Vec<BranchRow> {
        self.steps.iter().map(|s| s.row.clone()).collect()
    }

    /// Steps that may be called now or after their backoff, in this phase.
    fn candidates(&self) -> Vec<usize> {
        let states = self.states();
        let in_flight: Vec<bool> = self.steps.iter().map(|s| s.in_flight).collect();
        match self.phase {
            Phase::Forward => self.graph.runnable(&states, &in_flight),
            Phase::Settle(_) => self.graph.settleable(&states, &in_flight, self.needs()),
        }
    }

    fn phase_complete(&self) -> bool {
        let states = self.states();
        match self.phase {
            Phase::Forward => forward_complete(&states),
            Phase::Settle(_) => !states.iter().any(|s| (self.needs())(*s)),
        }
    }

    fn call(&self, i: usize) -> Call {
        let step = &self.steps[i];
        let (action, payload) = match self.phase {
            Phase::Forward => (BranchAction::Action, &step.forward_payload),
            Phase::Settle(Decision::Commit) => (BranchAction::Confirm, &step.settle_payload),
            Phase::Settle(Decision::Rollback) => (BranchAction::Cancel, &step.settle_payload),
            Phase::Settle(Decision::Compensate) => (BranchAction::Compensate, &step.settle_payload),
        };
        Call {
            target: step.row.target.clone(),
            xid: self.xid.clone(),
            branch_id: step.row.branch_id.clone(),
            action,
            handler: step.row.handler.clone(),
            payload: payload.clone(),
            headers: step.headers.clone(),
            timeout: step.policy.call_timeout,
        }
    }

    /// Records a call's outcome; returns a reason to turn to compensation, if any.
    fn record(&mut self, i: usize, outcome: CallOutcome) -> Option<Turn> {
        let phase = self.phase;
        let step = &mut self.steps[i];
        step.in_flight = false;
        let name = step.row.branch_id.clone();
        match (phase, outcome) {
            (Phase::Forward, CallOutcome::Success(result)) => {
                step.row.state = BranchState::Done;
                step.row.result = Some(result);
                step.row.last_error = None;
                None
            }
            (Phase::Forward, CallOutcome::Failure(m) | CallOutcome::NotSent(m)) => {
                step.row.state = BranchState::Refused;
                step.row.last_error = Some(m.clone());
                Some(Turn(format!("step {name} refused: {m}")))
            }
            (Phase::Forward, CallOutcome::Unknown(m)) => {
                step.row.last_error = Some(m.clone());
                if step.row.attempts >= i64::from(step.policy.max_attempts) {
                    return Some(Turn(format!(
                        "step {name} gave no answer in {} attempts: {m}",
                        step.row.attempts
                    )));
                }
                step.next_at = Some(Instant::now() + backoff(&step.policy, step.row.attempts));
                None
            }
            (Phase::Settle(decision), CallOutcome::Success(_)) => {
                step.row.state = match decision {
                    Decision::Commit => BranchState::Confirmed,
                    Decision::Rollback => BranchState::Cancelled,
                    Decision::Compensate => BranchState::Compensated,
                };
                step.row.last_error = None;
                None
            }
            (Phase::Settle(_), CallOutcome::Failure(m) | CallOutcome::NotSent(m)) => {
                step.row.state = BranchState::Stuck;
                step.row.last_error = Some(m);
                None
            }
            (Phase::Settle(_), CallOutcome::Unknown(m)) => {
                step.row.last_error = Some(m);
                step.next_at = Some(Instant::now() + backoff(&step.policy, step.row.attempts));
                None
            }
        }
    }
}

fn backoff(policy: &RetryPolicy, attempts: i64) -> Duration {
    policy.backoff(
        attempts.clamp(1, i64::from(u32::MAX)) as u32,
        rand::random::<f64>(),
    )
}

/// `instant` on the database's clock.
fn unix_ms_at(inner: &Inner, instant: Instant) -> i64 {
    inner.now_ms()
        + instant
            .saturating_duration_since(Instant::now())
            .as_millis() as i64
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

/// Drives `job` until it settles, is handed off, or ownership is lost.
pub async fn drive(inner: Arc<Inner>, mut job: Job, active: Arc<Active>) -> Ended {
    let lease = inner.config.lease;
    let mut renew_at = Instant::now() + lease / 3;
    let mut calls: Pending = FuturesUnordered::new();
    let mut turn: Option<Turn> = None;
    let mut shutdown = inner.shutdown.subscribe();
    publish(&active, &job, None);
    loop {
        let now = Instant::now();
        if job.phase == Phase::Forward
            && turn.is_none()
            && job.deadline_ms.is_some_and(|d| inner.now_ms() >= d)
        {
            turn = Some(Turn("deadline passed before every step succeeded".into()));
        }
        // Start what may start. Nothing new starts once the saga is turning.
        let candidates = if turn.is_none() {
            job.candidates()
        } else {
            Vec::new()
        };
        let mut next_timer: Option<Instant> = None;
        for &i in &candidates {
            match job.steps[i].next_at {
                Some(at) if at > now => next_timer = Some(next_timer.map_or(at, |t| t.min(at))),
                _ => {
                    let call = job.call(i);
                    let step = &mut job.steps[i];
                    step.in_flight = true;
                    step.next_at = None;
                    step.row.attempts += 1;
                    if job.phase == Phase::Forward {
                        // From now on the action may have run.
                        step.row.state = BranchState::InDoubt;
                    }
                    let participants = inner.participants.clone();
                    calls.push(Box::pin(async move { (i, participants.call(call).await) }));
                }
            }
        }
        if calls.is_empty() {
            if let Some(Turn(reason)) = turn.take() {
                match turn_to_compensation_durably(&inner, &mut job, reason.clone()).await {
                    Ok(()) => {
                        publish(&active, &job, Some(&reason));
                        continue;
                    }
                    Err(ended) => return ended,
                }
            }
            if job.phase_complete() {
                let to = match job.phase {
                    Phase::Forward => TxStatus::Succeeded,
                    Phase::Settle(d) => TxStatus::of_decision(d).1,
                };
                return settle(&inner, &job, &active, to, None).await;
            }
            if next_timer.is_none() {
                // Nothing in flight, nothing waiting: what is left is stuck (or behind a stuck
                // step). Park for an operator.
                let stuck: Vec<String> = job
                    .steps
                    .iter()
                    .filter(|s| s.row.state == BranchState::Stuck)
                    .map(|s| {
                        format!(
                            "{}: {}",
                            s.row.branch_id,
                            s.row.last_error.clone().unwrap_or_default()
                        )
                    })
                    .collect();
                let reason = format!(
                    "refused during {}: {}",
                    job.phase.status(),
                    stuck.join("; ")
                );
                inner.metrics.parked();
                tracing::error!(xid = %job.xid, %reason, "transaction needs attention");
                return settle(
                    &inner,
                    &job,
                    &active,
                    TxStatus::NeedsAttention,
                    Some(reason),
                )
                .await;
            }
            let wait = next_timer.map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
            if wait >= inner.config.handoff_after {
                return hand_off(
                    &inner,
                    &job,
                    &active,
                    next_timer.map(|t| unix_ms_at(&inner, t)),
                )
                .await;
            }
        }
        let mut wake = renew_at;
        if let Some(t) = next_timer {
            wake = wake.min(t);
        }
        if let Some(d) = job
            .deadline_ms
            .filter(|_| job.phase == Phase::Forward && turn.is_none())
        {
            let until = Duration::from_millis((d - inner.now_ms()).max(0) as u64);
            wake = wake.min(now + until);
        }
        tokio::select! {
            Some((i, outcome)) = calls.next(), if !calls.is_empty() => {
                if let Some(t) = job.record(i, outcome) {
                    turn.get_or_insert(t);
                }
                publish(&active, &job, None);
            }
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.changed() => {
                // Let in-flight calls finish (bounded by their timeouts) so their outcome is
                // known, then hand the transaction back for another instance to continue now.
                while let Some((i, outcome)) = calls.next().await {
                    if let Some(t) = job.record(i, outcome) {
                        turn.get_or_insert(t);
                    }
                }
                return hand_off(&inner, &job, &active, Some(inner.now_ms())).await;
            }
        }
        if Instant::now() >= renew_at {
            let progress = inner.progress(
                &job,
                job.phase.status(),
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

/// RUNNING -> COMPENSATING, durably, before any compensation is sent.
async fn turn_to_compensation_durably(
    inner: &Inner,
    job: &mut Job,
    reason: String,
) -> Result<(), Ended> {
    let mut states = job.states();
    turn_to_compensation(&mut states);
    for (step, state) in job.steps.iter_mut().zip(states) {
        step.row.state = state;
        step.next_at = None;
    }
    let due = inner.now_ms() + inner.config.lease.as_millis() as i64;
    let progress = inner.progress(
        job,
        TxStatus::Compensating,
        Some(inner.config.instance.clone()),
        Some(due),
        Some(reason.clone()),
    );
    if !inner.write_fenced(progress).await {
        return Err(Ended::Lost);
    }
    tracing::info!(xid = %job.xid, %reason, "saga turned to compensation");
    job.phase = Phase::Settle(Decision::Compensate);
    Ok(())
}

/// Writes the final (or parked) status; the transaction no longer belongs to anyone.
///
/// Once every Confirm/Cancel/compensation of a decided transaction was delivered, its outcome
/// is certain - recovery after a crash could only deliver them again - so waiters learn it
/// before the final row is written. A saga's success is announced only once durable: until
/// then a recovery past the deadline would compensate it instead.
async fn settle(
    inner: &Inner,
    job: &Job,
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
    inner.metrics.finished(to);
    if !certain {
        announce(active);
    }
    Ended::Settled(to)
}

/// Records progress and releases ownership; recovery continues at `due_ms`.
async fn hand_off(inner: &Inner, job: &Job, active: &Active, due_ms: Option<i64>) -> Ended {
    let progress = inner.progress(
        job,
        job.phase.status(),
        None,
        due_ms.or(Some(inner.now_ms())),
        None,
    );
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
    /// A fenced progress write for `job`, moving it to `to`.
    pub(super) fn progress(
        &self,
        job: &Job,
        to: TxStatus,
        owner: Option<String>,
        due_ms: Option<i64>,
        last_error: Option<String>,
    ) -> Progress {
        let decision = to.implied_decision().or(match job.phase {
            Phase::Settle(d) => Some(d),
            Phase::Forward => None,
        });
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
        }
    }

    /// Applies a fenced write; false if the fence no longer holds or the store failed (the
    /// driver then stops and recovery takes over once the lease expires).
    pub(super) async fn write_fenced(&self, progress: Progress) -> bool {
        let xid = progress.xid.clone();
        match self.store.progress(progress).await {
            Ok(Progressed::Applied) => true,
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

#[cfg(test)]
mod tests {
    //! The driver's pure bookkeeping (which step may be called, what an answer does), run
    //! against random graphs and random answers with the async loop replaced by a simple
    //! simulation: nothing starts before its dependencies are done, nothing is compensated
    //! while a step depending on it still needs it, no action starts after the turn, settled
    //! steps never change, and every run ends.
    use super::*;
    use proptest::prelude::*;

    fn job(kind: Kind, deps: &[Vec<usize>], phase: Phase) -> Job {
        let mut graph = Graph::independent(deps.len());
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                graph.add_edge(d, i);
            }
        }
        let steps = (0..deps.len())
            .map(|i| {
                let row = BranchRow {
                    branch_id: format!("s{i}"),
                    ..BranchRow::default()
                };
                let policy = RetryPolicy {
                    max_attempts: 3,
                    ..RetryPolicy::default()
                };
                StepRun::new(row, Vec::new(), Vec::new(), BTreeMap::new(), policy)
            })
            .collect();
        Job {
            xid: "x".into(),
            kind,
            fence: 1,
            phase,
            deadline_ms: None,
            graph,
            steps,
        }
    }

    fn outcome(code: u8) -> CallOutcome {
        match code % 8 {
            0..=3 => CallOutcome::Success(b"r".to_vec()),
            4 | 5 => CallOutcome::Unknown("timeout".into()),
            6 => CallOutcome::Failure("no".into()),
            _ => CallOutcome::NotSent("bad".into()),
        }
    }

    fn dag() -> impl Strategy<Value = Vec<Vec<usize>>> {
        (1usize..7).prop_flat_map(|n| {
            (0..n)
                .map(|i| {
                    proptest::collection::vec(0..i.max(1), 0..=i.min(3))
                        .prop_map(move |d| if i == 0 { vec![] } else { d })
                })
                .collect::<Vec<_>>()
        })
    }

    /// Simulates the driver: start some callable steps, answer some in-flight calls, turn when
    /// told to once nothing is in flight. Returns the final phase and states.
    fn simulate(
        mut job: Job,
        answers: &[u8],
        picks: &[u8],
    ) -> Result<(Phase, Vec<BranchState>), TestCaseError> {
        let mut turn = false;
        // After the scripted answers every call succeeds: retries must then end the run.
        let mut a = answers.iter().copied().chain(std::iter::repeat(0));
        let mut p = picks.iter().cycle();
        let settled = |s: BranchState| {
            matches!(
                s,
                BranchState::Confirmed | BranchState::Cancelled | BranchState::Compensated
            )
        };
        for _ in 0..2000 {
            let in_flight: Vec<usize> = (0..job.steps.len())
                .filter(|&i| job.steps[i].in_flight)
                .collect();
            let callable = if turn { Vec::new() } else { job.candidates() };
            if in_flight.is_empty() {
                if turn {
                    let mut states = job.states();
                    turn_to_compensation(&mut states);
                    for (s, st) in job.steps.iter_mut().zip(states) {
                        s.row.state = st;
                    }
                    job.phase = Phase::Settle(Decision::Compensate);
                    turn = false;
                    continue;
                }
                if job.phase_complete() || callable.is_empty() {
                    return Ok((job.phase, job.states()));
                }
            }
            // Start some of what may start (at least one if nothing runs).
            for (k, &i) in callable.iter().enumerate() {
                if k > 0 && p.next().unwrap().is_multiple_of(2) && !in_flight.is_empty() {
                    continue;
                }
                if job.phase == Phase::Forward {
                    prop_assert!(
                        job.graph
                            .deps(i)
                            .iter()
                            .all(|&d| job.steps[d].row.state == BranchState::Done)
                    );
                } else {
                    let needs = job.needs();
                    prop_assert!(
                        job.graph
                            .dependents(i)
                            .iter()
                            .all(|&d| !needs(job.steps[d].row.state))
                    );
                    prop_assert!(!settled(job.steps[i].row.state));
                }
                let step = &mut job.steps[i];
                step.in_flight = true;
                step.row.attempts += 1;
                if job.phase == Phase::Forward {
                    step.row.state = BranchState::InDoubt;
                }
            }
            // Answer one in-flight call.
            let in_flight: Vec<usize> = (0..job.steps.len())
                .filter(|&i| job.steps[i].in_flight)
                .collect();
            if let Some(&i) = in_flight.get(*p.next().unwrap() as usize % in_flight.len().max(1)) {
                let before = job.states();
                let phase = job.phase;
                if job.record(i, outcome(a.next().unwrap())).is_some() {
                    prop_assert_eq!(phase, Phase::Forward, "only the forward phase turns");
                    turn = true;
                }
                for (j, (b, now)) in before.iter().zip(job.states()).enumerate() {
                    if j != i {
                        prop_assert_eq!(*b, now, "an answer changed another step");
                    }
                    if settled(*b) {
                        prop_assert_eq!(*b, now, "a settled step changed");
                    }
                }
            }
        }
        Err(TestCaseError::fail("the simulation did not end"))
    }

    proptest! {
        #[test]
        fn saga_scheduling_respects_dependencies_and_ends(
            deps in dag(),
            answers in proptest::collection::vec(any::<u8>(), 1..40),
            picks in proptest::collection::vec(any::<u8>(), 1..40),
        ) {
            let (phase, states) = simulate(job(Kind::Saga, &deps, Phase::Forward), &answers, &picks)?;
            match phase {
                Phase::Forward => prop_assert!(states.iter().all(|s| *s == BranchState::Done), "{states:?}"),
                Phase::Settle(_) => {
                    prop_assert!(!states.contains(&BranchState::Pending), "a step was never decided: {states:?}");
                    prop_assert!(!states.contains(&BranchState::Done) && !states.contains(&BranchState::InDoubt)
                        || states.contains(&BranchState::Stuck), "left uncompensated: {states:?}");
                }
            }
        }

        #[test]
        fn tcc_phase_two_settles_every_branch_or_parks(
            n in 1usize..6,
            commit in any::<bool>(),
            answers in proptest::collection::vec(any::<u8>(), 1..40),
            picks in proptest::collection::vec(any::<u8>(), 1..40),
        ) {
            let decision = if commit { Decision::Commit } else { Decision::Rollback };
            let deps = vec![Vec::new(); n];
            let (_, states) = simulate(job(Kind::Tcc, &deps, Phase::Settle(decision)), &answers, &picks)?;
            let done = if commit { BranchState::Confirmed } else { BranchState::Cancelled };
            prop_assert!(states.iter().all(|s| *s == done || *s == BranchState::Stuck), "{states:?}");
        }
    }
}
