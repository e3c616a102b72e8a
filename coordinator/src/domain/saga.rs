//! Saga plans: validation of a submitted definition and the pure scheduling rules - which steps
//! may start, which may be compensated, when each phase is over.
//!
//! Forward: a step starts when every step it depends on is `Done`; with no `depends_on`
//! anywhere, steps run in the order given. Compensation covers every step that *may have run*
//! (`Done`, or `InDoubt`: attempted with an unknown outcome); a step is compensated only after
//! every step depending on it is settled, i.e. in reverse dependency order, concurrently where
//! the graph allows. A step that answered FAILURE (`Refused`) had no effect and is left alone.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use dtx_proto::limits::{self, LimitError};
use dtx_proto::v1::{RetryPolicy as WirePolicy, SubmitSagaRequest};

use super::backoff::RetryPolicy;
use super::graph::Graph;

/// One step of a validated saga.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub target: String,
    pub handler: String,
    pub action_payload: Vec<u8>,
    pub compensate_payload: Vec<u8>,
    pub retry: RetryPolicy,
    /// The saga's headers overlaid with the step's own.
    pub headers: BTreeMap<String, String>,
}

/// A validated saga definition.
#[derive(Debug, Clone, PartialEq)]
pub struct SagaPlan {
    pub steps: Vec<Step>,
    pub graph: Graph,
    pub timeout: Duration,
}

/// Resolves a wire policy: zero fields take the defaults; timeouts are checked against limits.
pub fn resolve_policy(field: &str, wire: Option<&WirePolicy>) -> Result<RetryPolicy, LimitError> {
    let default = RetryPolicy::default();
    let Some(wire) = wire else { return Ok(default) };
    let max = limits::MAX_CALL_TIMEOUT;
    Ok(RetryPolicy {
        max_attempts: if wire.max_attempts == 0 {
            default.max_attempts
        } else {
            wire.max_attempts
        },
        initial_backoff: limits::timeout(
            &format!("{field}.initial_backoff_ms"),
            wire.initial_backoff_ms,
            default.initial_backoff,
            max,
        )?,
        max_backoff: limits::timeout(
            &format!("{field}.max_backoff_ms"),
            wire.max_backoff_ms,
            default.max_backoff,
            max,
        )?,
        call_timeout: limits::timeout(
            &format!("{field}.call_timeout_ms"),
            wire.call_timeout_ms,
            default.call_timeout,
            max,
        )?,
    })
}

impl SagaPlan {
    /// Validates a definition: limits, unique step names, known dependencies, no cycles.
    /// Nothing about the definition is stored unless this succeeds.
    pub fn from_request(req: &SubmitSagaRequest) -> Result<SagaPlan, LimitError> {
        let timeout = limits::timeout(
            "timeout_ms",
            req.timeout_ms,
            limits::DEFAULT_TX_TIMEOUT,
            limits::MAX_TX_TIMEOUT,
        )?;
        let specs: Vec<StepSpec> = req
            .steps
            .iter()
            .map(|s| StepSpec {
                name: &s.name,
                target: &s.target,
                handler: &s.handler,
                action_payload: &s.action_payload,
                compensate_payload: &s.compensate_payload,
                depends_on: &s.depends_on,
                retry: s.retry.as_ref(),
                headers: &s.headers,
            })
            .collect();
        let policy = resolve_policy("retry", req.retry.as_ref())?;
        let (steps, graph) = plan_steps(&SAGA, &specs, &req.headers, policy)?;
        Ok(SagaPlan {
            steps,
            graph,
            timeout,
        })
    }
}

/// A step as a definition states it: a saga's step or a message's branch.
pub struct StepSpec<'a> {
    pub name: &'a str,
    pub target: &'a str,
    pub handler: &'a str,
    pub action_payload: &'a [u8],
    pub compensate_payload: &'a [u8],
    pub depends_on: &'a [String],
    pub retry: Option<&'a WirePolicy>,
    pub headers: &'a BTreeMap<String, String>,
}

/// How a kind of definition names its parts (in error messages) and orders steps that
/// declare no dependencies at all.
pub struct Definition {
    /// The request's field holding the steps (also their plural in messages).
    pub field: &'static str,
    /// One step, and the whole.
    pub step: &'static str,
    pub whole: &'static str,
    /// Without any `depends_on`: one after another in the order given (else all at once).
    pub sequential_by_default: bool,
}

const SAGA: Definition = Definition {
    field: "steps",
    step: "step",
    whole: "saga",
    sequential_by_default: true,
};

/// Validates steps (limits, unique names, known dependencies, no cycles) and builds their
/// graph; `policy` applies to steps without their own, `headers` are overlaid by each step's.
pub fn plan_steps(
    def: &Definition,
    specs: &[StepSpec],
    headers: &BTreeMap<String, String>,
    policy: RetryPolicy,
) -> Result<(Vec<Step>, Graph), LimitError> {
    let Definition {
        field: all,
        step: noun,
        whole,
        ..
    } = def;
    if specs.is_empty() {
        return Err(LimitError(format!(
            "{all}: a {whole} needs at least one {noun}"
        )));
    }
    limits::check_branch_count(all, specs.len())?;
    limits::check_headers("headers", headers)?;
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, spec) in specs.iter().enumerate() {
        let field = format!("{all}[{i}]");
        limits::check_branch_id(&format!("{field}.name"), spec.name)?;
        if index.insert(spec.name, i).is_some() {
            return Err(LimitError(format!(
                "{field}.name {:?} is used by two {all}",
                spec.name
            )));
        }
    }
    let sequential = def.sequential_by_default && specs.iter().all(|s| s.depends_on.is_empty());
    let mut steps = Vec::with_capacity(specs.len());
    let mut graph = Graph::independent(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let field = format!("{all}[{i}]");
        limits::check_target(&format!("{field}.target"), spec.target)?;
        limits::check_handler(&format!("{field}.handler"), spec.handler)?;
        limits::check_payload(&format!("{field}.action_payload"), spec.action_payload)?;
        limits::check_payload(
            &format!("{field}.compensate_payload"),
            spec.compensate_payload,
        )?;
        limits::check_headers(&format!("{field}.headers"), spec.headers)?;
        let retry = match spec.retry {
            Some(own) => resolve_policy(&format!("{field}.retry"), Some(own))?,
            None => policy,
        };
        if sequential {
            if i > 0 {
                graph.add_edge(i - 1, i);
            }
        } else {
            for dep in spec.depends_on {
                let Some(&d) = index.get(dep.as_str()) else {
                    return Err(LimitError(format!(
                        "{field}.depends_on names {dep:?}, which is not a {noun} of this {whole}"
                    )));
                };
                if d == i {
                    return Err(LimitError(format!("{field} depends on itself")));
                }
                graph.add_edge(d, i);
            }
        }
        let mut merged = headers.clone();
        merged.extend(spec.headers.clone());
        limits::check_headers(&format!("{field}.headers (with the {whole}'s)"), &merged)?;
        let compensate_payload = if spec.compensate_payload.is_empty() {
            spec.action_payload
        } else {
            spec.compensate_payload
        };
        steps.push(Step {
            name: spec.name.to_string(),
            target: spec.target.to_string(),
            handler: spec.handler.to_string(),
            action_payload: spec.action_payload.to_vec(),
            compensate_payload: compensate_payload.to_vec(),
            retry,
            headers: merged,
        });
    }
    if let Some(cycle) = graph.find_cycle() {
        let names: Vec<&str> = cycle.iter().map(|&i| steps[i].name.as_str()).collect();
        return Err(LimitError(format!(
            "{all}: the dependencies form a cycle through {names:?}"
        )));
    }
    Ok((steps, graph))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::graph::{forward_complete, saga_needs_compensation, turn_to_compensation};
    use crate::domain::status::BranchState;
    use BranchState::*;
    use dtx_proto::v1::SagaStep;
    use proptest::prelude::*;

    fn step(name: &str, deps: &[&str]) -> SagaStep {
        SagaStep {
            name: name.into(),
            target: "http://127.0.0.1:1".into(),
            handler: "h".into(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    fn saga(steps: Vec<SagaStep>) -> SubmitSagaRequest {
        SubmitSagaRequest {
            xid: "x".into(),
            steps,
            ..Default::default()
        }
    }

    #[test]
    fn steps_without_dependencies_run_in_order() {
        let plan =
            SagaPlan::from_request(&saga(vec![step("a", &[]), step("b", &[]), step("c", &[])]))
                .unwrap();
        let states = [Pending, Pending, Pending];
        assert_eq!(plan.graph.runnable(&states, &[false; 3]), vec![0]);
        assert_eq!(
            plan.graph.runnable(&[Done, Pending, Pending], &[false; 3]),
            vec![1]
        );
        // Compensation runs in reverse: c first, then b, then a.
        assert_eq!(
            plan.graph
                .settleable(&[Done, Done, InDoubt], &[false; 3], saga_needs_compensation),
            vec![2]
        );
        assert_eq!(
            plan.graph.settleable(
                &[Done, Done, Compensated],
                &[false; 3],
                saga_needs_compensation
            ),
            vec![1]
        );
        assert_eq!(
            plan.graph.settleable(
                &[Done, Refused, Skipped],
                &[false; 3],
                saga_needs_compensation
            ),
            vec![0]
        );
    }

    #[test]
    fn independent_steps_run_and_compensate_concurrently() {
        let plan = SagaPlan::from_request(&saga(vec![
            step("a", &[]),
            step("b", &[]),
            step("c", &["a", "b"]),
        ]))
        .unwrap();
        // a and b have no deps in a DAG saga: both start at once.
        assert_eq!(
            plan.graph
                .runnable(&[Pending, Pending, Pending], &[false; 3]),
            vec![0, 1]
        );
        assert_eq!(
            plan.graph
                .runnable(&[Done, InDoubt, Pending], &[false, true, false]),
            Vec::<usize>::new()
        );
        assert_eq!(
            plan.graph.runnable(&[Done, Done, Pending], &[false; 3]),
            vec![2]
        );
        // c refused: a and b compensate together.
        assert_eq!(
            plan.graph
                .settleable(&[Done, Done, Refused], &[false; 3], saga_needs_compensation),
            vec![0, 1]
        );
        assert_eq!(
            plan.graph
                .settleable(&[Done, Done, InDoubt], &[false; 3], saga_needs_compensation),
            vec![2]
        );
    }

    #[test]
    fn invalid_definitions_are_rejected_with_a_reason() {
        let err = |req| SagaPlan::from_request(&req).unwrap_err().0;
        assert!(err(saga(vec![])).contains("at least one step"));
        assert!(err(saga(vec![step("a", &[]), step("a", &[])])).contains("used by two steps"));
        assert!(err(saga(vec![step("a", &["zz"])])).contains("not a step"));
        assert!(err(saga(vec![step("a", &["a"])])).contains("depends on itself"));
        let cycle = err(saga(vec![
            step("a", &["c"]),
            step("b", &["a"]),
            step("c", &["b"]),
            step("d", &[]),
        ]));
        assert!(
            cycle.contains("cycle") && cycle.contains("\"a\"") && !cycle.contains("\"d\""),
            "{cycle}"
        );
        let many = (0..65).map(|i| step(&format!("s{i}"), &[])).collect();
        assert!(err(saga(many)).contains("limit of 64"));
        let mut bad = step("a", &[]);
        bad.target = "not a uri".into();
        assert!(err(saga(vec![bad])).contains("steps[0].target"));
    }

    #[test]
    fn compensation_payload_defaults_to_the_action_payload_and_headers_merge() {
        let mut s = step("a", &[]);
        s.action_payload = b"pay".to_vec();
        s.headers.insert("k".into(), "step".into());
        let mut req = saga(vec![s]);
        req.headers.insert("k".into(), "saga".into());
        req.headers.insert("t".into(), "1".into());
        let plan = SagaPlan::from_request(&req).unwrap();
        assert_eq!(plan.steps[0].compensate_payload, b"pay");
        assert_eq!(plan.steps[0].headers.get("k").unwrap(), "step");
        assert_eq!(plan.steps[0].headers.get("t").unwrap(), "1");
    }

    // Random DAGs (edges only from lower to higher index, so acyclic) and random outcomes:
    // driving the plan never starts a step before its deps are done, and compensation never
    // undoes a step while one depending on it still needs undoing.
    proptest! {
        #[test]
        fn scheduling_respects_the_graph(deps in crate::domain::graph::dag(8), outcomes in proptest::collection::vec(0u8..3, 8)) {
            let names: Vec<String> = (0..deps.len()).map(|i| format!("s{i}")).collect();
            let steps = deps.iter().enumerate().map(|(i, d)| {
                let ds: Vec<&str> = d.iter().map(|&j| names[j].as_str()).collect();
                step(&names[i], &ds)
            }).collect();
            let plan = SagaPlan::from_request(&saga(steps)).unwrap();
            let n = plan.steps.len();
            let mut states = vec![Pending; n];
            let idle = vec![false; n];
            // Forward until a refusal or done.
            let mut refused = false;
            while !refused && !forward_complete(&states) {
                let ready = plan.graph.runnable(&states, &idle);
                prop_assert!(!ready.is_empty(), "forward must not get stuck: {states:?}");
                for i in ready {
                    prop_assert!(plan.graph.deps(i).iter().all(|&d| states[d] == Done));
                    states[i] = match outcomes[i] { 0 => Refused, 1 => InDoubt, _ => Done };
                    if states[i] != Done { refused = true; }
                }
            }
            if refused {
                turn_to_compensation(&mut states);
                while states.iter().any(|s| saga_needs_compensation(*s)) {
                    let ready = plan.graph.settleable(&states, &idle, saga_needs_compensation);
                    prop_assert!(!ready.is_empty(), "compensation must not get stuck: {states:?}");
                    for i in ready {
                        for &j in plan.graph.dependents(i) {
                            prop_assert!(!saga_needs_compensation(states[j]));
                        }
                        states[i] = Compensated;
                    }
                }
                prop_assert!(!states.contains(&Pending));
            }
        }
    }
}
