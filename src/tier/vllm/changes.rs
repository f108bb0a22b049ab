//! Which blocks the transfers stored and which left, for the tier's lookups
//! to [`settle`](crate::lookup::LookupTable::settle) (invariant L18).
//!
//! With a byte budget the budget's ledger logs them, under its lock, in
//! the order they happened: a store when it commits (its file is in place),
//! a deletion once the file is gone. With the fleet's books, this host's
//! steps log theirs (a commit, a victim deleted, an object found missing;
//! see [`FleetHost`](crate::capacity::FleetHost)): what other hosts add or evict, lookups
//! learn from the books, and loads from their pins. Without a budget no block ever leaves
//! through the transfers, so the stores reported by
//! [`finished`](VllmTransfers::finished) are the whole story.

use std::path::PathBuf;

use super::books::{Books, Changes};
use super::home::Home;
use super::job::TransferKind;
use super::transfers::{FinishedTransfer, VllmTransfers};
use crate::capacity::MAX_CHANGES;

impl VllmTransfers {
    /// Starts (or stops) recording which blocks the transfers stored and
    /// which the budget deleted, for [`take_changes`](Self::take_changes).
    /// Off by default: nothing is kept for a caller that never takes them.
    pub fn record_changes(&mut self, on: bool) {
        self.changes = on.then(Changes::default);
        if let Some(budget) = &self.budget {
            budget.books.record_changes(on);
        }
    }

    /// The changes since the last call, oldest first: `(key, true)` for a
    /// block stored (its file is in place), `(key, false)` for one whose
    /// file was deleted or found missing or damaged. Feed them to the
    /// tier's [`Lookup::settle`](crate::Lookup::settle) in this order. At
    /// most [`MAX_CHANGES`] are kept between calls (the oldest are dropped;
    /// lookups that miss a change stay safe, see
    /// [`CapacityLedger::record_changes`](crate::capacity::CapacityLedger::record_changes)).
    pub fn take_changes(&mut self) -> Vec<(Vec<u8>, bool)> {
        let Some(changes) = &mut self.changes else {
            return Vec::new();
        };
        let Some(budget) = &self.budget else {
            return changes.stored.drain(..).map(|key| (key, true)).collect();
        };
        match (&budget.books, &self.home) {
            (Books::Dir(dir), Home::Dir(layout)) => {
                let mut paths: Vec<(PathBuf, bool)> = Vec::new();
                dir.take_changes(&mut paths);
                paths
                    .into_iter()
                    .filter_map(|(path, present)| Some((layout.key_of(&path)?, present)))
                    .collect()
            }
            #[cfg(object_tier)]
            (Books::Objects(objects), Home::Bucket(bucket)) => {
                let mut locations = Vec::new();
                objects.take_changes(&mut locations);
                locations
                    .into_iter()
                    .filter_map(|(location, present)| {
                        Some((bucket.layout.key_of(&location)?, present))
                    })
                    .collect()
            }
            #[cfg(fleet_index)]
            (Books::Fleet(fleet), Home::Bucket(bucket)) => {
                let mut locations = Vec::new();
                fleet.take_changes(&mut locations);
                locations
                    .into_iter()
                    .filter_map(|(location, present)| {
                        Some((bucket.layout.key_of(&location)?, present))
                    })
                    .collect()
            }
            // A budget is its home's kind.
            #[allow(unreachable_patterns)]
            _ => Vec::new(),
        }
    }

    /// Records the blocks of the stores in `finished` (without a budget).
    pub(super) fn note_stores(&mut self, finished: &[FinishedTransfer]) {
        let Some(changes) = &mut self.changes else {
            return;
        };
        if self.budget.is_some() {
            return; // the ledger logs them, in order with the deletions
        }
        for job in finished {
            if job.kind == TransferKind::Store {
                // Every block before the first failure is in place; those
                // that were there already are no change.
                // guard: V11-a-block-already-there-is-no-change
                let written = job
                    .done_keys()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| job.present.binary_search(i).is_err());
                changes.stored.extend(written.map(|(_, key)| key.clone()));
            }
        }
        let excess = changes.stored.len().saturating_sub(MAX_CHANGES);
        changes.stored.drain(..excess);
    }
}
