//! What a participant's answer to a branch call proves: the one classification table the
//! coordinator and the SDK's TCC client both apply.
//!
//! | answer                                                    | class     | why |
//! |-----------------------------------------------------------|-----------|-----|
//! | `BranchResponse` with `OUTCOME_SUCCESS`                   | success   | the participant says it is done (its barrier keeps the first result) |
//! | `BranchResponse` with `OUTCOME_FAILURE`                   | refused   | the only proof of "no effect": a well-formed answer from the handler's own barrier |
//! | `BranchResponse` with `OUTCOME_RETRY` or no outcome       | unknown   | in progress or transient, by the participant's own word |
//! | any gRPC status, whatever its code (`UNIMPLEMENTED`, `NOT_FOUND`, `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `UNAVAILABLE`, ...) | unknown | a status has no body: it may come from a proxy or gateway (an HTTP 404/503 without `grpc-status` arrives as `UNIMPLEMENTED`/`UNAVAILABLE`), from a replica mid-deploy that lacks the handler while another has run it, or from a handler that committed and then failed to answer |
//! | no answer within the call timeout, transport error, undecodable reply | unknown | the request may have been delivered and committed |
//! | the call was never sent (the target is not a valid endpoint) | not sent | nothing left this process |
//!
//! The texts are a participant's words: kept as one line of at most 512 bytes
//! ([`crate::present::reason`]) before they reach logs, the history, alerts or the console.
//!
//! Unknown is retried with backoff (the barrier makes repeats safe); a saga step abandoned in
//! doubt is compensated, never skipped.

use tonic::Status;

use crate::present::reason;
use crate::v1::{BranchResponse, Outcome};

/// The class of one branch-call answer (see the module table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// SUCCESS, with the result payload.
    Success(Vec<u8>),
    /// An explicit FAILURE in a well-formed response: refused without effect.
    Refused(String),
    /// The effect may or may not have happened; the text says what was seen.
    Unknown(String),
}

impl Answer {
    /// Classifies a decoded response.
    pub fn of_response(response: BranchResponse) -> Answer {
        match response.outcome() {
            Outcome::Success => Answer::Success(response.result),
            Outcome::Failure => Answer::Refused(reason(&if response.message.is_empty() {
                String::from_utf8_lossy(&response.result).into_owned()
            } else {
                response.message
            })),
            Outcome::Retry => Answer::Unknown(format!("RETRY: {}", reason(&response.message))),
            Outcome::Unspecified => Answer::Unknown("answer without an outcome".into()),
        }
    }

    /// Classifies a status-only answer: always unknown, whatever the code.
    pub fn of_status(status: &Status) -> Answer {
        // A failed connection's status says "transport error"; its causes say which (a
        // refused certificate, a connection refused): keep them for the history.
        let mut causes = String::new();
        let mut next = std::error::Error::source(status);
        while let Some(cause) = next {
            causes.push_str(": ");
            causes.push_str(&cause.to_string());
            next = cause.source();
        }
        Answer::Unknown(format!(
            "{:?} (a status without a response proves nothing about the effect): {}",
            status.code(),
            reason(&format!("{}{causes}", status.message()))
        ))
    }

    /// Classifies the result of one call.
    pub fn of_result(result: Result<tonic::Response<BranchResponse>, Status>) -> Answer {
        match result {
            Ok(response) => Answer::of_response(response.into_inner()),
            Err(status) => Answer::of_status(&status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn response(outcome: Outcome, result: &[u8], message: &str) -> BranchResponse {
        BranchResponse {
            outcome: outcome as i32,
            result: result.to_vec(),
            message: message.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_explicit_failure_is_a_refusal() {
        assert_eq!(
            Answer::of_response(response(Outcome::Success, b"r", "")),
            Answer::Success(b"r".to_vec())
        );
        assert_eq!(
            Answer::of_response(response(Outcome::Failure, b"", "no funds")),
            Answer::Refused("no funds".into())
        );
        assert_eq!(
            Answer::of_response(response(Outcome::Failure, b"why", "")),
            Answer::Refused("why".into())
        );
        assert!(matches!(
            Answer::of_response(response(Outcome::Retry, b"", "busy")),
            Answer::Unknown(_)
        ));
        assert!(matches!(
            Answer::of_response(BranchResponse {
                outcome: 99,
                ..Default::default()
            }),
            Answer::Unknown(_)
        ));
    }

    #[test]
    fn every_status_code_is_unknown() {
        for code in 0..=16 {
            let status = Status::new(Code::from_i32(code), "x");
            assert!(
                matches!(Answer::of_status(&status), Answer::Unknown(_)),
                "{code}"
            );
        }
    }
}
