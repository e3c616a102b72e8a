//! The scheduling rules shared by saga execution and TCC phase two.
//!
//! Steps form a dependency graph (a TCC transaction's branches: no edges). Forward, a step
//! starts when every step it depends on is `Done`. When settling - TCC Confirm/Cancel or saga
//! compensation - a step that still *needs settling* is taken once every step depending on it
//! no longer does: compensation runs in reverse dependency order, concurrently where the graph
//! allows; independent TCC branches all settle at once.

use super::status::BranchState;

/// A dependency graph over steps `0..n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    deps: Vec<Vec<usize>>,
    dependents: Vec<Vec<usize>>,
}

impl Graph {
    /// `n` steps without dependencies.
    pub fn independent(n: usize) -> Graph {
        Graph {
            deps: vec![Vec::new(); n],
            dependents: vec![Vec::new(); n],
        }
    }

    /// `after` may only start once `before` is done.
    pub fn add_edge(&mut self, before: usize, after: usize) {
        if !self.deps[after].contains(&before) {
            self.deps[after].push(before);
            self.dependents[before].push(after);
        }
    }

    pub fn len(&self) -> usize {
        self.deps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    pub fn deps(&self, step: usize) -> &[usize] {
        &self.deps[step]
    }

    pub fn dependents(&self, step: usize) -> &[usize] {
        &self.dependents[step]
    }

    /// Steps on (or behind) a dependency cycle, if any (Kahn's algorithm: what cannot be
    /// ordered).
    pub fn find_cycle(&self) -> Option<Vec<usize>> {
        let mut missing: Vec<usize> = self.deps.iter().map(Vec::len).collect();
        let mut ready: Vec<usize> = (0..self.len()).filter(|&i| missing[i] == 0).collect();
        let mut ordered = 0;
        while let Some(i) = ready.pop() {
            ordered += 1;
            for &j in &self.dependents[i] {
                missing[j] -= 1;
                if missing[j] == 0 {
                    ready.push(j);
                }
            }
        }
        (ordered < self.len()).then(|| (0..self.len()).filter(|&i| missing[i] > 0).collect())
    }

    /// Steps that may start (or, in doubt after an unknown outcome, retry) forward now: not in
    /// flight, every dependency done.
    pub fn runnable(&self, states: &[BranchState], in_flight: &[bool]) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| {
                matches!(states[i], BranchState::Pending | BranchState::InDoubt) && !in_flight[i]
            })
            .filter(|&i| self.deps[i].iter().all(|&d| states[d] == BranchState::Done))
            .collect()
    }

    /// Steps that may be settled now: they need it, are not in flight, and no step depending
    /// on them still needs it.
    pub fn settleable(
        &self,
        states: &[BranchState],
        in_flight: &[bool],
        needs: fn(BranchState) -> bool,
    ) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| needs(states[i]) && !in_flight[i] && states[i] != BranchState::Stuck)
            .filter(|&i| self.dependents[i].iter().all(|&j| !needs(states[j])))
            .collect()
    }
}

/// Every forward action succeeded.
pub fn forward_complete(states: &[BranchState]) -> bool {
    states.iter().all(|s| *s == BranchState::Done)
}

/// A saga step that may have run and is not compensated yet.
pub fn saga_needs_compensation(state: BranchState) -> bool {
    matches!(
        state,
        BranchState::Done | BranchState::InDoubt | BranchState::Stuck
    )
}

/// A TCC branch not yet confirmed/cancelled.
pub fn tcc_needs_settling(state: BranchState) -> bool {
    matches!(
        state,
        BranchState::Pending | BranchState::InDoubt | BranchState::Stuck
    )
}

/// The states at the moment a saga turns to compensation: steps that never started are
/// skipped (and never will start). Only a driver that knows every call it made may call this:
/// see [`take_over_forward`] for states read back from the store.
pub fn turn_to_compensation(states: &mut [BranchState]) {
    for s in states.iter_mut() {
        if *s == BranchState::Pending {
            *s = BranchState::Skipped;
        }
    }
}

/// The states of a running saga taken over from the store (its previous driver crashed,
/// stalled or handed it back). Per-step progress is not written on the hot path, so a step
/// recorded `Pending` may well have been sent and even have run: after a takeover, "not
/// recorded as started" does not mean "never sent". Every such step is in doubt, so a later
/// turn compensates it (the barrier turns an unneeded compensation into an empty one and
/// blocks the late action) instead of skipping it.
pub fn take_over_forward(states: &mut [BranchState]) {
    for s in states.iter_mut() {
        if *s == BranchState::Pending {
            *s = BranchState::InDoubt;
        }
    }
}

/// Random dependency lists for property tests: step `i` depends on up to three steps before
/// it (so the graph is acyclic), `1..max_steps` steps.
#[cfg(test)]
pub(crate) fn dag(max_steps: usize) -> impl proptest::strategy::Strategy<Value = Vec<Vec<usize>>> {
    use proptest::strategy::Strategy;
    (1usize..max_steps).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                proptest::collection::vec(0..i.max(1), 0..=i.min(3))
                    .prop_map(move |d| if i == 0 { vec![] } else { d })
            })
            .collect::<Vec<_>>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use BranchState::*;

    #[test]
    fn a_taken_over_saga_skips_nothing_at_its_turn() {
        // As read back from the store after a crash: nothing recorded past the submit.
        let mut states = [Done, Pending, Pending];
        take_over_forward(&mut states);
        turn_to_compensation(&mut states);
        assert_eq!(states, [Done, InDoubt, InDoubt]);
        assert!(states.iter().all(|s| saga_needs_compensation(*s)));
        // A live driver knows what it never sent.
        let mut live = [Done, InDoubt, Pending];
        turn_to_compensation(&mut live);
        assert_eq!(live, [Done, InDoubt, Skipped]);
    }
}
