//! A floor under every implementation of the lookup protocol on the step
//! trace: the work no implementation can skip, and nothing else.
//!
//! Whatever else it does, a lookup finds the key's state (one probe of a
//! foldhash map here), and a key never seen before is stored and queued for
//! the backend (an insert and a push). Applying answers finds each answered
//! key's state again, and cleaning up a finished request drops the keys
//! only it asked for. The floor does exactly that and no more:
//! - no requesters: it neither records who asked for a key nor checks
//!   whether a request asked before;
//! - no generations, so a late answer is not told from a current one;
//! - no groups, no bounds, no statistics;
//! - its cleanup is told which keys to drop: it derives a finished
//!   request's own keys from the trace's layout
//!   ([`key_of`](super::key_of) past the shared prefix) instead of knowing
//!   them from its requesters.
//!
//! It is not correct as a lookup table (a key shared by live requests would
//! be dropped by a trace that did not share exactly its prefix), and it is
//! cheaper than any correct one: what a correct design costs beyond it is
//! the price of tracking requesters, generations and groups.

use std::mem;

use hashbrown::HashMap;
use hashbrown::hash_map::Entry;

use super::{KEYS_PER_REQUEST, SHARED_PREFIX, key_of};

/// The floor's state: an answer (or `None`, awaited) per tracked key, and
/// the keys to probe.
#[derive(Default)]
pub struct Floor {
    states: HashMap<u64, Option<bool>>,
    batch: Vec<u64>,
}

impl Floor {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key's answer, if it has one; a new key is stored and queued.
    #[inline]
    pub fn lookup(&mut self, key: u64) -> Option<bool> {
        match self.states.entry(key) {
            Entry::Occupied(state) => *state.get(),
            Entry::Vacant(state) => {
                state.insert(None);
                self.batch.push(key);
                None
            }
        }
    }

    /// The keys queued since the last flush, handed over in `into` (whose
    /// old contents the floor keeps as its next queue, so no step
    /// allocates).
    pub fn flush(&mut self, into: &mut Vec<u64>) {
        into.clear();
        mem::swap(&mut self.batch, into);
    }

    /// Records the backend's answers.
    pub fn apply(&mut self, answers: &[(u64, bool)]) {
        for &(key, found) in answers {
            if let Some(state) = self.states.get_mut(&key) {
                *state = Some(found);
            }
        }
    }

    /// Drops the keys only `request` asked for.
    pub fn cleanup(&mut self, request: u64) {
        for index in SHARED_PREFIX..KEYS_PER_REQUEST {
            self.states.remove(&key_of(request, index));
        }
    }

    /// Keys tracked.
    pub fn len(&self) -> usize {
        self.states.len()
    }
}
