//! What a ledger tells a tier's lookups: which blocks became resident and
//! which left, in the order the ledger saw it.
//!
//! A block is logged as present when its store commits (its file was
//! renamed into place before) and as gone when its victim is reported
//! deleted, or a read found its file missing or damaged (the file is gone
//! before either is logged). The log is kept under the ledger's lock, so its
//! order is the order of those changes: replayed into a
//! [`LookupTable::settle`](crate::lookup::LookupTable::settle), the last
//! entry for a key is the truth about its file, as long as no other process
//! changes the directory.
//!
//! The log is bounded: past [`MAX_CHANGES`] entries not taken, the oldest
//! are dropped and counted. A lookup that misses a change is still safe: a
//! stale hit's load fails and is marked a miss, a stale miss computes the
//! block again.

use std::collections::VecDeque;

/// Entries a ledger's change log keeps before it drops the oldest (see
/// [`CapacityLedger::record_changes`](super::CapacityLedger::record_changes)).
pub const MAX_CHANGES: usize = 1 << 16;

/// A bounded log of `(key, present)` changes (see the module docs).
#[derive(Debug)]
pub(super) struct ChangeLog<K> {
    entries: VecDeque<(K, bool)>,
    limit: usize,
    dropped: u64,
}

impl<K> ChangeLog<K> {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            limit: limit.max(1),
            dropped: 0,
        }
    }

    pub(super) fn push(&mut self, key: K, present: bool) {
        // guard: E22-the-change-log-stays-bounded
        if self.entries.len() >= self.limit {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back((key, present));
    }

    /// Appends every entry to `into`, oldest first, and empties the log.
    pub(super) fn take_into(&mut self, into: &mut Vec<(K, bool)>) {
        into.extend(self.entries.drain(..));
    }

    /// Entries dropped for want of room, ever.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::ChangeLog;

    #[test]
    fn the_oldest_changes_go_first_when_the_log_is_full() {
        let mut log = ChangeLog::new(2);
        log.push("a", true);
        log.push("b", true);
        log.push("a", false);
        let mut taken = Vec::new();
        log.take_into(&mut taken);
        assert_eq!(taken, [("b", true), ("a", false)]);
        assert_eq!(log.dropped(), 1);
        log.take_into(&mut taken);
        assert_eq!(taken.len(), 2, "taken once");
    }
}
