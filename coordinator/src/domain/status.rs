//! Statuses of global transactions and branches, their database spelling, and the transition
//! rule every state change is checked against.

use dtx_sql::db_enum;

db_enum! {
    /// TCC transaction, saga or two-phase message.
    pub enum Kind { Tcc = "tcc", Saga = "saga", Message = "msg" }
}

db_enum! {
    /// Status of a global transaction (see `dtx.proto` for each one's meaning).
    pub enum TxStatus {
        Trying = "TRYING",
        Committing = "COMMITTING",
        Committed = "COMMITTED",
        RollingBack = "ROLLING_BACK",
        RolledBack = "ROLLED_BACK",
        Running = "RUNNING",
        Succeeded = "SUCCEEDED",
        Compensating = "COMPENSATING",
        Compensated = "COMPENSATED",
        NeedsAttention = "NEEDS_ATTENTION",
        Prepared = "PREPARED",
    }
}

db_enum! {
    /// What was decided for a transaction; drives phase two and survives a parked status.
    pub enum Decision { Commit = "commit", Rollback = "rollback", Compensate = "compensate" }
}

db_enum! {
    /// State of one TCC branch or saga step.
    #[derive(Default)]
    pub enum BranchState {
        #[default]
        Pending = "PENDING",
        InDoubt = "IN_DOUBT",
        Done = "DONE",
        Refused = "REFUSED",
        Confirmed = "CONFIRMED",
        Cancelled = "CANCELLED",
        Compensated = "COMPENSATED",
        Stuck = "STUCK",
        Skipped = "SKIPPED",
    }
}

impl TxStatus {
    /// A terminal status never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TxStatus::Committed
                | TxStatus::RolledBack
                | TxStatus::Succeeded
                | TxStatus::Compensated
        )
    }

    /// Terminal or parked: nothing happens without an operator.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self == TxStatus::NeedsAttention
    }

    /// Whether a transaction may move from `self` to `to`. Staying is allowed (a lease
    /// renewal or progress write); moving backwards or out of a terminal status never is.
    pub fn can_become(self, to: TxStatus) -> bool {
        use TxStatus::*;
        if self == to {
            return !self.is_terminal();
        }
        matches!(
            (self, to),
            (Trying | Prepared, Committing | RollingBack)
                | (Committing, Committed | NeedsAttention)
                | (RollingBack, RolledBack | NeedsAttention)
                | (Running, Succeeded | Compensating)
                | (Compensating, Compensated | NeedsAttention)
                | (NeedsAttention, Committing | RollingBack | Compensating)
        )
    }

    /// The decision a status stands for: `None` for the undecided statuses and for
    /// NEEDS_ATTENTION (which keeps whatever was decided).
    pub fn implied_decision(self) -> Option<Decision> {
        match self {
            TxStatus::Committing | TxStatus::Committed => Some(Decision::Commit),
            TxStatus::RollingBack | TxStatus::RolledBack => Some(Decision::Rollback),
            TxStatus::Compensating | TxStatus::Compensated => Some(Decision::Compensate),
            TxStatus::Trying
            | TxStatus::Prepared
            | TxStatus::Running
            | TxStatus::Succeeded
            | TxStatus::NeedsAttention => None,
        }
    }

    /// The rule every stored change obeys: `from` may become `to` with `decision` recorded
    /// afterwards. The status must allow the move, the decision must be the one `to` stands
    /// for (a parked transaction keeps one), and - enforced by the store, which knows the
    /// recorded decision - a recorded decision never changes.
    pub fn transition_allowed(from: TxStatus, to: TxStatus, decision: Option<Decision>) -> bool {
        from.can_become(to)
            && match to {
                TxStatus::NeedsAttention => decision.is_some(),
                _ => to.implied_decision() == decision,
            }
    }

    /// The phase-two status a decision drives, and the terminal status it ends in.
    pub fn of_decision(decision: Decision) -> (TxStatus, TxStatus) {
        match decision {
            Decision::Commit => (TxStatus::Committing, TxStatus::Committed),
            Decision::Rollback => (TxStatus::RollingBack, TxStatus::RolledBack),
            Decision::Compensate => (TxStatus::Compensating, TxStatus::Compensated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [TxStatus; 11] = [
        TxStatus::Trying,
        TxStatus::Committing,
        TxStatus::Committed,
        TxStatus::RollingBack,
        TxStatus::RolledBack,
        TxStatus::Running,
        TxStatus::Succeeded,
        TxStatus::Compensating,
        TxStatus::Compensated,
        TxStatus::NeedsAttention,
        TxStatus::Prepared,
    ];

    #[test]
    fn database_spelling_round_trips() {
        assert_eq!(TxStatus::ALL, ALL);
        for status in ALL {
            assert_eq!(TxStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(BranchState::parse("IN_DOUBT"), Some(BranchState::InDoubt));
        assert_eq!(Kind::parse("nope"), None);
    }

    #[test]
    fn terminal_statuses_never_change() {
        for from in ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in ALL {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn decisions_are_not_reversed() {
        assert!(!TxStatus::Committing.can_become(TxStatus::RollingBack));
        assert!(!TxStatus::RollingBack.can_become(TxStatus::Committing));
        assert!(!TxStatus::Compensating.can_become(TxStatus::Running));
        assert!(TxStatus::Trying.can_become(TxStatus::Committing));
        assert!(TxStatus::NeedsAttention.can_become(TxStatus::Compensating));
    }

    /// The store as the SQL implements it: a write applies only with the current fencing
    /// token, the expected status, an allowed transition, and the recorded decision (if any).
    #[derive(Debug, Clone, Copy)]
    struct Row {
        status: TxStatus,
        decision: Option<Decision>,
        fence: u8,
    }

    #[derive(Debug, Clone, Copy)]
    struct Attempt {
        from: TxStatus,
        to: TxStatus,
        decision: Option<Decision>,
        fence: u8,
        new_fence: Option<u8>,
    }

    fn apply(row: &mut Row, w: Attempt) -> bool {
        let ok = w.from == row.status
            && w.fence == row.fence
            && TxStatus::transition_allowed(w.from, w.to, w.decision)
            && (row.decision.is_none() || row.decision == w.decision);
        if ok {
            row.status = w.to;
            row.decision = w.decision;
            row.fence = w.new_fence.unwrap_or(row.fence);
        }
        ok
    }

    /// Undecided < decided (phase two, compensation, parked) < terminal.
    fn rank(s: TxStatus) -> u8 {
        if s.is_terminal() {
            2
        } else if matches!(s, TxStatus::Trying | TxStatus::Prepared | TxStatus::Running) {
            0
        } else {
            1
        }
    }

    fn status() -> impl Strategy<Value = TxStatus> {
        proptest::sample::select(ALL.to_vec())
    }

    fn decision() -> impl Strategy<Value = Option<Decision>> {
        proptest::option::of(proptest::sample::select(vec![
            Decision::Commit,
            Decision::Rollback,
            Decision::Compensate,
        ]))
    }

    /// Writers that know the current state (an honest driver), mixed with arbitrary ones
    /// (stale drivers, duplicated decisions, buggy callers).
    fn attempts() -> impl Strategy<Value = Vec<(bool, Attempt)>> {
        proptest::collection::vec(
            (
                any::<bool>(),
                (
                    status(),
                    status(),
                    decision(),
                    0u8..4,
                    proptest::option::of(0u8..4),
                )
                    .prop_map(|(from, to, decision, fence, new_fence)| Attempt {
                        from,
                        to,
                        decision,
                        fence,
                        new_fence,
                    }),
            ),
            1..60,
        )
    }

    proptest! {
        #[test]
        fn no_sequence_of_writes_moves_a_transaction_backwards(
            start in proptest::sample::select(vec![TxStatus::Trying, TxStatus::Prepared, TxStatus::Running]),
            writes in attempts(),
        ) {
            let mut row = Row { status: start, decision: None, fence: 0 };
            for (honest, mut w) in writes {
                if honest {
                    // An honest writer knows the current status and token.
                    w.from = row.status;
                    w.fence = row.fence;
                }
                let before = row;
                let applied = apply(&mut row, w);
                if !applied {
                    prop_assert_eq!((row.status, row.decision, row.fence), (before.status, before.decision, before.fence));
                    continue;
                }
                prop_assert!(!before.status.is_terminal(), "left terminal {:?} for {:?}", before.status, row.status);
                prop_assert!(rank(row.status) >= rank(before.status), "{:?} -> {:?}", before.status, row.status);
                if let Some(d) = before.decision {
                    prop_assert_eq!(row.decision, Some(d), "decision changed");
                }
                // The kind of transaction never changes: TCC (and message) statuses stay TCC,
                // sagas stay sagas.
                let saga = |s: TxStatus| matches!(s, TxStatus::Running | TxStatus::Succeeded | TxStatus::Compensating | TxStatus::Compensated);
                let tcc = |s: TxStatus| matches!(s, TxStatus::Trying | TxStatus::Prepared | TxStatus::Committing | TxStatus::Committed | TxStatus::RollingBack | TxStatus::RolledBack);
                let crossed = (saga(before.status) && tcc(row.status)) || (tcc(before.status) && saga(row.status));
                prop_assert!(!crossed, "{:?} -> {:?}", before.status, row.status);
                match row.status {
                    TxStatus::Committed => prop_assert_eq!(row.decision, Some(Decision::Commit)),
                    TxStatus::RolledBack => prop_assert_eq!(row.decision, Some(Decision::Rollback)),
                    TxStatus::Compensated => prop_assert_eq!(row.decision, Some(Decision::Compensate)),
                    TxStatus::Succeeded => prop_assert_eq!(row.decision, None),
                    _ => {}
                }
            }
        }
    }
}
