//! The marks of directory listings under way, and what left the books
//! while they ran.

use std::collections::{BTreeMap, HashMap};

/// The ledger's mark taken before a directory listing, for
/// [`reconcile`](super::CapacityLedger::reconcile).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a listing is passed to reconcile, or abandoned"]
pub struct Listing {
    pub(super) mark: u64,
}

/// The listings under way (their marks, counted) and, while any is, the
/// blocks that left the books with the clock when they did.
#[derive(Debug)]
pub(super) struct Listings<K> {
    pub(super) open: BTreeMap<u64, usize>,
    pub(super) departed: HashMap<K, u64>,
}

impl<K> Default for Listings<K> {
    fn default() -> Self {
        Self {
            open: BTreeMap::new(),
            departed: HashMap::new(),
        }
    }
}
