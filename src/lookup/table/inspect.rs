//! Read-only views of the table, for checkers, tools and compatibility
//! layers (the Python package's view of vLLM's private lookup state). None
//! is on a scheduler's path, and none is part of the stable API.

use std::hash::Hash;

use super::state::LookupTable;
use crate::lookup::types::{Generation, KeyState, Request};

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// The state of `key`, if the table tracks it.
    #[doc(hidden)]
    pub fn key_state(&self, key: &K) -> Option<KeyState> {
        let cell = self.keys.find(self.keys.hash(key), key)?;
        let state = self.keys.get(cell)?.entry;
        Some(KeyState {
            generation: state.generation(),
            phase: state.phase(self.flushed_below, self.overdue_below),
            requesters: self.overflow.count(state),
        })
    }

    /// Every tracked key (orphaned in-flight probes included), in no
    /// particular order.
    #[doc(hidden)]
    pub fn tracked_keys(&self) -> Vec<K> {
        self.keys
            .iter()
            .map(|(_, record)| record.key.clone())
            .collect()
    }

    /// The live requests' ids, in no particular order.
    #[doc(hidden)]
    pub fn request_ids(&self) -> Vec<R::Id> {
        self.slot_of.keys().cloned().collect()
    }

    /// The keys live request `id` asked for, in the order it first asked;
    /// `None` for a request the table does not hold.
    #[doc(hidden)]
    pub fn request_keys(&self, id: &R::Id) -> Option<Vec<K>> {
        let slot = *self.slot_of.get(id)?;
        let cells = &self.slots[slot as usize].keys;
        Some(
            cells
                .iter()
                .filter_map(|&cell| self.keys.get(cell).map(|record| record.key.clone()))
                .collect(),
        )
    }

    /// The keys the next flush hands to the prober, with the request whose
    /// group each is in and its generation, in batch order. A key cleaned
    /// up since it was batched is left out, as the flush leaves it out.
    #[doc(hidden)]
    pub fn batched(&self) -> Vec<(K, R::Id, Generation)> {
        self.batch
            .iter()
            .flat_map(|group| {
                let id = group.request.id();
                group
                    .keys
                    .iter()
                    .zip(&group.generations)
                    .filter(|(_, generation)| !self.dropped_pending.contains(&generation.0))
                    .map(move |(key, generation)| (key.clone(), id.clone(), *generation))
            })
            .collect()
    }
}
