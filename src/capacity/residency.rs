//! How a resident block enters and leaves the books, whoever brings it
//! (a startup scan's seed, a reconcile's adoption) or takes it away (a load
//! that found it gone, a reconcile that did not list it).

use std::hash::Hash;

use super::ledger::{CapacityLedger, Entry, State};

impl<K: Clone + Eq + Hash> CapacityLedger<K> {
    /// Counts `key`, not held, as resident and unpinned: the oldest block
    /// (`cold`: a startup scan's, newest first) or the newest.
    pub(super) fn enter_resident(&mut self, key: K, bytes: u64, cold: bool) {
        let incarnation = self.incarnation();
        if cold {
            self.order.insert_cold(&key, bytes);
        } else {
            self.order.insert(&key, bytes);
        }
        self.entries.insert(
            key,
            Entry {
                bytes,
                state: State::Resident {
                    pins: 0,
                    lost: false,
                },
                incarnation,
                since: self.clock,
            },
        );
        self.stats.resident_bytes += bytes;
        self.evictable_bytes += bytes;
        self.stats.entries += 1;
    }

    /// A resident block leaves the books: at once, or at its last unpin if
    /// pinned (marked lost meanwhile). Logged gone; a listing under way
    /// will not adopt it. False for a key not resident.
    pub(super) fn leave_resident(&mut self, key: &K) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        let State::Resident { pins, lost } = &mut entry.state else {
            return false;
        };
        self.order.remove(key);
        if *pins > 0 {
            *lost = true;
        } else {
            let bytes = entry.bytes;
            self.entries.remove(key);
            self.evictable_bytes -= bytes;
            self.stats.resident_bytes -= bytes;
            self.stats.entries -= 1;
        }
        self.note(key, false);
        self.depart(key);
        true
    }
}
