//! The table's structural self-check: the key slab and its index, the
//! reverse index, the requester lists and their indexes, and the free-slot
//! list agree.

use std::hash::Hash;

use hashbrown::HashMap;

use super::state::LookupTable;
use super::storage::{INDEX_ABOVE, NONE, Overflow};
use crate::lookup::submission::Interest;
use crate::lookup::types::{Phase, Request};
use crate::sync::Arc;

impl Overflow {
    /// Every index agrees with its list, and exactly the long lists have one.
    fn check_positions(&self) -> Result<(), String> {
        for (more, list) in self.lists.iter().enumerate() {
            let index = self.positions.get(&(more as u32));
            match index {
                None if list.len() > INDEX_ABOVE => {
                    return Err(format!(
                        "requester list {more} of {} is not indexed",
                        list.len()
                    ));
                }
                Some(_) if list.len() <= INDEX_ABOVE => {
                    return Err(format!("short requester list {more} is indexed"));
                }
                Some(index)
                    if index.len() != list.len()
                        || list
                            .iter()
                            .enumerate()
                            .any(|(at, slot)| index.get(slot) != Some(&(at as u32))) =>
                {
                    return Err(format!("requester list {more}'s index disagrees with it"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    pub(super) fn check_structure(&self) -> Result<(), String> {
        let mut live = 0;
        for (index, slot) in self.slots.iter().enumerate() {
            let Some(id) = &slot.id else {
                if !slot.keys.is_empty() {
                    return Err(format!("free slot {index} still holds keys"));
                }
                continue;
            };
            live += 1;
            if self.slot_of.get(id) != Some(&(index as u32)) {
                return Err(format!("request {id:?} is not indexed at its slot {index}"));
            }
            for &cell in &slot.keys {
                let Some(record) = self.keys.get(cell) else {
                    return Err(format!("request {id:?} holds a key with no state"));
                };
                if !self.overflow.holds(record.entry, index as u32) {
                    return Err(format!("request {id:?} holds a key that does not list it"));
                }
            }
        }
        if live != self.slot_of.len() {
            return Err(format!(
                "{} indexed request ids but {live} live slots",
                self.slot_of.len()
            ));
        }
        self.keys.check()?;
        let mut links = 0;
        let mut pending = 0;
        for (_, record) in self.keys.iter() {
            let state = record.entry;
            if state.first == NONE && state.more != NONE {
                return Err(format!(
                    "state {:?} has overflow requesters but no first",
                    state.generation()
                ));
            }
            let requesters = self.overflow.all(state);
            let phase = state.phase(self.flushed_below, self.overdue_below);
            if phase == Phase::Pending {
                pending += 1;
            }
            if requesters.is_empty() && phase != Phase::InFlight && phase != Phase::Overdue {
                return Err(format!(
                    "state {:?} has no requesters but is {phase:?}",
                    state.generation(),
                ));
            }
            for &slot in &requesters {
                if self.slots.get(slot as usize).is_none_or(|s| s.id.is_none()) {
                    return Err(format!(
                        "state {:?} lists unknown request slot {slot}",
                        state.generation()
                    ));
                }
            }
            links += requesters.len();
        }
        if pending != self.batched_keys {
            return Err(format!(
                "{pending} pending states but {} batched keys counted",
                self.batched_keys
            ));
        }
        self.check_bounds()?;
        self.overflow.check_positions()?;
        let reverse_links: usize = self.slots.iter().map(|s| s.keys.len()).sum();
        if links != reverse_links {
            return Err(format!(
                "{links} requester links but {reverse_links} reverse-index links (a duplicate)"
            ));
        }
        if self.free_slots.len() + live != self.slots.len()
            || self
                .free_slots
                .iter()
                .any(|&free| self.slots.get(free as usize).is_none_or(|s| s.id.is_some()))
        {
            return Err(format!(
                "{} free slots listed for {} slots with {live} live: a slot leaked or is listed twice",
                self.free_slots.len(),
                self.slots.len()
            ));
        }
        Ok(())
    }
}

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// The bounds hold (L14), and every group's interest counts exactly its
    /// keys that have requesters (L15).
    fn check_bounds(&self) -> Result<(), String> {
        let keys = self.batched_keys + self.outstanding_keys;
        let groups = self.batch.len() + self.outstanding_groups;
        if keys > self.limits.max_outstanding_keys || groups > self.limits.max_outstanding_groups {
            return Err(format!(
                "{keys} keys and {groups} groups outstanding exceed the bounds {:?}",
                self.limits
            ));
        }
        if self.interest_of.len() > self.outstanding_groups {
            return Err(format!(
                "{} groups have an interest but only {} groups are outstanding",
                self.interest_of.len(),
                self.outstanding_groups
            ));
        }
        // Per interest: (its counter, the keys with requesters found).
        let mut tally: HashMap<*const Interest, (Option<u32>, u32, Vec<u64>)> = HashMap::new();
        for interest in self.interest_of.values() {
            tally
                .entry(Arc::as_ptr(interest))
                .or_insert((interest.wanted(), 0, Vec::new()));
        }
        for (_, record) in self.keys.iter() {
            let state = record.entry;
            let phase = state.phase(self.flushed_below, self.overdue_below);
            if phase != Phase::InFlight && phase != Phase::Overdue {
                continue;
            }
            let Some(interest) = self.interest_of.get(&state.group) else {
                continue;
            };
            if state.has_requesters() {
                let entry = tally.entry(Arc::as_ptr(interest)).or_default();
                entry.1 += 1;
                entry.2.push(state.generation().0);
            }
        }
        for (wanted, found, generations) in tally.into_values() {
            match wanted {
                Some(wanted) if wanted == found => {}
                None if found == 0 => {}
                _ => {
                    return Err(format!(
                        "a group's interest is {wanted:?} but {found} of its keys have \
                         requesters (generations {generations:?}; interests {:?})",
                        self.interest_of
                            .iter()
                            .map(|(g, i)| (*g, Arc::as_ptr(i), i.wanted()))
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(())
    }
}
