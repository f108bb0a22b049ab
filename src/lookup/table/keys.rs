//! Where the table keeps its keys: one [`Record`] per tracked key in a slab
//! of cells addressed by `u32`, found through a hash index that holds only
//! cell numbers.
//!
//! A hash map from key to state keeps its slack (a load factor between
//! 7/16 and 7/8, so up to twice the buckets there are keys) in buckets the
//! size of key and state together. Here the slack sits in the index, five
//! bytes a bucket (a `u32` and a control byte), and the records sit packed
//! in the slab, each key stored once: the request slots and the overflow
//! lists name keys by cell number, not by a copy of the key.

use std::hash::{BuildHasher, Hash};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::storage::{Entry, NONE, SPARE_SLOTS};

/// A tracked key and its state.
pub(super) struct Record<K> {
    pub(super) key: K,
    pub(super) entry: Entry,
}

/// A slab cell. A vacant cell links to the next vacant one; the niche in
/// [`Entry`]'s outcome code holds the tag, so a cell is no larger than its
/// record.
enum Cell<K> {
    Live(Record<K>),
    Vacant { next: u32 },
}

/// The slab of key records and its hash index.
pub(super) struct KeyStore<K> {
    cells: Vec<Cell<K>>,
    /// The first vacant cell (the others chain from it), `NONE` when none.
    free: u32,
    /// Vacant cells, all of them on the chain from `free`.
    vacant: usize,
    /// The cell of every live record, hashed by its key.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl<K> Default for KeyStore<K> {
    fn default() -> Self {
        Self {
            cells: Vec::new(),
            free: NONE,
            vacant: 0,
            index: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
        }
    }
}

/// A cell that should hold a record does not: the index, a request's key
/// list or a caller named a vacant or missing cell.
#[cold]
#[inline(never)]
fn vacant_cell(cell: u32) -> ! {
    panic!("invariant violated: key cell {cell} is named but holds no record")
}

impl<K> KeyStore<K> {
    /// Keys tracked.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

impl<K: Eq + Hash> KeyStore<K> {
    /// `key`'s hash, as the index uses it.
    #[inline(always)]
    pub(super) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The cell holding `key`, whose hash is `hash`.
    #[inline(always)]
    pub(super) fn find(&self, hash: u64, key: &K) -> Option<u32> {
        let cells = &self.cells;
        self.index
            .find(hash, |&cell| match &cells[cell as usize] {
                Cell::Live(record) => record.key == *key,
                Cell::Vacant { .. } => false,
            })
            .copied()
    }

    /// The state of `key`, if it is tracked.
    pub(super) fn find_mut(&mut self, key: &K) -> Option<&mut Entry> {
        let cell = self.find(self.hash(key), key)?;
        Some(self.entry_mut(cell))
    }

    /// The state in `cell`, if the cell holds `key`.
    #[inline(always)]
    pub(super) fn entry_if_key(&mut self, cell: u32, key: &K) -> Option<&mut Entry> {
        match self.cells.get_mut(cell as usize) {
            Some(Cell::Live(record)) if record.key == *key => Some(&mut record.entry),
            _ => None,
        }
    }

    /// The record in `cell`, if it holds one.
    pub(super) fn get(&self, cell: u32) -> Option<&Record<K>> {
        match self.cells.get(cell as usize) {
            Some(Cell::Live(record)) => Some(record),
            _ => None,
        }
    }

    /// The state in `cell`, which holds a record.
    #[inline(always)]
    pub(super) fn entry_mut(&mut self, cell: u32) -> &mut Entry {
        match self.cells.get_mut(cell as usize) {
            Some(Cell::Live(record)) => &mut record.entry,
            _ => vacant_cell(cell),
        }
    }

    /// Stores a new key, whose hash is `hash` and which the store does not
    /// hold, in a vacant cell (or a new one); returns the cell.
    pub(super) fn insert(&mut self, hash: u64, key: K, entry: Entry) -> u32 {
        let record = Cell::Live(Record { key, entry });
        let cell = if self.free != NONE {
            let cell = self.free;
            let Cell::Vacant { next } = self.cells[cell as usize] else {
                vacant_cell(cell)
            };
            self.free = next;
            self.vacant -= 1;
            self.cells[cell as usize] = record;
            cell
        } else {
            // u32::MAX is NONE: 4 billion keys at once is not a table this
            // one serves.
            assert!(self.cells.len() < NONE as usize, "too many tracked keys");
            self.cells.push(record);
            (self.cells.len() - 1) as u32
        };
        let Self {
            cells,
            index,
            hasher,
            ..
        } = self;
        index.insert_unique(hash, cell, |&other| rehash(hasher, cells, other));
        cell
    }

    /// Removes the record in `cell`, whose key hashes to `hash`.
    pub(super) fn remove(&mut self, hash: u64, cell: u32) {
        match self.index.find_entry(hash, |&other| other == cell) {
            Ok(found) => drop(found.remove()),
            Err(_) => vacant_cell(cell),
        }
        self.cells[cell as usize] = Cell::Vacant { next: self.free };
        self.free = cell;
        self.vacant += 1;
    }

    /// Removes the record in `cell`.
    pub(super) fn remove_cell(&mut self, cell: u32) {
        let hash = match self.get(cell) {
            Some(record) => self.hash(&record.key),
            None => vacant_cell(cell),
        };
        self.remove(hash, cell);
    }

    /// Every record with its cell.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Record<K>)> {
        self.cells
            .iter()
            .enumerate()
            .filter_map(|(cell, slot)| match slot {
                Cell::Live(record) => Some((cell as u32, record)),
                Cell::Vacant { .. } => None,
            })
    }

    /// Gives memory back once at most an eighth of the space is used, as
    /// the table's maps do (see `shrink_map`). A slab that sparse is
    /// compacted: its records move down, in order, to the lowest cells.
    /// Returns where each cell went (`NONE` for a vacant one) when records
    /// moved, so the caller can rename the cells it holds.
    pub(super) fn shrink_if_sparse(&mut self) -> Option<Vec<u32>> {
        // guard: L11-the-slab-compacts-after-cleanup
        if self.cells.len() > SPARE_SLOTS && self.len() * 8 < self.cells.len() {
            return Some(self.compact());
        }
        if self.index.capacity() > SPARE_SLOTS && self.len() * 8 < self.index.capacity() {
            let Self {
                cells,
                index,
                hasher,
                ..
            } = self;
            index.shrink_to(index.len() * 2, |&cell| rehash(hasher, cells, cell));
        }
        None
    }

    fn compact(&mut self) -> Vec<u32> {
        let mut moved_to = vec![NONE; self.cells.len()];
        let mut live = 0;
        for (cell, to) in moved_to.iter_mut().enumerate() {
            if matches!(self.cells[cell], Cell::Live(_)) {
                self.cells.swap(cell, live);
                *to = live as u32;
                live += 1;
            }
        }
        self.cells.truncate(live);
        self.cells.shrink_to(live * 2);
        self.free = NONE;
        self.vacant = 0;
        let mut index = HashTable::with_capacity(live);
        for (cell, slot) in self.cells.iter().enumerate() {
            if let Cell::Live(record) = slot {
                let hash = self.hasher.hash_one(&record.key);
                index.insert_unique(hash, cell as u32, |&other| {
                    rehash(&self.hasher, &self.cells, other)
                });
            }
        }
        self.index = index;
        moved_to
    }

    /// The slab and its index agree: every record is indexed under its key
    /// at its own cell and nothing else is, and every vacant cell is on the
    /// free chain exactly once (a vacant cell off the chain is a leak: it
    /// would never be used again).
    pub(super) fn check(&self) -> Result<(), String> {
        let live = self.cells.len() - self.vacant;
        if self.index.len() != live {
            return Err(format!(
                "{} keys indexed but {live} key cells live",
                self.index.len()
            ));
        }
        for (cell, record) in self.iter() {
            if self.find(self.hash(&record.key), &record.key) != Some(cell) {
                return Err(format!("key cell {cell} is not indexed under its key"));
            }
        }
        let mut chained = 0;
        let mut next = self.free;
        while next != NONE {
            match self.cells.get(next as usize) {
                Some(Cell::Vacant { next: after }) if chained < self.vacant => {
                    chained += 1;
                    next = *after;
                }
                _ => {
                    return Err(format!(
                        "the free key cells do not chain: cell {next} after {chained} of {}",
                        self.vacant
                    ));
                }
            }
        }
        let vacant = self
            .cells
            .iter()
            .filter(|cell| matches!(cell, Cell::Vacant { .. }))
            .count();
        if chained != self.vacant || vacant != self.vacant {
            return Err(format!(
                "{vacant} vacant key cells, {} counted, {chained} on the free chain: a key cell leaked",
                self.vacant
            ));
        }
        Ok(())
    }
}

/// The hash of the key in `cell`, for the index when it grows or shrinks.
fn rehash<K: Hash>(hasher: &DefaultHashBuilder, cells: &[Cell<K>], cell: u32) -> u64 {
    match &cells[cell as usize] {
        Cell::Live(record) => hasher.hash_one(&record.key),
        Cell::Vacant { .. } => vacant_cell(cell),
    }
}

#[cfg(test)]
impl<K> KeyStore<K> {
    /// Takes `cell` off the free chain without using it: the leak
    /// `check` must report.
    pub(super) fn leak_free_cell(&mut self) -> bool {
        match self.cells.get(self.free as usize) {
            Some(&Cell::Vacant { next }) => {
                self.free = next;
                true
            }
            _ => false,
        }
    }

    /// Points the index entry of `from` at `to`.
    pub(super) fn misindex(&mut self, from: u32, to: u32) {
        for cell in self.index.iter_mut() {
            if *cell == from {
                *cell = to;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::types::Generation;

    fn entry(generation: u64) -> Entry {
        Entry::new(Generation(generation), 0, 0)
    }

    fn insert(store: &mut KeyStore<String>, key: &str, generation: u64) -> u32 {
        let hash = store.hash(&key.to_string());
        store.insert(hash, key.to_string(), entry(generation))
    }

    fn generation_of(store: &KeyStore<String>, key: &str) -> Option<u64> {
        let key = key.to_string();
        let cell = store.find(store.hash(&key), &key)?;
        Some(store.get(cell)?.entry.generation)
    }

    #[test]
    fn cells_are_reused_and_keys_found_where_they_are() {
        let mut store = KeyStore::default();
        let a = insert(&mut store, "a", 1);
        let b = insert(&mut store, "b", 2);
        store.remove_cell(a);
        assert_eq!(generation_of(&store, "a"), None);
        let c = insert(&mut store, "c", 3);
        assert_eq!(c, a, "the vacant cell is taken first");
        assert_eq!(
            (generation_of(&store, "b"), generation_of(&store, "c")),
            (Some(2), Some(3))
        );
        assert_eq!(store.len(), 2);
        store.check().unwrap();
        store.remove_cell(b);
        store.remove_cell(c);
        assert!(store.is_empty());
        store.check().unwrap();
    }

    #[test]
    fn a_sparse_slab_is_compacted_and_says_where_records_went() {
        let mut store = KeyStore::default();
        let n = 8 * SPARE_SLOTS as u64;
        let cells: Vec<u32> = (0..n)
            .map(|i| insert(&mut store, &format!("k{i}"), i))
            .collect();
        let kept: Vec<u64> = (0..n).filter(|i| i % 10 == 7).collect();
        let mut moved = None;
        for i in (0..n).filter(|i| i % 10 != 7) {
            store.remove_cell(cells[i as usize]);
            if let Some(to) = store.shrink_if_sparse() {
                moved = Some((i, to));
                break;
            }
        }
        let (at, moved_to) = moved.expect("compacted once an eighth is left");
        store.check().unwrap();
        assert_eq!(store.cells.len(), store.len(), "no vacant cell left");
        assert!(store.cells.capacity() <= store.len() * 2);
        assert!(store.index.capacity() <= store.len() * 2);
        let still_there: Vec<u64> = (0..n).filter(|&i| i % 10 == 7 || i > at).collect();
        assert_eq!(still_there.len(), store.len());
        assert!(kept.iter().all(|i| still_there.contains(i)));
        for i in still_there {
            let key = format!("k{i}");
            let cell = store.find(store.hash(&key), &key).expect("kept");
            assert_eq!(moved_to[cells[i as usize] as usize], cell, "{key}");
            assert_eq!(store.get(cell).unwrap().entry.generation, i);
        }
    }

    #[test]
    fn check_reports_a_leaked_cell_and_a_wrong_index() {
        let mut store = KeyStore::default();
        let a = insert(&mut store, "a", 1);
        let b = insert(&mut store, "b", 2);
        insert(&mut store, "c", 3);
        store.remove_cell(a);
        assert!(store.leak_free_cell());
        let error = store.check().unwrap_err();
        assert!(error.contains("leaked"), "{error}");

        let mut store = KeyStore::default();
        let a = insert(&mut store, "a", 1);
        let b2 = insert(&mut store, "b", 2);
        assert_eq!(b, b2);
        store.misindex(a, b2);
        let error = store.check().unwrap_err();
        assert!(error.contains("not indexed under its key"), "{error}");
    }
}
