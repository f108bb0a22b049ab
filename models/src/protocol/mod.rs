//! An abstract model of the lookup protocol, explored exhaustively.
//!
//! Independent of kvtier's code: a state is the scheduler's key table and
//! reverse index, the step's batch, the groups the worker holds (answered in
//! any order, which also covers a driver that runs groups concurrently), the
//! answers published but not yet applied, and ghost variables that remember
//! which answer the backend gave for each `(key, generation)` and which hits
//! were marked as failed loads. Every scheduler operation and every worker
//! delivery (with every combination of answers) is a transition; breadth-first
//! search visits every reachable state within the bounds.
//!
//! Checked in every reachable state:
//! - **no anomaly**: an answer never meets a state of its generation that is
//!   not in flight;
//! - **no stale verdict**: a lookup's hit or miss is the answer the backend
//!   gave for that very generation (or a miss after that hit was marked);
//! - **reverse index consistent** with the keys' requesters;
//! - **one probe per generation**: a pending state has exactly one batch
//!   entry, an in-flight state exactly one entry among the worker's groups and
//!   the published answers;
//! - **probes are shared**: a key is never probed twice at a time, whatever
//!   the generations, except beside a probe the table let go (overdue, or
//!   given up by the worker);
//! - with bounds: **what is outstanding stays within its bound**, and **a
//!   key overdue when its last request leaves does not outlive it**.
//!
//! The bounds of `LookupLimits` are abstracted: `deadlines` lets any
//! in-flight key become overdue at any moment (a superset of every budget);
//! `max_outstanding` bounds the keys pending or with the worker; `give_up`
//! lets the worker give a group up instead of probing it.
//!
//! Checked from every reachable state (liveness, by a fair completion: flush,
//! deliver everything, apply):
//! - a request that asks for a key it holds gets a verdict;
//! - after every request is cleaned up and everything delivered, no state is
//!   left.
//!
//! [`Rules`] can switch individual guards off, so the tests can show which
//! property breaks without each guard (and which guard is redundant).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

mod checks;
mod model;
mod step;

use model::Phase;
pub use model::{Action, Bounds, Protocol, Report, Rules, State, Violation};

impl Protocol {
    /// Visits every reachable state breadth-first, checking the safety
    /// properties on every transition and state and the liveness properties
    /// from every state. Stops at the first violation (its trace is a
    /// shortest one) or after `max_states` states.
    pub fn explore(&self, max_states: usize) -> Report {
        let initial = State {
            keys: BTreeMap::new(),
            reverse: BTreeMap::new(),
            batch: Vec::new(),
            worker: Vec::new(),
            published: Vec::new(),
            given_up: BTreeSet::new(),
            released: BTreeSet::new(),
            next_generation: 0,
            tickets: BTreeSet::new(),
            answers: BTreeMap::new(),
            marked: BTreeSet::new(),
        };
        // Every state, with the state it was first reached from and how.
        let mut seen: HashMap<State, usize> = HashMap::new();
        let mut parents: Vec<(usize, Option<Action>)> = vec![(usize::MAX, None)];
        let mut states: Vec<State> = vec![initial.clone()];
        seen.insert(initial, 0);
        let mut queue = VecDeque::from([0usize]);
        let mut transitions = 0;
        let trace_to = |parents: &Vec<(usize, Option<Action>)>, mut index: usize| {
            let mut trace = Vec::new();
            while let (parent, Some(action)) = &parents[index] {
                trace.push(action.clone());
                index = *parent;
            }
            trace.reverse();
            trace
        };
        while let Some(index) = queue.pop_front() {
            let state = states[index].clone();
            if let Err(property) = self.invariants(&state).and_then(|()| self.liveness(&state)) {
                return Report {
                    states: states.len(),
                    transitions,
                    violation: Some(Violation {
                        property,
                        trace: trace_to(&parents, index),
                    }),
                };
            }
            for action in self.actions(&state) {
                transitions += 1;
                let mut next = state.clone();
                if let Err(property) = self.step(&mut next, &action) {
                    let mut trace = trace_to(&parents, index);
                    trace.push(action);
                    return Report {
                        states: states.len(),
                        transitions,
                        violation: Some(Violation { property, trace }),
                    };
                }
                if !seen.contains_key(&next) && states.len() < max_states {
                    seen.insert(next.clone(), states.len());
                    parents.push((index, Some(action)));
                    states.push(next);
                    queue.push_back(states.len() - 1);
                }
            }
        }
        Report {
            states: states.len(),
            transitions,
            violation: None,
        }
    }

    /// Every transition enabled in `state`.
    fn actions(&self, state: &State) -> Vec<Action> {
        let mut actions = Vec::new();
        for key in 0..self.bounds.keys {
            // A lookup that creates a state (of an unknown key, or of an
            // orphan whose probe was let go) needs a generation within the
            // bound.
            let fresh = state.keys.get(&key).is_none_or(|entry| {
                self.rules.join_after_release_starts_afresh
                    && entry.requesters.is_empty()
                    && (entry.phase == Phase::Overdue
                        || state.given_up.contains(&(key, entry.generation)))
            });
            for request in 0..self.bounds.requests {
                if !fresh || state.next_generation < self.bounds.generations {
                    actions.push(Action::Lookup { key, request });
                }
            }
        }
        if !state.batch.is_empty() {
            actions.push(Action::Flush);
        }
        for (group, entries) in state.worker.iter().enumerate() {
            if group > 0 && state.worker[group - 1] == *entries {
                continue; // the same group twice: one delivery stands for both
            }
            for bits in 0..1u32 << entries.len() {
                let found = (0..entries.len()).map(|i| bits & (1 << i) != 0).collect();
                actions.push(Action::Deliver { group, found });
            }
        }
        if !state.published.is_empty() {
            actions.push(Action::Apply);
        }
        for request in 0..self.bounds.requests {
            if state.reverse.contains_key(&request) {
                actions.push(Action::Cleanup { request });
            }
        }
        for &(key, generation) in &state.tickets {
            actions.push(Action::MarkMiss { key, generation });
        }
        for key in 0..self.bounds.keys {
            if state.keys.contains_key(&key) {
                actions.push(Action::MarkMissKey { key });
            }
            if self.bounds.deadlines
                && state.keys.get(&key).map(|e| e.phase) == Some(Phase::InFlight)
            {
                actions.push(Action::Expire { key });
            }
        }
        if self.bounds.give_up {
            for (group, entries) in state.worker.iter().enumerate() {
                if group > 0 && state.worker[group - 1] == *entries {
                    continue;
                }
                let wanted = entries.iter().any(|(key, generation)| {
                    state
                        .keys
                        .get(key)
                        .is_some_and(|e| e.generation == *generation && !e.requesters.is_empty())
                });
                if !wanted || !self.rules.give_up_only_unwanted {
                    actions.push(Action::GiveUp { group });
                }
            }
        }
        actions
    }

    /// Keys pending (batch entries whose state is still theirs) or with
    /// the worker (answers not applied yet included).
    fn outstanding(state: &State) -> usize {
        let pending = state
            .batch
            .iter()
            .filter(|&&(_, key, generation)| {
                state
                    .keys
                    .get(&key)
                    .is_some_and(|e| e.generation == generation && e.phase == Phase::Pending)
            })
            .count();
        pending + state.worker.iter().map(Vec::len).sum::<usize>() + state.published.len()
    }
}
