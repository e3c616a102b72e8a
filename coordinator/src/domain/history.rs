//! A transaction's history: what happened to it, when and by whom, for operators.
//!
//! Entries are produced where the change is decided (the store for creations, registrations
//! and claims; the driver for attempts and status changes; the operator actions) and written in
//! the same commit as the change they describe, so the history never claims a change that did
//! not happen. What the rows themselves record is not written again: the creation (the
//! transaction's `created_ms` and kind) and each TCC branch's registration (its row, whose
//! `seq` carries the registration time) are [`derived`] when the history is read, and a branch
//! call that succeeded at its first attempt is folded into the status change that follows it.
//! So a transaction that goes straight through adds two rows (decision or turn, final status)
//! to commits that happen anyway. Failed and unknown attempts are kept in the job's memory until its next write
//! (the driver does not write per attempt), so a crash loses the attempt entries since the last
//! write, never a state change.

use dtx_sql::db_enum;

use super::{BranchState, Kind, TxRecord, TxStatus};

db_enum! {
    /// What an entry records (`dtx.v1.HistoryKind` names the same events).
    pub enum Event {
        Created = "CREATED", Registered = "REGISTERED", Decided = "DECIDED", Status = "STATUS",
        Branch = "BRANCH", AttemptFailed = "ATTEMPT_FAILED", AttemptUnknown = "ATTEMPT_UNKNOWN",
        Takeover = "TAKEOVER", Operator = "OPERATOR",
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

/// A TCC branch's `seq` is its registration time in ms times this, plus a counter below it
/// (set by `Engine::register_branch`), so the registration time is read back from it.
pub const SEQ_PER_MS: i64 = 1024;

/// The whole history of `record`: its creation and (TCC) its branches' registrations, which
/// the rows themselves record, merged in time order with the `stored` entries.
pub fn derived(record: &TxRecord, stored: Vec<Entry>) -> Vec<Entry> {
    let g = &record.global;
    let initial = match g.kind {
        Kind::Tcc => TxStatus::Trying,
        Kind::Saga => TxStatus::Running,
        Kind::Message => TxStatus::Prepared,
    };
    let mut all = vec![Entry::tx(g.created_ms, Event::Created, Some(initial))];
    if g.kind == Kind::Tcc {
        let mut branches: Vec<_> = record.branches.iter().collect();
        branches.sort_by_key(|b| b.seq);
        all.extend(branches.into_iter().map(|b| {
            let at = (b.seq / SEQ_PER_MS).max(g.created_ms);
            Entry::branch(at, Event::Registered, &b.branch_id, BranchState::Pending, 0)
                .detail(format!("{} at {}", b.handler, b.target))
        }));
    }
    all.extend(stored);
    // Stable: derived entries stay before stored ones of the same millisecond.
    all.sort_by_key(|e| e.at_ms);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Fence;

    #[test]
    fn a_long_detail_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_DETAIL_LEN);
        let e = Entry::tx(1, Event::Status, None).detail(long);
        let kept = e.detail.unwrap();
        assert!(kept.len() <= MAX_DETAIL_LEN && kept.len() >= MAX_DETAIL_LEN - 1);
        assert!(kept.chars().all(|c| c == 'é'));
    }

    #[test]
    fn creation_and_registrations_are_read_off_the_rows() {
        use crate::domain::{BranchRow, GlobalRow};
        let branch = |id: &str, at_ms: i64| BranchRow {
            branch_id: id.into(),
            seq: at_ms * SEQ_PER_MS + 7,
            handler: "h".into(),
            target: "http://t".into(),
            ..BranchRow::default()
        };
        let record = TxRecord {
            global: GlobalRow {
                xid: "x".into(),
                kind: Kind::Tcc,
                status: TxStatus::Committing,
                decision: None,
                timeout_ms: 0,
                deadline_ms: 0,
                spec: None,
                branch_count: 2,
                owner: None,
                fence: Fence::UNCLAIMED,
                due_ms: None,
                last_error: None,
                created_ms: 100,
                updated_ms: 130,
            },
            branches: vec![branch("b2", 120), branch("b1", 110)],
        };
        let decided = Entry::tx(120, Event::Decided, Some(TxStatus::Committing));
        let got: Vec<_> = derived(&record, vec![decided])
            .into_iter()
            .map(|e| (e.at_ms, e.event, e.branch_id, e.detail))
            .collect();
        let at = |b: &str| Some(b.to_string());
        assert_eq!(
            got,
            [
                (100, Event::Created, None, None),
                (110, Event::Registered, at("b1"), at("h at http://t")),
                (120, Event::Registered, at("b2"), at("h at http://t")),
                (120, Event::Decided, None, None),
            ]
        );
    }
}
