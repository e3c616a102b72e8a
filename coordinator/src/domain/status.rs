//! Statuses of global transactions and branches, their database spelling, and the transition
//! rule every state change is checked against.

use std::fmt;

macro_rules! db_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vattr:meta])* $variant:ident = $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vattr])* $variant),* }

        impl $name {
            /// The spelling stored in the database.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            /// Parses the database spelling.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

db_enum!(
    /// TCC transaction or saga.
    Kind { Tcc = "tcc", Saga = "saga" }
);

db_enum!(
    /// Status of a global transaction (see `dtx.proto` for each one's meaning).
    TxStatus {
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
    }
);

db_enum!(
    /// What was decided for a transaction; drives phase two and survives a parked status.
    Decision { Commit = "commit", Rollback = "rollback", Compensate = "compensate" }
);

db_enum!(
    /// State of one TCC branch or saga step.
    #[derive(Default)]
    BranchState {
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
);

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
            (Trying, Committing | RollingBack)
                | (Committing, Committed | NeedsAttention)
                | (RollingBack, RolledBack | NeedsAttention)
                | (Running, Succeeded | Compensating)
                | (Compensating, Compensated | NeedsAttention)
                | (NeedsAttention, Committing | RollingBack | Compensating)
        )
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

    const ALL: [TxStatus; 10] = [
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
    ];

    #[test]
    fn database_spelling_round_trips() {
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
}
