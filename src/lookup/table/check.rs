//! The table's structural self-check: the reverse index, the requester
//! lists and their indexes, and the free-slot list agree.

use std::hash::Hash;

use super::LookupTable;
use super::storage::{INDEX_ABOVE, NONE, Overflow};
use crate::lookup::types::{Phase, Request};

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
            for key in &slot.keys {
                let Some(&state) = self.states.get(key) else {
                    return Err(format!("request {id:?} holds a key with no state"));
                };
                if !self.overflow.holds(state, index as u32) {
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
        let mut links = 0;
        for &state in self.states.values() {
            if state.first == NONE && state.more != NONE {
                return Err(format!(
                    "state {:?} has overflow requesters but no first",
                    state.generation()
                ));
            }
            let requesters = self.overflow.all(state);
            let phase = state.phase(self.flushed_below);
            if requesters.is_empty() && phase != Phase::InFlight {
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
