//! Reconciling a ledger with a listing of the shared directory: the blocks
//! other processes wrote are counted (adopted), the blocks other processes
//! deleted are forgotten, and what is over the capacity then is evicted.
//!
//! Several processes with one budget over one directory each count what
//! they found at open and what they wrote since; without this, the
//! directory can hold what all of them wrote (N processes: up to N times
//! the capacity). A process that reconciles counts every block the listing
//! saw, so once it has deleted its victims the directory holds at most the
//! capacity plus what was written while it listed.
//!
//! The listing is not atomic (a directory is read entry by entry while
//! others write), so the rules are:
//!
//! - [`begin_listing`](CapacityLedger::begin_listing) is called before the
//!   directory is read. A block that became resident before it was renamed
//!   into place before the listing began; if the listing did not see it,
//!   another process deleted it, and it is forgotten. A block that became
//!   resident later may be missing from the listing while on disk, so it is
//!   kept.
//! - A listed block the ledger knows in any state (being written, resident,
//!   being evicted) is left as it is; one it does not know is adopted as
//!   resident and recently used (another process wrote it lately), unless
//!   it left the books while the listing ran (this process deleted it, or
//!   found it gone, after the listing may have seen it).
//! - A pinned block that is forgotten leaves at its last unpin, as a lost
//!   one does.
//!
//! Forgetting too much only under-counts what another process still
//! counts; the rule above keeps a process from forgetting its own blocks.

use std::collections::HashSet;
use std::hash::Hash;

use super::ledger::{CapacityLedger, Cause, State, Victim};
use super::listings::Listing;

/// What a [`reconcile`](CapacityLedger::reconcile) changed.
#[derive(Debug)]
#[must_use = "the victims' files must be deleted and reported"]
pub struct Reconciled<K> {
    /// Blocks counted for the first time: written by another process.
    pub adopted: u64,
    /// Blocks no longer counted: deleted by another process.
    pub forgotten: u64,
    /// Blocks to delete to get back within the capacity (report each with
    /// [`evicted`](CapacityLedger::evicted) or
    /// [`eviction_failed`](CapacityLedger::eviction_failed)).
    pub victims: Vec<Victim<K>>,
}

impl<K: Clone + Eq + Hash> CapacityLedger<K> {
    /// Marks the start of a directory listing: call it before the first
    /// entry is read, and pass the mark to [`reconcile`](Self::reconcile).
    pub fn begin_listing(&mut self) -> Listing {
        self.clock += 1;
        *self.listings.open.entry(self.clock).or_default() += 1;
        Listing { mark: self.clock }
    }

    /// Ends a listing that will not be reconciled (it failed).
    pub fn abandon(&mut self, listing: Listing) {
        self.end_listing(listing);
    }

    fn end_listing(&mut self, listing: Listing) {
        if let Some(count) = self.listings.open.get_mut(&listing.mark) {
            *count -= 1;
            if *count == 0 {
                self.listings.open.remove(&listing.mark);
            }
        }
        // Departures older than every listing still under way are of no use.
        match self.listings.open.keys().next().copied() {
            None => self.listings.departed.clear(),
            Some(oldest) => self.listings.departed.retain(|_, when| *when >= oldest),
        }
    }

    /// `key`'s block left the books (deleted, or found gone): a listing
    /// under way may have seen its file, and must not adopt it.
    pub(super) fn depart(&mut self, key: &K) {
        if !self.listings.open.is_empty() {
            self.listings.departed.insert(key.clone(), self.clock);
        }
    }

    /// Brings the books in line with `listed`, the blocks (and their bytes)
    /// a listing begun at `listing` found: adopts the unknown ones, forgets
    /// the ones it did not find that were resident before it began, and
    /// names victims that bring resident plus reserved bytes back within
    /// the capacity (as many as are evictable). Changes are logged like
    /// commits and losses (see [`record_changes`](Self::record_changes)).
    pub fn reconcile(
        &mut self,
        listing: Listing,
        listed: impl IntoIterator<Item = (K, u64)>,
    ) -> Reconciled<K> {
        self.stats.reconciles += 1;
        let mut seen = HashSet::new();
        let mut adopted = 0;
        for (key, bytes) in listed {
            // guard: E30-a-known-block-is-not-adopted-again
            let known = self.entries.contains_key(&key);
            // guard: E33-a-block-that-left-during-the-listing-is-not-adopted
            let left = self
                .listings
                .departed
                .get(&key)
                .is_some_and(|when| *when >= listing.mark);
            if !known && !left {
                self.adopt(key.clone(), bytes);
                adopted += 1;
            }
            seen.insert(key);
        }
        let gone: Vec<K> = self
            .entries
            .iter()
            .filter(|(key, entry)| {
                // guard: E31-only-blocks-resident-before-the-listing-are-forgotten
                let before = entry.since < listing.mark;
                before
                    && matches!(entry.state, State::Resident { lost: false, .. })
                    && !seen.contains(*key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &gone {
            self.forget(key);
        }
        self.end_listing(listing);
        let over = self.used().saturating_sub(self.capacity());
        let pending = self.evicting_bytes;
        // guard: E32-a-reconcile-evicts-what-is-over-the-capacity
        let victims = if over > pending {
            self.choose_victims(over - pending, Cause::Reconcile)
        } else {
            Vec::new()
        };
        Reconciled {
            adopted,
            forgotten: gone.len() as u64,
            victims,
        }
    }

    fn adopt(&mut self, key: K, bytes: u64) {
        self.note(&key, true);
        self.enter_resident(key, bytes, false);
        self.stats.adopted += 1;
    }

    /// A resident, unlost block leaves the books (at its last unpin, if
    /// pinned).
    fn forget(&mut self, key: &K) {
        if self.leave_resident(key) {
            self.stats.forgotten += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::capacity::{Admission, CapacityLedger, Cause, Policy};

    fn resident(ledger: &mut CapacityLedger<&'static str>, key: &'static str) {
        let Admission::Granted(write) = ledger.reserve(key, 10) else {
            panic!("room for {key}")
        };
        ledger.commit(write).unwrap();
    }

    #[test]
    fn a_neighbours_blocks_are_adopted_and_its_deletions_forgotten() {
        let mut ledger = CapacityLedger::new(100, Policy::Lru);
        resident(&mut ledger, "mine");
        resident(&mut ledger, "deleted by the neighbour");
        ledger.record_changes(true);
        let listing = ledger.begin_listing();
        let done = ledger.reconcile(listing, [("mine", 10), ("the neighbour's", 10)]);
        assert_eq!(
            (done.adopted, done.forgotten, done.victims.len()),
            (1, 1, 0)
        );
        assert!(ledger.is_resident(&"the neighbour's"));
        assert!(!ledger.is_resident(&"deleted by the neighbour"));
        let stats = ledger.stats();
        assert_eq!((stats.resident_bytes, stats.entries), (20, 2));
        assert_eq!(
            (stats.adopted, stats.forgotten, stats.reconciles),
            (1, 1, 1)
        );
        let mut changes = Vec::new();
        ledger.take_changes(&mut changes);
        assert_eq!(
            changes,
            [
                ("the neighbour's", true),
                ("deleted by the neighbour", false)
            ]
        );
        ledger.audit().unwrap();
    }

    #[test]
    fn a_block_committed_after_the_listing_began_is_kept() {
        let mut ledger = CapacityLedger::new(100, Policy::Lru);
        let listing = ledger.begin_listing();
        // Renamed into place while the directory was being read: the
        // listing may or may not have seen it.
        resident(&mut ledger, "new");
        let Admission::Granted(writing) = ledger.reserve("being written", 10) else {
            panic!("room")
        };
        let done = ledger.reconcile(listing, []);
        assert_eq!((done.adopted, done.forgotten), (0, 0));
        assert!(ledger.is_resident(&"new"));
        ledger.commit(writing).unwrap();
        // The next listing must see both.
        let listing = ledger.begin_listing();
        let done = ledger.reconcile(listing, [("new", 10)]);
        assert_eq!(done.forgotten, 1);
        assert!(!ledger.is_resident(&"being written"));
        ledger.audit().unwrap();
    }

    #[test]
    fn a_block_deleted_while_the_listing_ran_is_not_adopted() {
        let mut ledger = CapacityLedger::new(10, Policy::Lru);
        resident(&mut ledger, "old");
        let listing = ledger.begin_listing();
        // The listing reads "old"; then a store evicts it.
        let Admission::Evict(victims) = ledger.reserve("new", 10) else {
            panic!("a victim")
        };
        for victim in victims {
            ledger.evicted(victim).unwrap();
        }
        let done = ledger.reconcile(listing, [("old", 10)]);
        assert_eq!((done.adopted, ledger.stats().resident_bytes), (0, 0));
        assert!(
            ledger.listings.departed.is_empty(),
            "kept only while listing"
        );
        // A later listing that finds it adopts it (another process wrote it
        // again).
        let listing = ledger.begin_listing();
        assert_eq!(ledger.reconcile(listing, [("old", 10)]).adopted, 1);
        ledger.audit().unwrap();
    }

    #[test]
    fn adopting_over_the_capacity_names_the_least_recently_used_as_victims() {
        let mut ledger = CapacityLedger::new(30, Policy::Lru);
        resident(&mut ledger, "old");
        resident(&mut ledger, "used");
        let pin = ledger.pin(&"used").unwrap();
        let listing = ledger.begin_listing();
        let done = ledger.reconcile(listing, [("old", 10), ("used", 10), ("a", 10), ("b", 10)]);
        let victims: Vec<_> = done.victims.iter().map(|v| (*v.key(), v.cause())).collect();
        assert_eq!(victims, [("old", Cause::Reconcile)], "pinned blocks stay");
        for victim in done.victims {
            ledger.evicted(victim).unwrap();
        }
        ledger.unpin(pin).unwrap();
        let stats = ledger.stats();
        assert_eq!((stats.resident_bytes, stats.evictions), (30, 1));
        ledger.audit().unwrap();
    }

    #[test]
    fn a_pinned_block_deleted_by_a_neighbour_leaves_at_its_last_unpin() {
        let mut ledger = CapacityLedger::new(100, Policy::Lru);
        resident(&mut ledger, "read");
        let pin = ledger.pin(&"read").unwrap();
        let listing = ledger.begin_listing();
        let done = ledger.reconcile(listing, []);
        assert_eq!(done.forgotten, 1);
        assert!(!ledger.is_resident(&"read"));
        assert_eq!(ledger.stats().resident_bytes, 10, "until the read ends");
        ledger.unpin(pin).unwrap();
        assert_eq!(ledger.stats().resident_bytes, 0);
        ledger.audit().unwrap();
    }
}
