//! The model's state, its actions and its settings.

use std::collections::{BTreeMap, BTreeSet};
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
pub(super) enum Phase {
    Pending,
    InFlight,
    Overdue,
    Resolved(bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct KeyState {
    pub(super) generation: u8,
    pub(super) phase: Phase,
    pub(super) requesters: BTreeSet<u8>,
}

/// One abstract state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub(super) keys: BTreeMap<u8, KeyState>,
    /// request → keys it asked for.
    pub(super) reverse: BTreeMap<u8, BTreeSet<u8>>,
    /// This step's new `(request, key, generation)`, in lookup order.
    pub(super) batch: Vec<(u8, u8, u8)>,
    /// Groups the worker holds, as a multiset (sorted): any can finish first.
    pub(super) worker: Vec<Vec<(u8, u8)>>,
    /// Delivered answers `(key, generation, found, given up)`, in delivery
    /// order; a given-up group's entries are misses nobody answered.
    pub(super) published: Vec<(u8, u8, bool, bool)>,
    /// `(key, generation)` of the groups the worker gave up (the table
    /// learns it at once, through the group's interest).
    pub(super) given_up: BTreeSet<(u8, u8)>,
    /// Ghost: probes the table let go (their state was removed or recreated
    /// while overdue or given up); their answers are stale.
    pub(super) released: BTreeSet<(u8, u8)>,
    pub(super) next_generation: u8,
    /// Hits handed out: `(key, generation)`.
    pub(super) tickets: BTreeSet<(u8, u8)>,
    /// Ghost: the backend's answer for each `(key, generation)` delivered.
    pub(super) answers: BTreeMap<(u8, u8), bool>,
    /// Ghost: hits marked as failed loads.
    pub(super) marked: BTreeSet<(u8, u8)>,
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
    pub(super) rules: Rules,
    pub(super) bounds: Bounds,
}

impl Protocol {
    /// The protocol with `rules`, explored within `bounds`.
    pub fn new(rules: Rules, bounds: Bounds) -> Self {
        Self { rules, bounds }
    }
}

pub(super) fn push_entry(
    groups: &mut Vec<(u8, Vec<(u8, u8)>)>,
    request: u8,
    key: u8,
    generation: u8,
) {
    match groups.iter_mut().find(|(r, _)| *r == request) {
        Some((_, entries)) => entries.push((key, generation)),
        None => groups.push((request, vec![(key, generation)])),
    }
}
