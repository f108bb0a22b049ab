//! What the table keeps per key and per request: the [`Entry`] of each key
//! (kept in the key store, `keys`), the requesters of shared keys beyond the
//! first in reusable [`Overflow`] lists, and live requests interned into
//! [`Slot`]s.

use std::hash::Hash;

use hashbrown::HashMap;

use crate::lookup::types::{Generation, Phase};

/// "No slot" in [`Entry::first`] and [`Entry::more`], and "no cell".
pub(super) const NONE: u32 = u32::MAX;

/// A slot's `batch_epoch` when it caches no group index.
pub(super) const NO_EPOCH: u64 = u64::MAX;

/// A freed request slot keeps its key list's allocation for the next
/// request up to this many keys (so one huge request does not pin memory).
pub(super) const REUSE_KEYS: usize = 4096;

/// Emptied group vectors the table keeps for later groups, and the most
/// keys a kept one has room for: at most 16 × 1,024 × 17 bytes (keys of 8
/// bytes) stay allocated for reuse however idle the table.
pub(super) const SPARE_GROUPS: usize = 16;
pub(super) const SPARE_GROUP_KEYS: usize = 1024;

/// Free slots (and maps' spare capacity, in entries) kept however sparse
/// the table is: below this, nothing is shrunk.
pub(super) const SPARE_SLOTS: usize = 1024;

/// Shrinks `map` to twice its contents once at most an eighth of its
/// capacity is used (see [`LookupTable::shrink_if_sparse`]).
pub(super) fn shrink_map<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    // guard: L11-maps-shrink-after-cleanup
    if map.capacity() > SPARE_SLOTS && map.len() * 8 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// What the tier said about a key's generation, if it answered yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Outcome {
    Unresolved,
    Miss,
    Hit,
}

/// One key's lookup state.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    /// From a counter bumped once per new state: 10^9 new keys a second
    /// would take five centuries to run it out.
    pub(super) generation: u64,
    /// Slot of one live request that asked for the key, `NONE` when no live
    /// request holds it (an orphaned in-flight probe).
    pub(super) first: u32,
    /// Index in the overflow lists of the other requesters' slots, `NONE`
    /// when there are none. Never set while `first` is `NONE`.
    pub(super) more: u32,
    /// The number of the batch group the state was created in, which
    /// names the group's interest while it is out (see
    /// `LookupTable::interest_of`).
    pub(super) group: u32,
    pub(super) outcome: Outcome,
}

impl Entry {
    pub(super) fn new(generation: Generation, requester: u32, group: u32) -> Self {
        Self {
            generation: generation.0,
            first: requester,
            more: NONE,
            group,
            outcome: Outcome::Unresolved,
        }
    }

    pub(super) fn generation(self) -> Generation {
        Generation(self.generation)
    }

    /// The phase, given the table's watermarks: an unresolved state
    /// created since the last flush is pending, an older one is in flight,
    /// and one created before `overdue_below` is overdue. So a flush moves
    /// every batched key to in flight, and a deadline every key of the
    /// steps it ends, by moving a watermark, without touching the keys.
    #[inline(always)]
    pub(super) fn phase(self, flushed_below: u64, overdue_below: u64) -> Phase {
        match self.outcome {
            Outcome::Unresolved if self.generation >= flushed_below => Phase::Pending,
            // guard: L13-overdue-below-the-watermark
            Outcome::Unresolved if self.generation < overdue_below => Phase::Overdue,
            Outcome::Unresolved => Phase::InFlight,
            Outcome::Miss => Phase::Resolved { found: false },
            Outcome::Hit => Phase::Resolved { found: true },
        }
    }

    pub(super) fn resolve(&mut self, found: bool) {
        self.outcome = if found { Outcome::Hit } else { Outcome::Miss };
    }

    pub(super) fn has_requesters(self) -> bool {
        self.first != NONE
    }
}

/// The requesters of shared keys beyond each key's first, in lists that are
/// recycled (allocation and all) when a key is left with one requester.
#[derive(Default)]
pub(super) struct Overflow {
    pub(super) lists: Vec<Vec<u32>>,
    pub(super) free: Vec<u32>,
    /// For each list longer than [`INDEX_ABOVE`]: the position of every slot
    /// in it, so linking and unlinking a key shared by very many requests
    /// (10^5 share a system prompt) are O(1) each instead of a scan. Short
    /// lists, the common case, are scanned in place.
    pub(super) positions: HashMap<u32, HashMap<u32, u32>>,
}

/// Whether `list` holds `slot`: eight at a time without an early exit
/// inside a chunk, which the compiler turns into vector compares (a key
/// shared by 32 requests is scanned for every request that joins it).
#[inline]
fn scan_holds(list: &[u32], slot: u32) -> bool {
    let chunks = list.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        if chunk.iter().fold(false, |found, &s| found | (s == slot)) {
            return true;
        }
    }
    rest.contains(&slot)
}

/// Where `slot` is in `list`, found as [`scan_holds`] finds it.
#[inline]
fn scan_position(list: &[u32], slot: u32) -> Option<usize> {
    let mut chunks = list.chunks_exact(8);
    let mut at = 0;
    for chunk in chunks.by_ref() {
        if chunk.iter().fold(false, |found, &s| found | (s == slot)) {
            return chunk.iter().position(|&s| s == slot).map(|i| at + i);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&s| s == slot)
        .map(|i| at + i)
}

/// Lists longer than this are indexed (see [`Overflow::positions`]).
pub(super) const INDEX_ABOVE: usize = 256;

impl Overflow {
    #[inline]
    pub(super) fn holds(&self, entry: Entry, slot: u32) -> bool {
        entry.first == slot || (entry.more != NONE && self.list_holds(entry.more, slot))
    }

    #[inline]
    pub(super) fn list_holds(&self, more: u32, slot: u32) -> bool {
        let list = &self.lists[more as usize];
        if list.len() <= INDEX_ABOVE {
            scan_holds(list, slot)
        } else {
            self.indexed_holds(more, slot)
        }
    }

    /// Out of line, so the scheduler's lookup inlines only the short scan.
    #[cold]
    #[inline(never)]
    pub(super) fn indexed_holds(&self, more: u32, slot: u32) -> bool {
        self.positions
            .get(&more)
            .is_some_and(|index| index.contains_key(&slot))
    }

    pub(super) fn count(&self, entry: Entry) -> usize {
        match (entry.first, entry.more) {
            (NONE, _) => 0,
            (_, NONE) => 1,
            (_, more) => 1 + self.lists[more as usize].len(),
        }
    }

    /// Adds `slot` to the entry's requesters (the caller checked it is not one).
    pub(super) fn add(&mut self, entry: &mut Entry, slot: u32) {
        if entry.first == NONE {
            entry.first = slot;
            return;
        }
        if entry.more == NONE {
            entry.more = match self.free.pop() {
                Some(index) => index,
                None => {
                    self.lists.push(Vec::new());
                    (self.lists.len() - 1) as u32
                }
            };
        }
        let list = &mut self.lists[entry.more as usize];
        list.push(slot);
        // guard: L11-shared-keys-are-indexed
        if list.len() > INDEX_ABOVE {
            let index = self.positions.entry(entry.more).or_default();
            if index.is_empty() {
                index.extend(list.iter().enumerate().map(|(at, &s)| (s, at as u32)));
            } else {
                index.insert(slot, (list.len() - 1) as u32);
            }
        }
    }

    /// Removes `slot` from the entry's requesters, if it is one.
    #[inline]
    pub(super) fn remove(&mut self, entry: &mut Entry, slot: u32) {
        if entry.more == NONE {
            if entry.first == slot {
                entry.first = NONE;
            }
            return;
        }
        self.remove_listed(entry, slot);
    }

    /// [`remove`](Self::remove) from a key with more than one requester.
    #[inline(never)]
    fn remove_listed(&mut self, entry: &mut Entry, slot: u32) {
        let more = entry.more;
        let list = &mut self.lists[more as usize];
        // Exactly the long lists have an index: a short one (the usual
        // case) is scanned and never looks the index map up.
        if list.len() <= INDEX_ABOVE {
            if entry.first == slot {
                // The list is never empty while it is attached.
                entry.first = list.pop().unwrap_or(NONE);
            } else if let Some(position) = scan_position(list, slot) {
                list.swap_remove(position);
            }
            if list.is_empty() {
                self.free.push(more);
                entry.more = NONE;
            }
            return;
        }
        self.remove_indexed(entry, slot);
    }

    /// [`remove`](Self::remove) from a list long enough to be indexed.
    #[cold]
    #[inline(never)]
    fn remove_indexed(&mut self, entry: &mut Entry, slot: u32) {
        let more = entry.more;
        let list = &mut self.lists[more as usize];
        let index = self.positions.get_mut(&more);
        if entry.first == slot {
            entry.first = list.pop().unwrap_or(NONE);
            if let Some(index) = index {
                index.remove(&entry.first);
            }
        } else {
            let position = match index {
                Some(index) => index.remove(&slot).map(|at| at as usize),
                None => scan_position(list, slot),
            };
            if let Some(position) = position {
                list.swap_remove(position);
                if let (Some(&moved), Some(index)) =
                    (list.get(position), self.positions.get_mut(&more))
                {
                    index.insert(moved, position as u32);
                }
            }
        }
        if list.len() <= INDEX_ABOVE {
            self.positions.remove(&more);
        }
    }

    /// The entry's requesters, for the invariant check.
    pub(super) fn all(&self, entry: Entry) -> Vec<u32> {
        let mut slots = Vec::new();
        if entry.first != NONE {
            slots.push(entry.first);
        }
        if entry.more != NONE {
            slots.extend(&self.lists[entry.more as usize]);
        }
        slots
    }
}

/// A live request (or a free slot, `id == None`).
pub(super) struct Slot<I> {
    pub(super) id: Option<I>,
    /// Reverse index: the cells of the keys whose requesters include this
    /// slot, each once, in the order the request first asked for them.
    pub(super) keys: Vec<u32>,
    /// Where in `keys` the request's next lookup is expected: a scheduler
    /// asks about a request's blocks in the same order every step, so a
    /// key found here (or at the start) is known to be linked without
    /// scanning the key's requesters. Only ever a shortcut: a miss falls
    /// back to the scan.
    pub(super) cursor: usize,
    /// The request's group in this step's batch, valid while `batch_epoch`
    /// is the table's (saves hashing the id for every new key).
    pub(super) batch_index: usize,
    pub(super) batch_epoch: u64,
}

impl<I> Slot<I> {
    /// Whether the key in `cell` is the expected next key (at the cursor,
    /// or first in a new pass); advances the cursor past it.
    #[inline]
    pub(super) fn follows(&mut self, cell: u32) -> bool {
        // guard: L9-cursor-checks-the-key
        if self.keys.get(self.cursor) == Some(&cell) {
            self.cursor += 1;
            true
        } else if self.keys.first() == Some(&cell) {
            self.cursor = 1;
            true
        } else {
            false
        }
    }
}

/// Makes the request in `slot` (whose record is `record`) one of the
/// requesters of the key in `cell`, whose state is `entry`, once. Already linked if the request is the key's first
/// requester (in the entry, already loaded), or the key is the one its
/// request is expected to ask next (the slot's keys are exactly its links),
/// or, failing both, it is in the overflow list.
#[inline(always)]
pub(super) fn link_requester<I>(
    entry: &mut Entry,
    slot: u32,
    record: &mut Slot<I>,
    overflow: &mut Overflow,
    cell: u32,
) {
    if entry.first != slot && !record.follows(cell) && !overflow.holds(*entry, slot) {
        overflow.add(entry, slot);
        record.keys.push(cell);
        record.cursor = record.keys.len();
    }
}
