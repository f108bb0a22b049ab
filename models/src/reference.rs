//! The lookup protocol as a specification: what every operation must do,
//! written for clarity, not speed.
//!
//! Deliberately unlike the real table: ordered maps instead of hash maps, no
//! reverse index (cleanup scans every key), the step's batch as a flat list
//! grouped only when it is taken. Only the observable behaviour is shared:
//! verdicts, submissions, key states and the counters that follow from them.

use std::collections::{BTreeMap, BTreeSet};

/// Keys and requests are small integers in the model.
pub type Key = u64;
/// A request id (the request is its id).
pub type Req = u64;

/// Where a key's lookup stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Looked up this step, not yet submitted.
    Pending,
    /// Submitted, no answer applied yet.
    InFlight,
    /// Answered.
    Resolved(bool),
}

/// What a lookup must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// A hit of this generation.
    Hit(u64),
    /// A miss.
    Miss,
    /// Not known yet.
    Pending,
}

/// One key's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyModel {
    /// Unique per incarnation of the key.
    pub generation: u64,
    /// Where its lookup stands.
    pub phase: Phase,
    /// Live requests that asked for it.
    pub requesters: BTreeSet<Req>,
}

/// A submitted group: the request and its `(key, generation)` entries.
pub type ModelGroup = (Req, Vec<(Key, u64)>);

/// Counters the specification determines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Lookups, and how each was answered.
    pub lookups: u64,
    /// Lookups answered with a hit.
    pub hits: u64,
    /// Lookups answered with a miss.
    pub misses: u64,
    /// Lookups answered "pending".
    pub pending: u64,
    /// Keys submitted.
    pub keys_submitted: u64,
    /// Groups submitted.
    pub groups_submitted: u64,
    /// Answers dropped for a missing key or another generation.
    pub stale_results: u64,
    /// Answers that removed an orphaned in-flight key.
    pub orphans_dropped: u64,
    /// Hits turned into misses.
    pub marked_miss: u64,
}

/// The specification's state.
#[derive(Clone, Debug, Default)]
pub struct Reference {
    /// Every tracked key.
    pub keys: BTreeMap<Key, KeyModel>,
    next_generation: u64,
    /// This step's new keys, in lookup order.
    batch: Vec<(Req, Key, u64)>,
    /// Counters.
    pub counts: ModelCounts,
}

impl Reference {
    /// An empty specification state.
    pub fn new() -> Self {
        Self::default()
    }

    /// A lookup: an unknown key starts a new generation and is batched; the
    /// request is recorded; the answer is whatever the key's phase says.
    pub fn lookup(&mut self, key: Key, req: Req) -> Expected {
        if !self.keys.contains_key(&key) {
            let generation = self.next_generation;
            self.next_generation += 1;
            self.keys.insert(
                key,
                KeyModel {
                    generation,
                    phase: Phase::Pending,
                    requesters: BTreeSet::new(),
                },
            );
            self.batch.push((req, key, generation));
        }
        let state = self.keys.get_mut(&key).expect("inserted above");
        state.requesters.insert(req);
        let expected = match state.phase {
            Phase::Pending | Phase::InFlight => Expected::Pending,
            Phase::Resolved(true) => Expected::Hit(state.generation),
            Phase::Resolved(false) => Expected::Miss,
        };
        self.counts.lookups += 1;
        match expected {
            Expected::Hit(_) => self.counts.hits += 1,
            Expected::Miss => self.counts.misses += 1,
            Expected::Pending => self.counts.pending += 1,
        }
        expected
    }

    /// A flush: batch entries still current become in flight, grouped by
    /// request; groups are ordered by the request's first new key of the step
    /// (even if that key was cleaned up since), and empty groups are dropped.
    pub fn take_submission(&mut self) -> Vec<ModelGroup> {
        let mut groups: Vec<ModelGroup> = Vec::new();
        for (req, key, generation) in std::mem::take(&mut self.batch) {
            let index = match groups.iter().position(|(r, _)| *r == req) {
                Some(index) => index,
                None => {
                    groups.push((req, Vec::new()));
                    groups.len() - 1
                }
            };
            let current = self
                .keys
                .get(&key)
                .is_some_and(|s| s.generation == generation && s.phase == Phase::Pending);
            if current {
                self.keys.get_mut(&key).expect("checked").phase = Phase::InFlight;
                groups[index].1.push((key, generation));
            }
        }
        groups.retain(|(_, entries)| !entries.is_empty());
        self.counts.groups_submitted += groups.len() as u64;
        self.counts.keys_submitted += groups.iter().map(|(_, e)| e.len() as u64).sum::<u64>();
        groups
    }

    /// One answer arriving for `(key, generation)`.
    pub fn apply(&mut self, key: Key, generation: u64, found: bool) {
        let Some(state) = self.keys.get_mut(&key) else {
            self.counts.stale_results += 1;
            return;
        };
        if state.generation != generation {
            self.counts.stale_results += 1;
            return;
        }
        assert_eq!(
            state.phase,
            Phase::InFlight,
            "spec: one answer per submitted generation"
        );
        if state.requesters.is_empty() {
            self.keys.remove(&key);
            self.counts.orphans_dropped += 1;
        } else {
            state.phase = Phase::Resolved(found);
        }
    }

    /// A failed load of the hit of `generation`.
    pub fn mark_miss(&mut self, key: Key, generation: u64) -> bool {
        match self.keys.get_mut(&key) {
            Some(state)
                if state.generation == generation && state.phase == Phase::Resolved(true) =>
            {
                state.phase = Phase::Resolved(false);
                self.counts.marked_miss += 1;
                true
            }
            _ => false,
        }
    }

    /// Failed loads reported by key: resolved hits only.
    pub fn mark_miss_keys(&mut self, keys: &[Key]) -> usize {
        let mut changed = 0;
        for key in keys {
            if let Some(state) = self.keys.get_mut(key)
                && state.phase == Phase::Resolved(true)
            {
                state.phase = Phase::Resolved(false);
                changed += 1;
            }
        }
        self.counts.marked_miss += changed as u64;
        changed
    }

    /// A request ends: it leaves every key; keys left alone go, unless in flight.
    pub fn cleanup(&mut self, req: Req) {
        for state in self.keys.values_mut() {
            state.requesters.remove(&req);
        }
        self.keys
            .retain(|_, state| !state.requesters.is_empty() || state.phase == Phase::InFlight);
    }

    /// Live requests: those holding at least one key.
    pub fn requests(&self) -> BTreeSet<Req> {
        self.keys
            .values()
            .flat_map(|s| s.requesters.iter().copied())
            .collect()
    }
}
