//! The ledger's self-check: its kept sums against its entries.

use std::hash::Hash;

use super::ledger::{CapacityLedger, State};

impl<K: Clone + Eq + Hash> CapacityLedger<K> {
    /// Checks the ledger's sums against its entries, in time linear in
    /// them: for tests and models.
    #[doc(hidden)]
    pub fn audit(&self) -> Result<(), String> {
        let (mut resident, mut reserved, mut evictable, mut evicting, mut pinned) = (0, 0, 0, 0, 0);
        for entry in self.entries.values() {
            match entry.state {
                State::Reserved => reserved += entry.bytes,
                State::Resident { pins, lost } => {
                    resident += entry.bytes;
                    if pins > 0 {
                        pinned += 1;
                    } else if !lost {
                        evictable += entry.bytes;
                    }
                }
                State::Evicting => {
                    resident += entry.bytes;
                    evicting += entry.bytes;
                }
            }
        }
        let sums = (
            resident,
            reserved,
            evictable,
            evicting,
            pinned,
            self.entries.len() as u64,
        );
        let kept = (
            self.stats.resident_bytes,
            self.stats.reserved_bytes,
            self.evictable_bytes,
            self.evicting_bytes,
            self.stats.pinned_entries,
            self.stats.entries,
        );
        if sums != kept {
            return Err(format!(
                "sums {sums:?} but kept {kept:?} (resident, reserved, evictable, evicting, pinned, entries)"
            ));
        }
        Ok(())
    }
}
