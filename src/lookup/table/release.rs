//! Release: a finished request's cleanup, and the memory it gives back.

use std::hash::Hash;
use std::mem;

use crate::lookup::types::{Phase, Request};

use super::state::LookupTable;
use super::storage::{NO_EPOCH, REUSE_KEYS, SPARE_SLOTS, shrink_map};

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// Forgets request `id`: it no longer holds any key.
    ///
    /// A key left without requesters is removed, unless its probe is in
    /// flight: that state stays (an orphan) so a later request for the same
    /// key shares the probe instead of submitting a second one; if nobody
    /// joins, its answer removes it. Unknown ids are a no-op.
    pub fn cleanup(&mut self, id: &R::Id) {
        let Some(slot) = self.slot_of.remove(id) else {
            return;
        };
        let record = &mut self.slots[slot as usize];
        record.id = None;
        record.cursor = 0;
        record.batch_epoch = NO_EPOCH;
        let mut keys = mem::take(&mut record.keys);
        for cell in keys.drain(..) {
            let entry = self.keys.entry_mut(cell);
            self.overflow.remove(entry, slot);
            let state = *entry;
            if state.has_requesters() {
                continue;
            }
            match state.phase(self.flushed_below, self.overdue_below) {
                // guard: L3-inflight-retention
                Phase::InFlight => {
                    super::step::lose_interest(&self.interest_of, state.group);
                    // kept as an orphan, so a later request shares the probe
                }
                Phase::Overdue => {
                    // L13: a probe past its budget is not worth sharing; its
                    // state goes now, and its answer will be stale.
                    super::step::lose_interest(&self.interest_of, state.group);
                    // guard: L13-overdue-orphans-are-removed
                    self.keys.remove_cell(cell);
                }
                Phase::Pending => {
                    self.dropped_pending.insert(state.generation);
                    self.batched_keys -= 1;
                    self.keys.remove_cell(cell);
                }
                Phase::Resolved { .. } => {
                    self.keys.remove_cell(cell);
                }
            }
        }
        // A free slot keeps its key list's allocation for the next request,
        // but only while free slots are not many more than live ones.
        if keys.capacity() <= REUSE_KEYS
            && self.free_slots.len() <= self.slot_of.len() + SPARE_SLOTS
        {
            self.slots[slot as usize].keys = keys;
        }
        self.free_slots.push(slot);
        self.shrink_if_sparse();
    }

    /// Gives memory back after large cleanups, amortised. The maps shrink to
    /// twice their contents once at most an eighth of their capacity is
    /// used (not sooner: a map that breathes with the steps is not resized
    /// back and forth): each shrink costs what the cleanups since the last
    /// one removed.
    /// The slots are compacted (trailing free slots dropped, the other free
    /// slots' key lists released) once at most a quarter of them is live and
    /// the live count has halved since the last compaction, or dropped to
    /// zero: a few compactions per wave of requests, however large.
    pub(super) fn shrink_if_sparse(&mut self) {
        if let Some(moved_to) = self.keys.shrink_if_sparse() {
            for slot in &mut self.slots {
                for cell in &mut slot.keys {
                    *cell = moved_to[*cell as usize];
                }
            }
        }
        shrink_map(&mut self.slot_of);
        shrink_map(&mut self.interest_of);
        let live = self.slot_of.len();
        self.compact_below = self.compact_below.max(live / 2);
        let sparse = self.slots.len() > SPARE_SLOTS && live * 4 < self.slots.len();
        if !sparse || (live >= self.compact_below && live > 0) {
            return;
        }
        while self.slots.last().is_some_and(|slot| slot.id.is_none()) {
            self.slots.pop();
        }
        self.slots.shrink_to_fit();
        self.free_slots.clear();
        // Lowest first out, so the slots at the end stay free and go at the
        // next compaction.
        for (index, slot) in self.slots.iter_mut().enumerate().rev() {
            if slot.id.is_none() {
                slot.keys = Vec::new();
                self.free_slots.push(index as u32);
            }
        }
        self.free_slots.shrink_to_fit();
        self.batch_groups.shrink_to(self.batch_groups.len());
        self.compact_below = live / 2;
    }
}
