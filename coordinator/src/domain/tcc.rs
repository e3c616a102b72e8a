//! What a TCC call means when the store did not apply it: an identical repeat (answered as the
//! first call was) or a refusal with the error the caller gets. Pure, so the engine only
//! performs the writes.

use dtx_proto::limits::{self, LimitError};

use super::{BranchRow, Decision, GlobalRow, Kind, TxStatus};
use crate::error::{Error, Result};

/// A registration the store refused: `Ok` if `existing` is the same branch registered before
/// (a repeat), otherwise why it cannot be added to `global` at `now_ms`.
pub fn refused_registration(
    new: &BranchRow,
    global: &GlobalRow,
    existing: Option<&BranchRow>,
    now_ms: i64,
) -> Result<()> {
    let xid = &global.xid;
    if let Some(b) = existing {
        let same = b.target == new.target
            && b.handler == new.handler
            && b.payload == new.payload
            && dtx_proto::trace::same_apart_from_trace(&b.headers, &new.headers)
            && b.call_timeout_ms == new.call_timeout_ms;
        return if same {
            Ok(())
        } else {
            Err(Error::Conflict(format!(
                "branch {:?} of {xid:?} is already registered with different content",
                new.branch_id
            )))
        };
    }
    Err(if global.kind != Kind::Tcc {
        Error::WrongState(format!(
            "xid {xid:?} is a saga; branches are registered for TCC transactions"
        ))
    } else if global.status != TxStatus::Trying {
        Error::WrongState(format!(
            "transaction {xid:?} is already {}; no branch can be added after the decision",
            global.status
        ))
    } else if global.deadline_ms <= now_ms {
        Error::WrongState(format!(
            "transaction {xid:?} passed its deadline and is being rolled back"
        ))
    } else {
        Error::Invalid(LimitError(format!(
            "transaction {xid:?} already has {} branches, the limit is {}",
            global.branch_count,
            limits::MAX_BRANCHES
        )))
    })
}

/// What a Commit or Rollback that did not apply meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecided {
    /// The same decision was recorded before: answer with the status.
    Repeat(TxStatus),
    /// Still TRYING, so the Commit came after the deadline: roll back now, then refuse it.
    Late,
}

/// Classifies a decision for a transaction of `kind` (TCC Commit/Rollback, message
/// Submit/Abort) that the store did not record, against the transaction's row.
pub fn unapplied_decision(kind: Kind, decision: Decision, row: &GlobalRow) -> Result<Undecided> {
    let xid = &row.xid;
    if row.kind != kind {
        let calls = match kind {
            Kind::Message => "SubmitMessage/AbortMessage are for messages",
            _ => "Commit/Rollback are for TCC transactions",
        };
        let is = match row.kind {
            Kind::Tcc => "a TCC transaction",
            Kind::Saga => "a saga",
            Kind::Message => "a message",
        };
        return Err(Error::WrongState(format!("xid {xid:?} is {is}; {calls}")));
    }
    match row.decision {
        Some(d) if d == decision => Ok(Undecided::Repeat(row.status)),
        Some(other) => Err(Error::Decided {
            message: match kind {
                Kind::Message if other == Decision::Rollback => {
                    format!("message {xid:?} was dropped ({})", row.status)
                }
                Kind::Message => format!("message {xid:?} was submitted ({})", row.status),
                _ => format!(
                    "transaction {xid:?} was already decided: {other} ({})",
                    row.status
                ),
            },
            status: row.status,
        }),
        None if kind == Kind::Tcc => Ok(Undecided::Late),
        None => Err(Error::WrongState(format!(
            "message {xid:?} is {}: try again",
            row.status
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Fence;

    fn trying(branch_count: i64) -> GlobalRow {
        GlobalRow {
            xid: "x".into(),
            kind: Kind::Tcc,
            status: TxStatus::Trying,
            decision: None,
            timeout_ms: 1_000,
            deadline_ms: 1_000,
            spec: None,
            branch_count,
            owner: None,
            fence: Fence::UNCLAIMED,
            due_ms: Some(1_000),
            last_error: None,
            created_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn a_repeat_is_accepted_and_different_content_conflicts() {
        let b = BranchRow {
            branch_id: "b".into(),
            payload: b"p".to_vec(),
            ..BranchRow::default()
        };
        assert!(refused_registration(&b, &trying(1), Some(&b), 0).is_ok());
        let other = BranchRow {
            payload: b"q".to_vec(),
            ..b.clone()
        };
        assert!(matches!(
            refused_registration(&other, &trying(1), Some(&b), 0),
            Err(Error::Conflict(_))
        ));
    }

    #[test]
    fn refusals_name_their_cause() {
        let b = BranchRow::default();
        let decided = GlobalRow {
            status: TxStatus::Committing,
            ..trying(1)
        };
        let cases = [
            (decided, 0, "after the decision"),
            (trying(1), 5_000, "passed its deadline"),
            (trying(limits::MAX_BRANCHES as i64), 0, "the limit is"),
        ];
        for (global, now, cause) in cases {
            let e = refused_registration(&b, &global, None, now).unwrap_err();
            assert!(e.to_string().contains(cause), "{e}");
        }
    }

    #[test]
    fn decisions_repeat_contradict_or_come_late() {
        let mut row = trying(0);
        assert_eq!(
            unapplied_decision(Kind::Tcc, Decision::Commit, &row).unwrap(),
            Undecided::Late
        );
        row.decision = Some(Decision::Commit);
        row.status = TxStatus::Committed;
        assert_eq!(
            unapplied_decision(Kind::Tcc, Decision::Commit, &row).unwrap(),
            Undecided::Repeat(TxStatus::Committed)
        );
        assert!(matches!(
            unapplied_decision(Kind::Tcc, Decision::Rollback, &row),
            Err(Error::Decided { .. })
        ));
        let e = unapplied_decision(Kind::Message, Decision::Commit, &row).unwrap_err();
        assert!(
            e.to_string()
                .contains("is a TCC transaction; SubmitMessage"),
            "{e}"
        );
        let dropped = GlobalRow {
            kind: Kind::Message,
            status: TxStatus::RolledBack,
            decision: Some(Decision::Rollback),
            ..row
        };
        let e = unapplied_decision(Kind::Message, Decision::Commit, &dropped).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Decided {
                    status: TxStatus::RolledBack,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("was dropped"), "{e}");
    }
}
