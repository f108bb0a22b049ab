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
use std::fmt;

/// The design's guards; `Rules::default()` has them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Applying an answer checks its generation against the state's.
    pub apply_checks_generation: bool,
    /// Cleanup keeps an in-flight state as an orphan instead of removing it.
    pub keep_in_flight_orphans: bool,
    /// An answer for an orphan removes the state instead of resolving it.
    pub remove_answered_orphans: bool,
    /// The flush skips batch entries whose state was removed or recreated.
    pub flush_skips_stale_entries: bool,
    /// `mark_miss` acts only on the ticket's own generation.
    pub ticket_checks_generation: bool,
    /// A lookup of a known key never batches it again.
    pub known_keys_not_rebatched: bool,
    /// A new key beyond the bound on outstanding keys is shed.
    pub admission_bounds_outstanding: bool,
    /// Cleanup removes an overdue key it leaves without requesters.
    pub remove_overdue_orphans: bool,
    /// The worker gives a group up only when none of its keys is wanted.
    pub give_up_only_unwanted: bool,
    /// A lookup of an orphan whose probe is overdue or given up starts a new
    /// generation instead of joining it.
    pub join_after_release_starts_afresh: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            apply_checks_generation: true,
            keep_in_flight_orphans: true,
            remove_answered_orphans: true,
            flush_skips_stale_entries: true,
            ticket_checks_generation: true,
            known_keys_not_rebatched: true,
            admission_bounds_outstanding: true,
            remove_overdue_orphans: true,
            give_up_only_unwanted: true,
            join_after_release_starts_afresh: true,
        }
    }
}

/// How far the exploration goes.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Keys `0..keys`.
    pub keys: u8,
    /// Requests `0..requests` (an id may come back after its cleanup).
    pub requests: u8,
    /// Key states created over the whole run (generations `0..generations`).
    pub generations: u8,
    /// In-flight keys may become overdue.
    pub deadlines: bool,
    /// Keys pending or with the worker, at most (with admission).
    pub max_outstanding: Option<u8>,
    /// The worker may give groups up.
    pub give_up: bool,
}

impl Bounds {
    /// `keys`, `requests` and `generations`, without the bounds of
    /// `LookupLimits`.
    pub fn plain(keys: u8, requests: u8, generations: u8) -> Self {
        Self {
            keys,
            requests,
            generations,
            deadlines: false,
            max_outstanding: None,
            give_up: false,
        }
    }

    /// The same with every bound: deadlines, at most `max_outstanding`
    /// outstanding keys, groups given up.
    pub fn bounded(keys: u8, requests: u8, generations: u8, max_outstanding: u8) -> Self {
        Self {
            deadlines: true,
            max_outstanding: Some(max_outstanding),
            give_up: true,
            ..Self::plain(keys, requests, generations)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    Pending,
    InFlight,
    Overdue,
    Resolved(bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct KeyState {
    generation: u8,
    phase: Phase,
    requesters: BTreeSet<u8>,
}

/// One abstract state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    keys: BTreeMap<u8, KeyState>,
    /// request → keys it asked for.
    reverse: BTreeMap<u8, BTreeSet<u8>>,
    /// This step's new `(request, key, generation)`, in lookup order.
    batch: Vec<(u8, u8, u8)>,
    /// Groups the worker holds, as a multiset (sorted): any can finish first.
    worker: Vec<Vec<(u8, u8)>>,
    /// Delivered answers `(key, generation, found, given up)`, in delivery
    /// order; a given-up group's entries are misses nobody answered.
    published: Vec<(u8, u8, bool, bool)>,
    /// `(key, generation)` of the groups the worker gave up (the table
    /// learns it at once, through the group's interest).
    given_up: BTreeSet<(u8, u8)>,
    /// Ghost: probes the table let go (their state was removed or recreated
    /// while overdue or given up); their answers are stale.
    released: BTreeSet<(u8, u8)>,
    next_generation: u8,
    /// Hits handed out: `(key, generation)`.
    tickets: BTreeSet<(u8, u8)>,
    /// Ghost: the backend's answer for each `(key, generation)` delivered.
    answers: BTreeMap<(u8, u8), bool>,
    /// Ghost: hits marked as failed loads.
    marked: BTreeSet<(u8, u8)>,
}

/// A transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The scheduler looks `key` up for `request`.
    Lookup {
        /// Key.
        key: u8,
        /// Request.
        request: u8,
    },
    /// The scheduler ends its step.
    Flush,
    /// The worker finishes its `group`-th group with these answers.
    Deliver {
        /// Index in the worker's (sorted) groups.
        group: usize,
        /// One answer per key.
        found: Vec<bool>,
    },
    /// The scheduler applies everything published.
    Apply,
    /// A request ends.
    Cleanup {
        /// Request.
        request: u8,
    },
    /// A load of the hit `(key, generation)` failed.
    MarkMiss {
        /// Key.
        key: u8,
        /// Generation of the ticket.
        generation: u8,
    },
    /// A load of `key` failed, reported by key.
    MarkMissKey {
        /// Key.
        key: u8,
    },
    /// `key`'s probe passes its budget.
    Expire {
        /// Key.
        key: u8,
    },
    /// The worker gives its `group`-th group up instead of probing it.
    GiveUp {
        /// Index in the worker's (sorted) groups.
        group: usize,
    },
}

/// A property violation, with the path that reaches it.
#[derive(Debug)]
pub struct Violation {
    /// What went wrong.
    pub property: String,
    /// The actions from the initial state.
    pub trace: Vec<Action>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.property)?;
        for (i, action) in self.trace.iter().enumerate() {
            writeln!(f, "  {i:3}. {action:?}")?;
        }
        Ok(())
    }
}

/// What an exploration found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states visited.
    pub states: usize,
    /// Transitions taken (edges, including those to known states).
    pub transitions: usize,
    /// The first violation found, if any.
    pub violation: Option<Violation>,
}

/// The protocol under a set of rules.
pub struct Protocol {
    rules: Rules,
    bounds: Bounds,
}

impl Protocol {
    /// The protocol with `rules`, explored within `bounds`.
    pub fn new(rules: Rules, bounds: Bounds) -> Self {
        Self { rules, bounds }
    }

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

    /// Takes one transition; `Err` names a safety property it violates.
    fn step(&self, state: &mut State, action: &Action) -> Result<(), String> {
        let rules = self.rules;
        match *action {
            Action::Lookup { key, request } => {
                if rules.join_after_release_starts_afresh
                    && let Some(entry) = state.keys.get(&key)
                    && entry.requesters.is_empty()
                    && (entry.phase == Phase::Overdue
                        || state.given_up.contains(&(key, entry.generation)))
                {
                    // A probe let go is not shared: the key starts afresh.
                    state.released.insert((key, entry.generation));
                    state.keys.remove(&key);
                }
                let known = state.keys.contains_key(&key);
                if !known
                    && rules.admission_bounds_outstanding
                    && self
                        .bounds
                        .max_outstanding
                        .is_some_and(|bound| Self::outstanding(state) >= usize::from(bound))
                {
                    return Ok(()); // shed: a miss, and no state
                }
                if !known {
                    let generation = state.next_generation;
                    state.next_generation += 1;
                    state.keys.insert(
                        key,
                        KeyState {
                            generation,
                            phase: Phase::Pending,
                            requesters: BTreeSet::new(),
                        },
                    );
                    state.batch.push((request, key, generation));
                } else if !rules.known_keys_not_rebatched {
                    let entry = &state.keys[&key];
                    let already = state
                        .batch
                        .iter()
                        .any(|&(_, k, g)| k == key && g == entry.generation);
                    if !entry.requesters.contains(&request) && !already {
                        state.batch.push((request, key, entry.generation));
                    }
                }
                let entry = state.keys.get_mut(&key).expect("present");
                entry.requesters.insert(request);
                state.reverse.entry(request).or_default().insert(key);
                let generation = entry.generation;
                match entry.phase {
                    // Overdue: a miss, which is always safe.
                    Phase::Pending | Phase::InFlight | Phase::Overdue => {}
                    Phase::Resolved(found) => {
                        let answer = state.answers.get(&(key, generation)).copied();
                        let marked = state.marked.contains(&(key, generation));
                        let allowed = answer == Some(found) || (marked && !found);
                        if !allowed {
                            return Err(format!(
                                "stale verdict: key {key} generation {generation} reads found={found}, \
                                 the backend answered {answer:?} for it (marked: {marked})"
                            ));
                        }
                        if found {
                            state.tickets.insert((key, generation));
                        }
                    }
                }
            }
            Action::Flush => {
                let mut groups: Vec<(u8, Vec<(u8, u8)>)> = Vec::new();
                for (request, key, generation) in std::mem::take(&mut state.batch) {
                    let Some(entry) = state.keys.get_mut(&key) else {
                        if rules.flush_skips_stale_entries {
                            continue;
                        }
                        push_entry(&mut groups, request, key, generation);
                        continue;
                    };
                    let current = entry.generation == generation && entry.phase == Phase::Pending;
                    if current {
                        entry.phase = Phase::InFlight;
                    } else if rules.flush_skips_stale_entries {
                        continue;
                    }
                    push_entry(&mut groups, request, key, generation);
                }
                state
                    .worker
                    .extend(groups.into_iter().map(|(_, entries)| entries));
                state.worker.sort();
            }
            Action::Deliver { group, ref found } => {
                let entries = state.worker.remove(group);
                for (&(key, generation), &found) in entries.iter().zip(found) {
                    state.answers.insert((key, generation), found);
                    state.published.push((key, generation, found, false));
                }
            }
            Action::GiveUp { group } => {
                let entries = state.worker.remove(group);
                for &(key, generation) in &entries {
                    state.given_up.insert((key, generation));
                    state.published.push((key, generation, false, true));
                }
            }
            Action::Expire { key } => {
                if let Some(entry) = state.keys.get_mut(&key)
                    && entry.phase == Phase::InFlight
                {
                    entry.phase = Phase::Overdue;
                }
            }
            Action::Apply => {
                for (key, generation, found, given_up) in std::mem::take(&mut state.published) {
                    state.given_up.remove(&(key, generation));
                    state.released.remove(&(key, generation));
                    let _ = given_up;
                    let Some(entry) = state.keys.get_mut(&key) else {
                        continue; // stale: the key is gone
                    };
                    if rules.apply_checks_generation && entry.generation != generation {
                        continue; // stale: another incarnation
                    }
                    if entry.generation == generation
                        && !matches!(entry.phase, Phase::InFlight | Phase::Overdue)
                    {
                        return Err(format!(
                            "anomaly: answer for key {key} generation {generation} meets phase {:?}",
                            entry.phase
                        ));
                    }
                    if rules.remove_answered_orphans && entry.requesters.is_empty() {
                        state.keys.remove(&key);
                    } else {
                        // With the generation check off this may be another
                        // incarnation's answer: the ghost check at the next
                        // lookup compares it with the state's own.
                        entry.phase = Phase::Resolved(found);
                    }
                }
            }
            Action::Cleanup { request } => {
                for key in state.reverse.remove(&request).unwrap_or_default() {
                    let Some(entry) = state.keys.get_mut(&key) else {
                        continue;
                    };
                    entry.requesters.remove(&request);
                    let keep = match entry.phase {
                        Phase::InFlight => rules.keep_in_flight_orphans,
                        Phase::Overdue => !rules.remove_overdue_orphans,
                        _ => false,
                    };
                    if entry.requesters.is_empty() && !keep {
                        if entry.phase == Phase::Overdue {
                            state.released.insert((key, entry.generation));
                        }
                        state.keys.remove(&key);
                    } else if entry.requesters.is_empty() && entry.phase == Phase::Overdue {
                        return Err(format!(
                            "deadline miss outlives its requests: key {key} generation {} stays \
                             overdue with none",
                            entry.generation
                        ));
                    }
                }
            }
            Action::MarkMiss { key, generation } => {
                if let Some(entry) = state.keys.get_mut(&key) {
                    let same = !rules.ticket_checks_generation || entry.generation == generation;
                    if same && entry.phase == Phase::Resolved(true) {
                        entry.phase = Phase::Resolved(false);
                        state.marked.insert((key, generation));
                    }
                }
            }
            Action::MarkMissKey { key } => {
                if let Some(entry) = state.keys.get_mut(&key)
                    && entry.phase == Phase::Resolved(true)
                {
                    entry.phase = Phase::Resolved(false);
                    state.marked.insert((key, entry.generation));
                }
            }
        }
        Ok(())
    }

    /// State invariants: reverse index, one probe per generation.
    fn invariants(&self, state: &State) -> Result<(), String> {
        for (&key, entry) in &state.keys {
            for request in &entry.requesters {
                if !state
                    .reverse
                    .get(request)
                    .is_some_and(|keys| keys.contains(&key))
                {
                    return Err(format!(
                        "reverse index: request {request} holds key {key} unindexed"
                    ));
                }
            }
            let id = (key, entry.generation);
            let batched = state
                .batch
                .iter()
                .filter(|&&(_, k, g)| (k, g) == id)
                .count();
            let probing = state.worker.iter().flatten().filter(|&&e| e == id).count()
                + state
                    .published
                    .iter()
                    .filter(|&&(k, g, _, _)| (k, g) == id)
                    .count();
            let (want_batched, want_probing) = match entry.phase {
                Phase::Pending => (1, 0),
                Phase::InFlight | Phase::Overdue => (0, 1),
                Phase::Resolved(_) => (0, 0),
            };
            if (batched, probing) != (want_batched, want_probing) {
                return Err(format!(
                    "key {key} generation {} in {:?}: {batched} batch entries, {probing} probes",
                    entry.generation, entry.phase
                ));
            }
        }
        // A probe is shared: a key is never probed twice at a time, whatever
        // the generations.
        for key in 0..self.bounds.keys {
            let held = |k: u8, g: u8| k == key && !state.released.contains(&(k, g));
            let probes = state
                .worker
                .iter()
                .flatten()
                .filter(|&&(k, g)| held(k, g))
                .count()
                + state
                    .published
                    .iter()
                    .filter(|&&(k, g, _, given_up)| held(k, g) && !given_up)
                    .count();
            if probes > 1 {
                return Err(format!("key {key} probed {probes} times at once"));
            }
        }
        if let Some(bound) = self.bounds.max_outstanding {
            let outstanding = Self::outstanding(state);
            if outstanding > usize::from(bound) {
                return Err(format!(
                    "outstanding: {outstanding} keys pending or with the worker, bound {bound}"
                ));
            }
        }
        for (request, keys) in &state.reverse {
            for key in keys {
                if !state
                    .keys
                    .get(key)
                    .is_some_and(|e| e.requesters.contains(request))
                {
                    return Err(format!(
                        "reverse index: request {request} lists key {key} it does not hold"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Liveness, by a fair completion from `state`.
    fn liveness(&self, state: &State) -> Result<(), String> {
        // Every request holding a key gets a verdict once the worker delivers.
        let mut done = state.clone();
        self.complete(&mut done)?;
        for (&key, entry) in &state.keys {
            for &request in &entry.requesters {
                let mut asked = done.clone();
                self.step(&mut asked, &Action::Lookup { key, request })?;
                if !matches!(
                    asked.keys.get(&key).map(|e| e.phase),
                    Some(Phase::Resolved(_) | Phase::Overdue)
                ) {
                    return Err(format!(
                        "liveness: request {request} has no verdict for key {key} after every delivery"
                    ));
                }
            }
        }
        // Nothing survives all cleanups and deliveries.
        let mut gone = state.clone();
        for request in 0..self.bounds.requests {
            self.step(&mut gone, &Action::Cleanup { request })?;
        }
        self.complete(&mut gone)?;
        if !gone.keys.is_empty() {
            return Err(format!(
                "liveness: {} key states survive every cleanup and delivery",
                gone.keys.len()
            ));
        }
        Ok(())
    }

    /// Flush, deliver every group (all misses), apply.
    fn complete(&self, state: &mut State) -> Result<(), String> {
        if !state.batch.is_empty() {
            self.step(state, &Action::Flush)?;
        }
        while let Some(entries) = state.worker.first() {
            let found = vec![false; entries.len()];
            self.step(state, &Action::Deliver { group: 0, found })?;
        }
        if !state.published.is_empty() {
            self.step(state, &Action::Apply)?;
        }
        Ok(())
    }
}

fn push_entry(groups: &mut Vec<(u8, Vec<(u8, u8)>)>, request: u8, key: u8, generation: u8) {
    match groups.iter_mut().find(|(r, _)| *r == request) {
        Some((_, entries)) => entries.push((key, generation)),
        None => groups.push((request, vec![(key, generation)])),
    }
}
