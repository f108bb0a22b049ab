//! The ledger's log of blocks that became resident or left, for a tier's
//! lookups to learn of stores and evictions.

use std::hash::Hash;

use super::changes::{ChangeLog, MAX_CHANGES};
use super::ledger::CapacityLedger;

impl<K: Clone + Eq + Hash> CapacityLedger<K> {
    /// Starts (or stops) logging which blocks become resident and which
    /// leave, for a tier's lookups (see [`take_changes`](Self::take_changes)).
    pub fn record_changes(&mut self, on: bool) {
        self.changes = on.then(|| ChangeLog::new(MAX_CHANGES));
    }

    /// Moves the changes logged since the last call into `into`, oldest
    /// first: `(key, true)` when a block's store committed, `(key, false)`
    /// when its file was deleted or found missing or damaged. Empty unless
    /// [`record_changes`](Self::record_changes) is on.
    pub fn take_changes(&mut self, into: &mut Vec<(K, bool)>) {
        if let Some(log) = &mut self.changes {
            log.take_into(into);
        }
    }

    pub(super) fn note(&mut self, key: &K, present: bool) {
        if let Some(log) = &mut self.changes {
            log.push(key.clone(), present);
            self.stats.changes_dropped = log.dropped();
        }
    }
}
