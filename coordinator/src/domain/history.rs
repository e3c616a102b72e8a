//! A transaction's history: what happened to it, when and by whom, for operators.
//!
//! Entries are produced where the change is decided (the store for creations, registrations
//! and claims; the driver for attempts and status changes; the operator actions) and written in
//! the same commit as the change they describe, so the history never claims a change that did
//! not happen. A branch call that succeeded at its first attempt is folded into the status
//! change that follows it (no entry of its own). Failed and unknown attempts are kept in the job's memory until its next write
//! (the driver does not write per attempt), so a crash loses the attempt entries since the last
//! write, never a state change.

use dtx_sql::db_enum;

use super::{BranchState, TxStatus};

db_enum! {
    /// What an entry records (`dtx.v1.HistoryKind` names the same events).
    pub enum Event {
        Created = "CREATED",
        Registered = "REGISTERED",
        Decided = "DECIDED",
        Status = "STATUS",
        Branch = "BRANCH",
        AttemptFailed = "ATTEMPT_FAILED",
        AttemptUnknown = "ATTEMPT_UNKNOWN",
        Takeover = "TAKEOVER",
        Operator = "OPERATOR",
    }
}

/// Longest detail (error, reason) kept per entry, in bytes; longer ones are cut.
pub const MAX_DETAIL_LEN: usize = 1024;

/// One entry of a transaction's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When, on the database's clock.
    pub at_ms: i64,
    pub event: Event,
    /// The branch it concerns; `None` for the transaction itself.
    pub branch_id: Option<String>,
    /// The status (or branch state) after the event, as stored; `None` if unchanged.
    pub status: Option<&'static str>,
    /// The branch's attempt number, for attempt events.
    pub attempt: i64,
    /// The error, reason or decision.
    pub detail: Option<String>,
    /// The coordinator instance or operator; `None` for the initiator.
    pub actor: Option<String>,
}

impl Entry {
    /// An entry about the transaction itself.
    pub fn tx(at_ms: i64, event: Event, status: Option<TxStatus>) -> Entry {
        Entry {
            at_ms,
            event,
            branch_id: None,
            status: status.map(TxStatus::as_str),
            attempt: 0,
            detail: None,
            actor: None,
        }
    }

    /// An entry about branch `branch_id` at its attempt `attempt`.
    pub fn branch(
        at_ms: i64,
        event: Event,
        branch_id: &str,
        state: BranchState,
        attempt: i64,
    ) -> Entry {
        Entry {
            branch_id: Some(branch_id.to_string()),
            status: Some(state.as_str()),
            attempt,
            ..Entry::tx(at_ms, event, None)
        }
    }

    /// With this detail, cut to [`MAX_DETAIL_LEN`] at a character boundary.
    pub fn detail(mut self, detail: impl Into<String>) -> Entry {
        let mut detail = detail.into();
        if detail.len() > MAX_DETAIL_LEN {
            let mut end = MAX_DETAIL_LEN;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
        }
        self.detail = Some(detail);
        self
    }

    /// By this actor.
    pub fn by(mut self, actor: impl Into<String>) -> Entry {
        self.actor = Some(actor.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_detail_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_DETAIL_LEN);
        let e = Entry::tx(1, Event::Status, None).detail(long);
        let kept = e.detail.unwrap();
        assert!(kept.len() <= MAX_DETAIL_LEN && kept.len() >= MAX_DETAIL_LEN - 1);
        assert!(kept.chars().all(|c| c == 'é'));
    }
}
