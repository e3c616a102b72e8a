//! One transaction as its driver carries it, and every decision of the driver as one pure step
//! function, [`Job::next`]: the engine's driver only performs what it returns (calls, writes,
//! waits), so the rules are tested here on their own, against a simulated clock.
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
//! Times are milliseconds on the database's clock, the one clock every instance shares.

use std::collections::BTreeMap;

use super::backoff::RetryPolicy;
use super::graph::{
    Graph, forward_complete, saga_needs_compensation, take_over_forward, tcc_needs_settling,
    turn_to_compensation,
};
use super::history::{Entry, Event};
use super::{BranchId, BranchRow, BranchState, Decision, Fence, Kind, TxRecord, TxStatus, Xid};
use crate::error::{Error, Result};

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

/// What a participant call established (classified by `dtx_proto::answer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// SUCCESS, with the result payload.
    Success(Vec<u8>),
    /// FAILURE in a well-formed response: an explicit refusal without effect.
    Failure(String),
    /// The call was never sent (the target is not a valid endpoint): no effect.
    NotSent(String),
    /// RETRY, a timeout, a transport error, any gRPC status: the effect may or may not
    /// have happened.
    Unknown(String),
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
    /// Not before this time (backoff).
    next_at_ms: Option<i64>,
    in_flight: bool,
}

impl StepRun {
    /// Waiting for a retry after a failed or unanswered attempt.
    pub fn waiting(&self) -> bool {
        self.next_at_ms.is_some()
    }

    /// The row keeps the step's identity and progress; its payload and headers, which the
    /// step holds already and progress writes never carry, are dropped from it (every
    /// transaction in flight would hold them twice, three times with the published view).
    pub fn new(
        mut row: BranchRow,
        forward_payload: Vec<u8>,
        settle_payload: Vec<u8>,
        headers: BTreeMap<String, String>,
        policy: RetryPolicy,
    ) -> Self {
        row.payload = Vec::new();
        row.headers = BTreeMap::new();
        StepRun {
            row,
            forward_payload,
            settle_payload,
            headers,
            policy,
            next_at_ms: None,
            in_flight: false,
        }
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }
}

/// Everything needed to drive one transaction.
#[derive(Debug, Clone)]
pub struct Job {
    pub xid: Xid,
    pub kind: Kind,
    pub fence: Fence,
    pub phase: Phase,
    /// Forward progress must finish before this; sagas only.
    pub deadline_ms: Option<i64>,
    pub graph: Graph,
    pub steps: Vec<StepRun>,
    /// Why the forward phase is turning to compensation, once it is.
    turn: Option<TurnReason>,
    /// History entries since the last durable write (see [`Job::take_history`]).
    history: Vec<Entry>,
}

/// Why a saga's forward phase turns to compensation. Its text (`Display`) is what the
/// transaction's `last_error` and history say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnReason {
    /// The saga's timeout passed before every step succeeded.
    DeadlinePassed,
    /// A step answered FAILURE (or could not be sent): its action had no effect.
    Refused { step: BranchId, error: String },
    /// A step's attempt budget ran out with its outcome still unknown.
    NoAnswer {
        step: BranchId,
        attempts: i64,
        error: String,
    },
}

impl std::fmt::Display for TurnReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TurnReason::DeadlinePassed => {
                f.write_str("deadline passed before every step succeeded")
            }
            TurnReason::Refused { step, error } => write!(f, "step {step} refused: {error}"),
            TurnReason::NoAnswer {
                step,
                attempts,
                error,
            } => write!(
                f,
                "step {step} gave no answer in {attempts} attempts: {error}"
            ),
        }
    }
}

/// Why nothing can progress and the transaction parks in NEEDS_ATTENTION: the steps that
/// refused in the phase it was in, each with its error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkReason {
    /// The phase's status (COMMITTING, ROLLING_BACK, COMPENSATING).
    pub during: TxStatus,
    /// `(branch id, last error)` of every STUCK step.
    pub stuck: Vec<(BranchId, String)>,
}

impl std::fmt::Display for ParkReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused during {}: ", self.during)?;
        for (i, (branch, error)) in self.stuck.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}{branch}: {error}")?;
        }
        Ok(())
    }
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Call these steps now (already counted as attempted and in flight).
    Start(Vec<usize>),
    /// Nothing is in flight and the saga must turn: call [`Job::turn_to_compensation`], write
    /// RUNNING -> COMPENSATING durably, then go on.
    Turn(TurnReason),
    /// Every step of the phase is done: write this final status.
    Settle(TxStatus),
    /// Nothing can progress (refused steps, or steps behind them): park in NEEDS_ATTENTION.
    Park(ParkReason),
    /// The next retry is further off than the hand-off bound: give the transaction back to
    /// recovery, due at this time.
    HandOff(i64),
    /// Wait for an in-flight call's answer, or until this time.
    Sleep(Option<i64>),
}

impl Job {
    pub fn new(
        xid: Xid,
        kind: Kind,
        fence: Fence,
        phase: Phase,
        deadline_ms: Option<i64>,
        graph: Graph,
        steps: Vec<StepRun>,
    ) -> Job {
        Job {
            xid,
            kind,
            fence,
            phase,
            deadline_ms,
            graph,
            steps,
            turn: None,
            history: Vec::new(),
        }
    }

    /// The history entries of calls and state changes since the last call, for the next
    /// durable write to record.
    pub fn take_history(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.history)
    }

    /// The history entries not yet written.
    pub fn history(&self) -> &[Entry] {
        &self.history
    }

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

    pub fn states(&self) -> Vec<BranchState> {
        self.steps.iter().map(|s| s.row.state).collect()
    }

    pub fn rows(&self) -> Vec<BranchRow> {
        self.steps.iter().map(|s| s.row.clone()).collect()
    }

    /// Whether a step in `state` still needs this transaction's phase two (a dropped
    /// message's branches never do: nothing was delivered).
    pub fn needs(&self) -> fn(BranchState) -> bool {
        match (self.kind, self.phase) {
            (Kind::Message, Phase::Settle(Decision::Rollback)) => |_| false,
            (Kind::Tcc | Kind::Message, _) => tcc_needs_settling,
            (Kind::Saga, _) => saga_needs_compensation,
        }
    }

    /// Deliveries go forward: a message's branch is called once its dependencies are done,
    /// where every other phase two settles in reverse dependency order.
    fn delivers(&self) -> bool {
        self.kind == Kind::Message && self.phase == Phase::Settle(Decision::Commit)
    }

    /// Decides what to do at `now_ms`; a retry due `handoff_after_ms` or later is handed back
    /// to recovery instead of waited for.
    pub fn next(&mut self, now_ms: i64, handoff_after_ms: i64) -> Next {
        let forward = self.phase == Phase::Forward;
        if forward && self.turn.is_none() && self.deadline_ms.is_some_and(|d| now_ms >= d) {
            self.turn = Some(TurnReason::DeadlinePassed);
        }
        // Start what may start. Nothing new starts once the saga is turning.
        let mut next_timer: Option<i64> = None;
        if self.turn.is_none() {
            let mut started = Vec::new();
            for i in self.candidates() {
                let step = &mut self.steps[i];
                match step.next_at_ms {
                    Some(at) if at > now_ms => {
                        next_timer = Some(next_timer.map_or(at, |t| t.min(at)));
                    }
                    _ => {
                        step.in_flight = true;
                        step.next_at_ms = None;
                        step.row.attempts += 1;
                        if forward {
                            // From now on the action may have run.
                            step.row.state = BranchState::InDoubt;
                        }
                        started.push(i);
                    }
                }
            }
            if !started.is_empty() {
                return Next::Start(started);
            }
        }
        if !self.steps.iter().any(|s| s.in_flight) {
            if let Some(reason) = self.turn.take() {
                return Next::Turn(reason);
            }
            if self.phase_complete() {
                return Next::Settle(match self.phase {
                    Phase::Forward => TxStatus::Succeeded,
                    Phase::Settle(d) => TxStatus::of_decision(d).1,
                });
            }
            let Some(timer) = next_timer else {
                return Next::Park(self.stuck_reason());
            };
            if timer - now_ms >= handoff_after_ms {
                return Next::HandOff(timer);
            }
        }
        let deadline = self
            .deadline_ms
            .filter(|_| self.phase == Phase::Forward && self.turn.is_none());
        Next::Sleep(match (next_timer, deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        })
    }

    /// Records a call's outcome at `now_ms`; `jitter` in [0, 1) spreads its backoff.
    pub fn record(&mut self, i: usize, outcome: CallOutcome, now_ms: i64, jitter: f64) {
        let (phase, delivers) = (self.phase, self.delivers());
        let step = &mut self.steps[i];
        step.in_flight = false;
        let name = step.row.branch_id.clone();
        let retry_at = |step: &StepRun| {
            let attempts = step.row.attempts.clamp(1, i64::from(u32::MAX)) as u32;
            now_ms + step.policy.backoff(attempts, jitter).as_millis() as i64
        };
        let (event, detail) = match &outcome {
            CallOutcome::Success(_) => (Event::Branch, None),
            CallOutcome::Failure(m) | CallOutcome::NotSent(m) => (Event::AttemptFailed, Some(m)),
            CallOutcome::Unknown(m) => (Event::AttemptUnknown, Some(m)),
        };
        let detail = detail.cloned();
        let turn = match (phase, outcome) {
            (Phase::Forward, CallOutcome::Success(result)) => {
                step.row.state = BranchState::Done;
                step.row.result = Some(result);
                step.row.last_error = None;
                None
            }
            (Phase::Forward, CallOutcome::Failure(m) | CallOutcome::NotSent(m)) => {
                step.row.state = BranchState::Refused;
                step.row.last_error = Some(m.clone());
                Some(TurnReason::Refused {
                    step: name.clone(),
                    error: m,
                })
            }
            (Phase::Forward, CallOutcome::Unknown(m)) => {
                step.row.last_error = Some(m.clone());
                if step.row.attempts >= i64::from(step.policy.max_attempts) {
                    Some(TurnReason::NoAnswer {
                        step: name.clone(),
                        attempts: step.row.attempts,
                        error: m,
                    })
                } else {
                    step.next_at_ms = Some(retry_at(step));
                    None
                }
            }
            (Phase::Settle(_), CallOutcome::Success(result)) if delivers => {
                step.row.state = BranchState::Done;
                step.row.result = Some(result);
                step.row.last_error = None;
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
                step.next_at_ms = Some(retry_at(step));
                None
            }
        };
        // A first attempt that succeeded is folded into the status change that follows it
        // (one history row less per branch on the common path).
        if event != Event::Branch || step.row.attempts > 1 {
            let entry = Entry::branch(now_ms, event, &name, step.row.state, step.row.attempts);
            self.history.push(match detail {
                Some(detail) => entry.detail(detail),
                None => entry,
            });
        }
        if let Some(reason) = turn {
            self.turn.get_or_insert(reason);
        }
    }

    /// Operator's RetryNow: every step waiting in backoff may start at once. Records `entry`
    /// if there was one; returns how many.
    pub fn retry_now(&mut self, entry: Entry) -> usize {
        let mut waiting = 0;
        for step in self.steps.iter_mut().filter(|s| !s.in_flight) {
            waiting += usize::from(step.next_at_ms.take().is_some());
        }
        if waiting > 0 {
            self.history.push(entry);
        }
        waiting
    }

    /// Turns the forward phase to compensation (in memory; the caller writes it): every step
    /// that may have run is to be compensated, no retry is pending.
    pub fn turn_to_compensation(&mut self, now_ms: i64) {
        let mut states = self.states();
        turn_to_compensation(&mut states);
        for (step, state) in self.steps.iter_mut().zip(states) {
            if step.row.state != state {
                let row = &step.row;
                let entry = Entry::branch(now_ms, Event::Branch, &row.branch_id, state, 0);
                self.history.push(entry);
            }
            step.row.state = state;
            step.next_at_ms = None;
        }
        self.phase = Phase::Settle(Decision::Compensate);
    }

    /// Steps that may be called now or after their backoff, in this phase.
    fn candidates(&self) -> Vec<usize> {
        let states = self.states();
        let in_flight: Vec<bool> = self.steps.iter().map(|s| s.in_flight).collect();
        match self.phase {
            Phase::Forward => self.graph.runnable(&states, &in_flight),
            Phase::Settle(_) if self.delivers() => self.graph.runnable(&states, &in_flight),
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

    /// Why nothing can progress: the refused steps and their errors.
    fn stuck_reason(&self) -> ParkReason {
        ParkReason {
            during: self.phase.status(),
            stuck: self
                .steps
                .iter()
                .filter(|s| s.row.state == BranchState::Stuck)
                .map(|s| {
                    let error = s.row.last_error.clone().unwrap_or_default();
                    (s.row.branch_id.clone(), error)
                })
                .collect(),
        }
    }
}

/// Resuming a parked transaction: back to its decided phase, with every STUCK step to be
/// retried (a TCC branch or message delivery from PENDING, a saga step from IN_DOUBT: its
/// action may have run).
pub fn resumed(record: &TxRecord) -> Result<(Phase, Vec<BranchRow>)> {
    let g = &record.global;
    let xid = &g.xid;
    if g.status != TxStatus::NeedsAttention {
        return Err(Error::WrongState(format!(
            "transaction {xid:?} is {}, not NEEDS_ATTENTION",
            g.status
        )));
    }
    let decision = g
        .decision
        .ok_or_else(|| Error::Corrupt(format!("parked transaction {xid:?} has no decision")))?;
    let retry_from = match g.kind {
        Kind::Tcc | Kind::Message => BranchState::Pending,
        Kind::Saga => BranchState::InDoubt,
    };
    let branches = record
        .branches
        .iter()
        .cloned()
        .map(|mut b| {
            if b.state == BranchState::Stuck {
                b.state = retry_from;
            }
            b
        })
        .collect();
    Ok((Phase::Settle(decision), branches))
}

#[cfg(test)]
mod tests {
    //! [`Job::next`] and [`Job::record`] - the functions the driver runs - against random graphs,
    //! random answers and a simulated clock: nothing starts before its dependencies are done,
    //! nothing is compensated while a step depending on it still needs it, no action starts
    //! after the turn, settled steps never change, and every run ends.
    use super::*;
    use proptest::prelude::*;

    /// The reasons read as they did when they were strings: what `last_error`, the history
    /// and the alerts say does not change with their types.
    #[test]
    fn reasons_read_as_the_transaction_records_them() {
        let step = |s: &str| BranchId::from(s);
        assert_eq!(
            TurnReason::DeadlinePassed.to_string(),
            "deadline passed before every step succeeded"
        );
        let refused = TurnReason::Refused {
            step: step("pay"),
            error: "card declined".into(),
        };
        assert_eq!(refused.to_string(), "step pay refused: card declined");
        let silent = TurnReason::NoAnswer {
            step: step("ship"),
            attempts: 5,
            error: "timeout".into(),
        };
        assert_eq!(
            silent.to_string(),
            "step ship gave no answer in 5 attempts: timeout"
        );
        let parked = ParkReason {
            during: TxStatus::Compensating,
            stuck: vec![(step("a"), "no".into()), (step("b"), "gone".into())],
        };
        assert_eq!(
            parked.to_string(),
            "refused during COMPENSATING: a: no; b: gone"
        );
    }

    fn job(kind: Kind, deps: &[Vec<usize>], phase: Phase, deadline_ms: Option<i64>) -> Job {
        let mut graph = Graph::independent(deps.len());
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                graph.add_edge(d, i);
            }
        }
        let steps = (0..deps.len())
            .map(|i| {
                let row = BranchRow {
                    branch_id: BranchId::checked(format!("s{i}")),
                    ..BranchRow::default()
                };
                let policy = RetryPolicy {
                    max_attempts: 3,
                    ..RetryPolicy::default()
                };
                StepRun::new(row, Vec::new(), Vec::new(), BTreeMap::new(), policy)
            })
            .collect();
        Job::new(
            "x".into(),
            kind,
            Fence::stored(1),
            phase,
            deadline_ms,
            graph,
            steps,
        )
    }

    #[test]
    fn history_records_failed_and_unknown_attempts_and_folds_a_first_success() {
        let mut j = job(
            Kind::Tcc,
            &[vec![], vec![]],
            Phase::Settle(Decision::Commit),
            None,
        );
        assert_eq!(j.next(0, i64::MAX), Next::Start(vec![0, 1]));
        j.record(0, CallOutcome::Success(Vec::new()), 5, 0.0);
        j.record(1, CallOutcome::Unknown("timeout".into()), 6, 0.0);
        assert!(matches!(j.next(1_000, i64::MAX), Next::Start(started) if started == [1]));
        j.record(1, CallOutcome::Success(Vec::new()), 1_001, 0.0);
        let got: Vec<_> = j
            .take_history()
            .into_iter()
            .map(|e| {
                (
                    e.event,
                    e.branch_id.unwrap(),
                    e.status.unwrap(),
                    e.attempt,
                    e.detail,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    Event::AttemptUnknown,
                    "s1".into(),
                    "PENDING",
                    1,
                    Some("timeout".into())
                ),
                (Event::Branch, "s1".into(), "CONFIRMED", 2, None),
            ]
        );
        assert!(j.take_history().is_empty(), "taken once");
    }

    fn outcome(code: u8) -> CallOutcome {
        match code % 8 {
            0..=3 => CallOutcome::Success(b"r".to_vec()),
            4 | 5 => CallOutcome::Unknown("timeout".into()),
            6 => CallOutcome::Failure("no".into()),
            _ => CallOutcome::NotSent("bad".into()),
        }
    }

    fn settled(s: BranchState) -> bool {
        matches!(
            s,
            BranchState::Confirmed | BranchState::Cancelled | BranchState::Compensated
        )
    }

    /// Runs the driver's decisions with the I/O replaced: started calls are answered in the
    /// order `picks` chooses with the answers scripted in `answers` (then success), the clock
    /// jumps to whatever the job sleeps until. Returns how the run ended and the final states.
    fn simulate(
        mut job: Job,
        answers: &[u8],
        picks: &[u8],
    ) -> Result<(Next, Vec<BranchState>), TestCaseError> {
        let mut a = answers.iter().copied().chain(std::iter::repeat(0));
        let mut p = picks.iter().cycle();
        let mut now = 0i64;
        let mut turned = false;
        let mut in_flight: Vec<usize> = Vec::new();
        for _ in 0..2000 {
            match job.next(now, i64::MAX) {
                Next::Start(started) => {
                    prop_assert!(!started.is_empty());
                    for &i in &started {
                        prop_assert!(!in_flight.contains(&i), "step {i} started twice");
                        if job.kind == Kind::Message {
                            // Deliveries only move forward, behind their dependencies.
                            prop_assert!(
                                job.graph
                                    .deps(i)
                                    .iter()
                                    .all(|&d| job.steps[d].row.state == BranchState::Done)
                            );
                            prop_assert_ne!(job.steps[i].row.state, BranchState::Done);
                        } else if job.phase == Phase::Forward {
                            prop_assert!(!turned, "an action started after the turn");
                            prop_assert!(
                                job.graph
                                    .deps(i)
                                    .iter()
                                    .all(|&d| job.steps[d].row.state == BranchState::Done)
                            );
                            prop_assert_eq!(job.steps[i].row.state, BranchState::InDoubt);
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
                    }
                    in_flight.extend(started);
                }
                Next::Turn(_) => {
                    prop_assert!(in_flight.is_empty(), "turned with calls in flight");
                    prop_assert_eq!(job.phase, Phase::Forward, "only the forward phase turns");
                    job.turn_to_compensation(now);
                    turned = true;
                }
                end @ (Next::Settle(_) | Next::Park(_) | Next::HandOff(_)) => {
                    prop_assert!(in_flight.is_empty(), "ended with calls in flight");
                    return Ok((end, job.states()));
                }
                Next::Sleep(until) => {
                    if in_flight.is_empty() {
                        let until = until.ok_or_else(|| {
                            TestCaseError::fail("sleeps forever with nothing in flight")
                        })?;
                        prop_assert!(until > now, "sleeps until a time that passed");
                        now = until;
                        continue;
                    }
                    // Answer one in-flight call.
                    let k = *p.next().unwrap() as usize % in_flight.len();
                    let i = in_flight.swap_remove(k);
                    let before = job.states();
                    job.record(i, outcome(a.next().unwrap()), now, 0.5);
                    for (j, (b, after)) in before.iter().zip(job.states()).enumerate() {
                        if j != i {
                            prop_assert_eq!(*b, after, "an answer changed another step");
                        }
                        if settled(*b) {
                            prop_assert_eq!(*b, after, "a settled step changed");
                        }
                    }
                    now += 1;
                }
            }
        }
        Err(TestCaseError::fail("the simulation did not end"))
    }

    proptest! {
        #[test]
        fn saga_scheduling_respects_dependencies_and_ends(
            deps in crate::domain::graph::dag(7),
            answers in proptest::collection::vec(any::<u8>(), 1..40),
            picks in proptest::collection::vec(any::<u8>(), 1..40),
            deadline in proptest::option::of(0i64..200_000),
        ) {
            let job = job(Kind::Saga, &deps, Phase::Forward, deadline);
            let (end, states) = simulate(job, &answers, &picks)?;
            match end {
                Next::Settle(TxStatus::Succeeded) => {
                    prop_assert!(states.iter().all(|s| *s == BranchState::Done), "{states:?}")
                }
                Next::Settle(TxStatus::Compensated) | Next::Park(_) => {
                    prop_assert!(!states.contains(&BranchState::Pending), "a step was never decided: {states:?}");
                    prop_assert!(!states.contains(&BranchState::Done) && !states.contains(&BranchState::InDoubt)
                        || states.contains(&BranchState::Stuck), "left uncompensated: {states:?}");
                }
                other => prop_assert!(false, "ended with {other:?}: {states:?}"),
            }
        }

        #[test]
        fn a_message_delivers_every_branch_in_dependency_order_or_parks(
            deps in crate::domain::graph::dag(7),
            answers in proptest::collection::vec(any::<u8>(), 1..40),
            picks in proptest::collection::vec(any::<u8>(), 1..40),
        ) {
            let job = job(Kind::Message, &deps, Phase::Settle(Decision::Commit), None);
            let (end, states) = simulate(job, &answers, &picks)?;
            match end {
                Next::Settle(TxStatus::Committed) => {
                    prop_assert!(states.iter().all(|s| *s == BranchState::Done), "{states:?}")
                }
                Next::Park(_) => {
                    prop_assert!(states.contains(&BranchState::Stuck), "{states:?}");
                    // Nothing is ever undone; what was not delivered waits behind a refusal.
                    for (i, s) in states.iter().enumerate() {
                        if *s == BranchState::Pending {
                            prop_assert!(deps[i].iter().any(|&d| states[d] != BranchState::Done), "{states:?}");
                        }
                    }
                }
                other => prop_assert!(false, "ended with {other:?}: {states:?}"),
            }
        }

        #[test]
        fn a_dropped_message_delivers_nothing(n in 1usize..6) {
            let deps = vec![Vec::new(); n];
            let job = job(Kind::Message, &deps, Phase::Settle(Decision::Rollback), None);
            let (end, states) = simulate(job, &[], &[0])?;
            prop_assert_eq!(end, Next::Settle(TxStatus::RolledBack));
            prop_assert!(states.iter().all(|s| *s == BranchState::Pending));
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
            let (end, states) = simulate(job(Kind::Tcc, &deps, Phase::Settle(decision), None), &answers, &picks)?;
            let done = if commit { BranchState::Confirmed } else { BranchState::Cancelled };
            prop_assert!(states.iter().all(|s| *s == done || *s == BranchState::Stuck), "{states:?}");
            let parked = states.contains(&BranchState::Stuck);
            prop_assert_eq!(matches!(end, Next::Park(_)), parked, "{:?}", end);
        }
    }

    #[test]
    fn a_retry_due_after_the_hand_off_bound_is_handed_back() {
        let mut j = job(Kind::Tcc, &[vec![]], Phase::Settle(Decision::Commit), None);
        assert_eq!(j.next(0, 1_000), Next::Start(vec![0]));
        j.record(0, CallOutcome::Unknown("timeout".into()), 0, 0.5);
        let Next::Sleep(Some(at)) = j.next(0, i64::MAX) else {
            panic!("waits for the backoff");
        };
        assert_eq!(j.next(0, at), Next::HandOff(at));
        assert_eq!(j.next(at, i64::MAX), Next::Start(vec![0]));
    }
}
