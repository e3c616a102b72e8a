//! The declared machine of one entity and the pure decision an event gets against the state an
//! entity is in. No I/O here: [`crate::Entity`] reads the state and writes the move.

use std::collections::HashMap;

use crate::Error;

/// Longest state or machine name (the log's column width).
pub const MAX_NAME: usize = 64;

/// A forward-only state machine: states and the transitions allowed between them, without
/// cycles, so "later" is well defined (a state reachable from another comes after it).
#[derive(Debug, Clone)]
pub struct Machine {
    name: String,
    states: Vec<String>,
    index: HashMap<String, usize>,
    /// `sources[to]`: the states with a transition into `to`.
    sources: Vec<Vec<usize>>,
    /// `after[a][b]`: `b` is reachable from `a` by one or more transitions.
    after: Vec<Vec<bool>>,
}

/// Declares a [`Machine`]: `Machine::builder("order").transition("WAIT_PAY", "PAID")...`.
#[derive(Debug, Clone)]
pub struct MachineBuilder {
    name: String,
    transitions: Vec<(String, String)>,
}

/// Where an event that wants to move an entity to a state stands against its current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A declared transition leads from the current state to the wanted one.
    Move,
    /// The entity is in the wanted state already.
    Here,
    /// The entity is past the wanted state (it is reachable from it): a stale event.
    Past,
    /// Neither: another branch of the machine (e.g. CLOSED when PAID is wanted), or a state
    /// not reachable in one step yet (an event that arrived before its predecessor).
    Off,
}

impl Machine {
    /// Starts declaring the machine `name` (its transitions follow).
    pub fn builder(name: impl Into<String>) -> MachineBuilder {
        MachineBuilder {
            name: name.into(),
            transitions: Vec::new(),
        }
    }

    /// The machine's name, as the transition log records it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `state` is declared.
    pub fn knows(&self, state: &str) -> bool {
        self.index.contains_key(state)
    }

    /// The states with a transition into `to` (the conditional update's `status IN (...)`).
    pub fn sources(&self, to: &str) -> Result<Vec<&str>, Error> {
        let to = self.position(to)?;
        Ok(self.sources[to]
            .iter()
            .map(|&s| self.states[s].as_str())
            .collect())
    }

    /// Whether `later` comes after `earlier` (reachable by one or more transitions).
    pub fn is_after(&self, later: &str, earlier: &str) -> Result<bool, Error> {
        Ok(self.after[self.position(earlier)?][self.position(later)?])
    }

    /// What an event wanting `to` meets in an entity at `current`.
    pub fn step(&self, current: &str, to: &str) -> Result<Step, Error> {
        let (c, t) = (self.position(current)?, self.position(to)?);
        Ok(if c == t {
            Step::Here
        } else if self.sources[t].contains(&c) {
            Step::Move
        } else if self.after[t][c] {
            Step::Past
        } else {
            Step::Off
        })
    }

    fn position(&self, state: &str) -> Result<usize, Error> {
        self.index
            .get(state)
            .copied()
            .ok_or_else(|| Error::UnknownState {
                machine: self.name.clone(),
                state: state.to_string(),
            })
    }
}

impl MachineBuilder {
    /// Declares the transition `from -> to`.
    pub fn transition(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.transitions.push((from.into(), to.into()));
        self
    }

    /// The machine, or why it is not one: a name outside 1..=64 printable ASCII characters,
    /// no transitions, or a cycle (a machine that may return to a state is not forward-only).
    pub fn build(self) -> Result<Machine, Error> {
        check_name("machine", &self.name)?;
        if self.transitions.is_empty() {
            return Err(Error::Machine(format!(
                "{} declares no transition",
                self.name
            )));
        }
        let mut states: Vec<String> = Vec::new();
        let mut index = HashMap::new();
        let mut edges = Vec::new();
        for (from, to) in &self.transitions {
            let mut at = |state: &String| -> Result<usize, Error> {
                check_name("state", state)?;
                Ok(*index.entry(state.clone()).or_insert_with(|| {
                    states.push(state.clone());
                    states.len() - 1
                }))
            };
            edges.push((at(from)?, at(to)?));
        }
        let n = states.len();
        let mut sources = vec![Vec::new(); n];
        let mut after = vec![vec![false; n]; n];
        for &(from, to) in &edges {
            if !sources[to].contains(&from) {
                sources[to].push(from);
            }
            after[from][to] = true;
        }
        // Transitive closure (Floyd-Warshall): machines have a handful of states.
        for k in 0..n {
            let through = after[k].clone();
            for row in after.iter_mut().filter(|row| row[k]) {
                for (reaches, via) in row.iter_mut().zip(&through) {
                    *reaches |= *via;
                }
            }
        }
        if let Some(state) = (0..n).find(|&s| after[s][s]) {
            return Err(Error::Machine(format!(
                "{}: {} can be reached again from itself; a forward-only machine has no cycle",
                self.name, states[state]
            )));
        }
        Ok(Machine {
            name: self.name,
            states,
            index,
            sources,
            after,
        })
    }
}

/// A machine or state name: 1..=64 printable ASCII characters without spaces.
fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Error::Machine(format!(
            "{what} {name:?}: 1..={MAX_NAME} printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order() -> Machine {
        Machine::builder("order")
            .transition("WAIT_PAY", "PAID")
            .transition("PAID", "SHIPPED")
            .transition("SHIPPED", "DELIVERED")
            .transition("WAIT_PAY", "CLOSED")
            .transition("PAID", "REFUNDED")
            .build()
            .unwrap()
    }

    #[test]
    fn an_event_moves_forward_once_and_never_back() {
        let m = order();
        assert_eq!(m.step("WAIT_PAY", "PAID").unwrap(), Step::Move);
        assert_eq!(m.step("PAID", "PAID").unwrap(), Step::Here);
        assert_eq!(m.step("SHIPPED", "PAID").unwrap(), Step::Past);
        assert_eq!(m.step("DELIVERED", "WAIT_PAY").unwrap(), Step::Past);
        assert_eq!(m.step("CLOSED", "PAID").unwrap(), Step::Off);
        assert_eq!(m.step("WAIT_PAY", "SHIPPED").unwrap(), Step::Off, "not yet");
        assert_eq!(m.step("REFUNDED", "SHIPPED").unwrap(), Step::Off);
        assert_eq!(m.sources("PAID").unwrap(), ["WAIT_PAY"]);
        assert!(m.is_after("DELIVERED", "PAID").unwrap());
        assert!(!m.is_after("CLOSED", "PAID").unwrap());
    }

    #[test]
    fn a_machine_with_a_cycle_or_bad_names_is_refused() {
        let cycle = Machine::builder("order")
            .transition("A", "B")
            .transition("B", "C")
            .transition("C", "A")
            .build()
            .unwrap_err();
        assert!(cycle.to_string().contains("no cycle"), "{cycle}");
        assert!(Machine::builder("order").build().is_err());
        assert!(
            Machine::builder("order")
                .transition("A", "B C")
                .build()
                .is_err()
        );
        let unknown = order().step("WAIT_PAY", "LOST").unwrap_err();
        assert!(unknown.to_string().contains("LOST"), "{unknown}");
    }

    proptest::proptest! {
        /// On random forward-only machines (edges only from lower to higher numbers), the
        /// verdicts agree with reachability: Move exactly on declared edges, Past exactly when
        /// the current state is reachable from the wanted one.
        #[test]
        fn verdicts_follow_reachability(edges in proptest::collection::vec((0u8..8, 0u8..8), 1..20)) {
            let edges: Vec<(u8, u8)> = edges.into_iter().filter(|(a, b)| a < b).collect();
            proptest::prop_assume!(!edges.is_empty());
            let mut builder = Machine::builder("m");
            for (a, b) in &edges {
                builder = builder.transition(a.to_string(), b.to_string());
            }
            let m = builder.build().unwrap();
            let reach = |from: u8, to: u8| -> bool {
                let mut seen = vec![from];
                let mut i = 0;
                while i < seen.len() {
                    let s = seen[i];
                    for (a, b) in &edges {
                        if *a == s && !seen.contains(b) {
                            seen.push(*b);
                        }
                    }
                    i += 1;
                }
                seen[1..].contains(&to)
            };
            for c in 0u8..8 {
                for t in 0u8..8 {
                    let (cs, ts) = (c.to_string(), t.to_string());
                    if !m.knows(&cs) || !m.knows(&ts) {
                        continue;
                    }
                    let expected = if c == t {
                        Step::Here
                    } else if edges.contains(&(c, t)) {
                        Step::Move
                    } else if reach(t, c) {
                        Step::Past
                    } else {
                        Step::Off
                    };
                    proptest::prop_assert_eq!(m.step(&cs, &ts).unwrap(), expected);
                }
            }
        }
    }
}
