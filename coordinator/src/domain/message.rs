//! Two-phase messages: validation of a prepared definition, and when an unanswered check-back
//! is asked again.
//!
//! A message is PREPARED until its initiator submits or aborts it, or until a check-back asks
//! the initiator's service whether the local transaction committed. Submitted, its branches are
//! delivered like a TCC phase two that only moves forward: in dependency order (branches
//! without dependencies at once), every unknown outcome retried until it succeeds, a refusal
//! parking it - a delivery is never undone. Dropped, nothing is delivered.

use std::collections::BTreeMap;
use std::time::Duration;

use dtx_proto::limits::{self, LimitError};
use dtx_proto::v1::PrepareMessageRequest;

use super::backoff::RetryPolicy;
use super::graph::Graph;
use super::saga::{Definition, Step, StepSpec, plan_steps, resolve_policy};

/// Where and how often the coordinator checks back.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckBack {
    pub target: String,
    pub handler: String,
    /// The message's policy: the check-back's call timeout and the bounds of its backoff.
    pub policy: RetryPolicy,
    /// The message's headers (its trace context among them).
    pub headers: BTreeMap<String, String>,
}

/// A validated message definition.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagePlan {
    /// The deliveries (`action_payload` is what each delivers).
    pub steps: Vec<Step>,
    pub graph: Graph,
    pub check_back: CheckBack,
    /// From PrepareMessage to the first check-back.
    pub check_back_after: Duration,
}

const MESSAGE: Definition = Definition {
    field: "branches",
    step: "branch",
    whole: "message",
    sequential_by_default: false,
};

impl MessagePlan {
    /// Validates a definition (the branches as a saga's steps, and the check-back target);
    /// `default_after` is the coordinator's check-back delay for requests that leave it 0.
    pub fn from_request(
        req: &PrepareMessageRequest,
        default_after: Duration,
    ) -> Result<MessagePlan, LimitError> {
        let check_back = req.check_back.clone().unwrap_or_default();
        limits::check_target("check_back.target", &check_back.target)?;
        limits::check_handler("check_back.handler", &check_back.handler)?;
        let check_back_after = limits::timeout(
            "check_back_after_ms",
            req.check_back_after_ms,
            default_after,
            limits::MAX_TX_TIMEOUT,
        )?;
        let policy = resolve_policy("retry", req.retry.as_ref())?;
        let specs: Vec<StepSpec> = req
            .branches
            .iter()
            .map(|b| StepSpec {
                name: &b.name,
                target: &b.target,
                handler: &b.handler,
                action_payload: &b.payload,
                compensate_payload: &[],
                depends_on: &b.depends_on,
                retry: b.retry.as_ref(),
                headers: &b.headers,
            })
            .collect();
        let (steps, graph) = plan_steps(&MESSAGE, &specs, &req.headers, policy)?;
        Ok(MessagePlan {
            steps,
            graph,
            check_back: CheckBack {
                target: check_back.target,
                handler: check_back.handler,
                policy,
                headers: req.headers.clone(),
            },
            check_back_after,
        })
    }
}

/// When an unanswered check-back is asked again: after as long as the message has been
/// waiting for an answer since its first check-back was due (so the waits double), within the
/// policy's backoff bounds, spread by `jitter` in [0, 1) by up to a fifth.
pub fn next_check_back_ms(
    policy: &RetryPolicy,
    first_due_ms: i64,
    now_ms: i64,
    jitter: f64,
) -> i64 {
    let waited = Duration::from_millis((now_ms - first_due_ms).max(0) as u64);
    let wait = waited.clamp(
        policy.initial_backoff,
        policy.max_backoff.max(policy.initial_backoff),
    );
    now_ms + (wait.as_millis() as f64 * (1.0 + jitter.clamp(0.0, 1.0) / 5.0)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use dtx_proto::v1::{CheckBack as WireCheckBack, MessageBranch};

    fn branch(name: &str, deps: &[&str]) -> MessageBranch {
        MessageBranch {
            name: name.into(),
            target: "http://127.0.0.1:1".into(),
            handler: "h".into(),
            payload: b"p".to_vec(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    fn message(branches: Vec<MessageBranch>) -> PrepareMessageRequest {
        PrepareMessageRequest {
            xid: "m".into(),
            branches,
            check_back: Some(WireCheckBack {
                target: "http://127.0.0.1:2".into(),
                handler: "orders.check".into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn branches_without_dependencies_are_delivered_at_once_and_dependencies_order_them() {
        use crate::domain::BranchState::*;
        let plan = MessagePlan::from_request(
            &message(vec![branch("a", &[]), branch("b", &[])]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(
            plan.graph.runnable(&[Pending, Pending], &[false; 2]),
            [0, 1]
        );
        assert_eq!(plan.check_back_after, Duration::from_secs(10));
        assert_eq!(plan.steps[0].action_payload, b"p");
        let plan = MessagePlan::from_request(
            &message(vec![branch("a", &[]), branch("b", &["a"])]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(plan.graph.runnable(&[Pending, Pending], &[false; 2]), [0]);
        assert_eq!(plan.graph.runnable(&[Done, Pending], &[false; 2]), [1]);
    }

    #[test]
    fn invalid_definitions_name_the_field() {
        let err = |req: PrepareMessageRequest| {
            MessagePlan::from_request(&req, Duration::from_secs(10))
                .unwrap_err()
                .0
        };
        assert!(err(message(vec![])).contains("a message needs at least one branch"));
        let twice = err(message(vec![branch("a", &[]), branch("a", &[])]));
        assert!(twice.contains("branches[1].name") && twice.contains("two branches"));
        assert!(err(message(vec![branch("a", &["z"])])).contains("not a branch of this message"));
        let mut no_check_back = message(vec![branch("a", &[])]);
        no_check_back.check_back = None;
        assert!(err(no_check_back).contains("check_back.target"));
        let mut late = message(vec![branch("a", &[])]);
        late.check_back_after_ms = u64::MAX;
        assert!(err(late).contains("check_back_after_ms"));
    }

    #[test]
    fn unanswered_check_backs_back_off_within_the_policy() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        // Right at the first check-back: the shortest wait.
        assert_eq!(next_check_back_ms(&policy, 1_000, 1_000, 0.0), 1_100);
        // Waiting 3 s so far: wait as long again.
        assert_eq!(next_check_back_ms(&policy, 1_000, 4_000, 0.0), 7_000);
        // Never beyond the bound (plus its jitter).
        assert_eq!(next_check_back_ms(&policy, 0, 600_000, 0.0), 610_000);
        assert_eq!(next_check_back_ms(&policy, 0, 600_000, 0.5), 611_000);
    }
}
