//! Why a call failed, as a program matches on it: one short stable name per cause, listed
//! once here and carried by every interface the same way.
//!
//! * gRPC: a `google.rpc.ErrorInfo` in the status details (`reason`, domain [`DOMAIN`]), the
//!   standard place generic gRPC tooling reads;
//! * HTTP/JSON: the problem body's `type`, `urn:dtx:reason:<REASON>` ([`Reason::problem_type`]);
//! * the Rust and Python SDKs: [`Reason::of_status`] and `dtx.reason_of(error)`;
//! * the CLI: its exit code ([`Reason::exit_code`]).
//!
//! A status without an `ErrorInfo` (made by a transport, or by an older coordinator) has the
//! reason its code implies ([`Reason::implied_by`]). The README's table is rendered from
//! [`TABLE`] and checked by a test.

use std::collections::HashMap;

use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of dtx's reasons.
pub const DOMAIN: &str = "dtx.v1";

/// The prefix of a problem body's `type` that names a reason.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:dtx:reason:";

/// The causes of a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Malformed, or over a documented limit (the message names it); nothing was stored.
    InvalidRequest,
    /// No transaction with this xid for the caller's tenant.
    UnknownTransaction,
    /// No such method (an HTTP/JSON path no RPC has).
    UnknownMethod,
    /// The xid or branch id was used before with other content; the first is untouched.
    KeyReused,
    /// The transaction was decided the other way (`dtx-status` says its status).
    AlreadyDecided,
    /// The call does not apply to the transaction's status (or its kind).
    WrongState,
    /// A branch target or webhook outside `--allow-target`; nothing was stored.
    TargetNotAllowed,
    /// The caller's roles do not allow this call; nothing was stored.
    RoleDenied,
    /// No bearer token, or one that does not verify; nothing was stored.
    Unauthenticated,
    /// The tenant is over a quota (`retry-after` says when to try again); nothing was stored.
    QuotaExceeded,
    /// The store is unavailable, a write's outcome is unknown, or the coordinator is shutting
    /// down: repeat the call (every call is safe to repeat).
    Unavailable,
    /// The coordinator failed in a way a repeat will not fix (a store row it cannot read).
    Internal,
}

/// One reason's row: its name, gRPC code, CLI exit code and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The reason.
    pub reason: Reason,
    /// Its stable name (`ErrorInfo.reason`, the problem type's last part, Python's string).
    pub name: &'static str,
    /// The gRPC code it is sent with (its HTTP status follows [`crate::http::STATUS_TABLE`]).
    pub code: Code,
    /// The `dtx` CLI's exit code.
    pub exit_code: u8,
    /// What it means, for the README.
    pub meaning: &'static str,
}

/// Every reason, once.
pub const TABLE: [Row; 12] = [
    row(
        Reason::InvalidRequest,
        "INVALID_REQUEST",
        Code::InvalidArgument,
        5,
        "malformed, or over a documented limit (the message names it); nothing was stored",
    ),
    row(
        Reason::UnknownTransaction,
        "UNKNOWN_TRANSACTION",
        Code::NotFound,
        3,
        "no transaction with this xid for the caller's tenant",
    ),
    row(
        Reason::UnknownMethod,
        "UNKNOWN_METHOD",
        Code::NotFound,
        2,
        "no such method (an HTTP/JSON path no RPC has)",
    ),
    row(
        Reason::KeyReused,
        "KEY_REUSED",
        Code::AlreadyExists,
        4,
        "the xid or branch id was used before with other content; the first is untouched",
    ),
    row(
        Reason::AlreadyDecided,
        "ALREADY_DECIDED",
        Code::Aborted,
        4,
        "the transaction was decided the other way (`dtx-status` says its status)",
    ),
    row(
        Reason::WrongState,
        "WRONG_STATE",
        Code::FailedPrecondition,
        4,
        "the call does not apply to the transaction's status or kind",
    ),
    row(
        Reason::TargetNotAllowed,
        "TARGET_NOT_ALLOWED",
        Code::PermissionDenied,
        7,
        "a branch target or webhook outside `--allow-target`; nothing was stored",
    ),
    row(
        Reason::RoleDenied,
        "ROLE_DENIED",
        Code::PermissionDenied,
        7,
        "the caller's roles do not allow the call; nothing was stored",
    ),
    row(
        Reason::Unauthenticated,
        "UNAUTHENTICATED",
        Code::Unauthenticated,
        7,
        "no bearer token, or one that does not verify; nothing was stored",
    ),
    row(
        Reason::QuotaExceeded,
        "QUOTA_EXCEEDED",
        Code::ResourceExhausted,
        8,
        "the tenant is over a quota (`retry-after` says when to try again); nothing was stored",
    ),
    row(
        Reason::Unavailable,
        "UNAVAILABLE",
        Code::Unavailable,
        6,
        "the store is unavailable, a write's outcome is unknown, or the coordinator is shutting \
         down: repeat the call",
    ),
    row(
        Reason::Internal,
        "INTERNAL",
        Code::Internal,
        1,
        "a failure a repeat will not fix (a store row the coordinator cannot read)",
    ),
];

const fn row(
    reason: Reason,
    name: &'static str,
    code: Code,
    exit_code: u8,
    meaning: &'static str,
) -> Row {
    Row {
        reason,
        name,
        code,
        exit_code,
        meaning,
    }
}

impl Reason {
    fn row(self) -> &'static Row {
        TABLE
            .iter()
            .find(|r| r.reason == self)
            .expect("every reason has a row")
    }

    /// Its stable name, e.g. `KEY_REUSED`.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The reason named `name`.
    pub fn named(name: &str) -> Option<Reason> {
        TABLE.iter().find(|r| r.name == name).map(|r| r.reason)
    }

    /// The gRPC code it is sent with.
    pub fn code(self) -> Code {
        self.row().code
    }

    /// The `dtx` CLI's exit code for it.
    pub fn exit_code(self) -> u8 {
        self.row().exit_code
    }

    /// A status with this reason's code, `message`, and the reason in its details.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let info = ErrorDetails::with_error_info(self.name(), DOMAIN, HashMap::new());
        tonic::Status::with_error_details(self.code(), message, info)
    }

    /// The problem body `type` that names it.
    pub fn problem_type(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.name())
    }

    /// The reason a problem `type` names, if it names one.
    pub fn of_problem_type(kind: &str) -> Option<Reason> {
        kind.strip_prefix(PROBLEM_TYPE_PREFIX)
            .and_then(Reason::named)
    }

    /// The reason of a failed call: the one its details name, else the one its code implies.
    pub fn of_status(status: &tonic::Status) -> Option<Reason> {
        let details = status.get_error_details();
        details
            .error_info()
            .filter(|info| info.domain == DOMAIN)
            .and_then(|info| Reason::named(&info.reason))
            .or_else(|| Reason::implied_by(status.code()))
    }

    /// The reason a bare code stands for (the first row with that code), for statuses that
    /// carry none; `None` for OK and the codes no reason has.
    pub fn implied_by(code: Code) -> Option<Reason> {
        TABLE.iter().find(|r| r.code == code).map(|r| r.reason)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The README's table of reasons, rendered from [`TABLE`].
pub fn reasons_table() -> String {
    let mut table = String::from(
        "| reason | gRPC code | HTTP status | CLI exit code | meaning |\n|---|---|---|---|---|\n",
    );
    for r in &TABLE {
        table.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} |\n",
            r.name,
            crate::http::code_name(r.code),
            crate::http::http_status(r.code),
            r.exit_code,
            r.meaning
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_row_a_unique_name_and_round_trips() {
        for row in &TABLE {
            assert_eq!(TABLE.iter().filter(|r| r.reason == row.reason).count(), 1);
            assert_eq!(TABLE.iter().filter(|r| r.name == row.name).count(), 1);
            assert!(
                row.name.len() <= 63
                    && row
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b == b'_')
            );
            let status = row.reason.status("why");
            assert_eq!(status.code(), row.code);
            assert_eq!(status.message(), "why");
            assert_eq!(Reason::of_status(&status), Some(row.reason));
            assert_eq!(
                Reason::of_problem_type(&row.reason.problem_type()),
                Some(row.reason)
            );
        }
    }

    /// The README's table is the one [`TABLE`] renders.
    #[test]
    fn the_readme_lists_every_reason() {
        let readme = include_str!("../../README.md");
        let (begin, end) = ("<!-- reasons:begin -->\n", "<!-- reasons:end -->");
        let start = readme.find(begin).expect("a reasons:begin marker") + begin.len();
        let stop = readme[start..].find(end).expect("a reasons:end marker") + start;
        let expected = reasons_table();
        assert!(
            readme[start..stop] == expected,
            "README.md's table of reasons is out of date; replace it with:\n{expected}"
        );
    }

    #[test]
    fn a_bare_status_has_the_reason_its_code_implies() {
        let bare = tonic::Status::permission_denied("no");
        assert_eq!(Reason::of_status(&bare), Some(Reason::TargetNotAllowed));
        assert_eq!(
            Reason::of_status(&tonic::Status::not_found("x")),
            Some(Reason::UnknownTransaction)
        );
        assert_eq!(Reason::of_status(&tonic::Status::unimplemented("x")), None);
        assert_eq!(Reason::of_problem_type("about:blank"), None);
    }
}
