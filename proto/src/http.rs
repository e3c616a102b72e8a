//! The contract over HTTP/JSON: gRPC status codes as HTTP statuses (one table, used by the
//! coordinator's HTTP front end and by its calls to HTTP participants) and the
//! `application/problem+json` body (RFC 9457) that carries a non-OK status.

use serde::{Deserialize, Serialize};
use tonic::Code;

use crate::reason::Reason;

/// Every gRPC code, its name as it appears in a problem body, and its HTTP status (the
/// mapping gRPC-gateway and Connect use).
pub const STATUS_TABLE: [(Code, &str, u16); 17] = [
    (Code::Ok, "OK", 200),
    (Code::Cancelled, "CANCELLED", 499),
    (Code::Unknown, "UNKNOWN", 500),
    (Code::InvalidArgument, "INVALID_ARGUMENT", 400),
    (Code::DeadlineExceeded, "DEADLINE_EXCEEDED", 504),
    (Code::NotFound, "NOT_FOUND", 404),
    (Code::AlreadyExists, "ALREADY_EXISTS", 409),
    (Code::PermissionDenied, "PERMISSION_DENIED", 403),
    (Code::ResourceExhausted, "RESOURCE_EXHAUSTED", 429),
    (Code::FailedPrecondition, "FAILED_PRECONDITION", 400),
    (Code::Aborted, "ABORTED", 409),
    (Code::OutOfRange, "OUT_OF_RANGE", 400),
    (Code::Unimplemented, "UNIMPLEMENTED", 501),
    (Code::Internal, "INTERNAL", 500),
    (Code::Unavailable, "UNAVAILABLE", 503),
    (Code::DataLoss, "DATA_LOSS", 500),
    (Code::Unauthenticated, "UNAUTHENTICATED", 401),
];

/// The HTTP status of a gRPC code.
pub fn http_status(code: Code) -> u16 {
    STATUS_TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or(500, |(_, _, status)| *status)
}

/// The name of a gRPC code (`FAILED_PRECONDITION`).
pub fn code_name(code: Code) -> &'static str {
    STATUS_TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or("UNKNOWN", |(_, name, _)| name)
}

/// The gRPC code of a name from a problem body; `None` for a name no code has.
pub fn code_named(name: &str) -> Option<Code> {
    STATUS_TABLE
        .iter()
        .find(|(_, n, _)| *n == name)
        .map(|(c, _, _)| *c)
}

/// The content type of a [`Problem`].
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A non-OK answer over HTTP: RFC 9457's members plus `code`, the gRPC code's name, which is
/// what a client should match on (two codes share some HTTP statuses, 409 for example).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// RFC 9457 `type`: a URI naming the kind of problem (`about:blank` when none is given).
    #[serde(rename = "type", default = "about_blank")]
    pub kind: String,
    /// A short summary of the kind of problem.
    #[serde(default)]
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, for a person.
    #[serde(default)]
    pub detail: String,
    /// The gRPC code's name (`INVALID_ARGUMENT`, `NOT_FOUND`, ...).
    pub code: String,
}

fn about_blank() -> String {
    "about:blank".into()
}

impl Problem {
    /// The problem body of a gRPC status.
    pub fn of_status(status: &tonic::Status) -> Problem {
        let code = status.code();
        Problem {
            kind: Reason::of_status(status).map_or_else(about_blank, Reason::problem_type),
            title: code.description().to_string(),
            status: http_status(code),
            detail: status.message().to_string(),
            code: code_name(code).to_string(),
        }
    }

    /// The gRPC status this problem stands for (`UNKNOWN` if `code` names none), with the
    /// reason its `type` names.
    pub fn to_status(&self) -> tonic::Status {
        let code = code_named(&self.code).unwrap_or(Code::Unknown);
        match Reason::of_problem_type(&self.kind) {
            Some(reason) if reason.code() == code => reason.status(self.detail.clone()),
            _ => tonic::Status::new(code, self.detail.clone()),
        }
    }

    /// Why the call failed: the reason its `type` names, else the one its code implies.
    pub fn reason(&self) -> Option<Reason> {
        Reason::of_problem_type(&self.kind)
            .or_else(|| code_named(&self.code).and_then(Reason::implied_by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_row_and_round_trips_through_a_problem() {
        for i in 0..17 {
            let code = Code::from(i);
            assert_eq!(
                STATUS_TABLE.iter().filter(|(c, _, _)| *c == code).count(),
                1,
                "{code:?}"
            );
            let status = tonic::Status::new(code, "why");
            let problem = Problem::of_status(&status);
            let json = serde_json::to_string(&problem).unwrap();
            let back: Problem = serde_json::from_str(&json).unwrap();
            assert_eq!(back.to_status().code(), code);
            assert_eq!(back.detail, "why");
        }
    }
}
