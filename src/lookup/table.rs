//! The sans-IO lookup table: every rule of the protocol, no threads inside.
//!
//! Layout (see docs/performance.md for what it costs): one hash map from key
//! to a 16-byte [`Entry`] (generation and phase packed in one word, the
//! requesters as small slot numbers), live requests interned into a slab of
//! [`Slot`]s so a link is a `u32` and not a copy of the request id, and
//! the requesters of shared keys beyond the first in reusable overflow lists.
//! Maps use hashbrown's default hasher (foldhash): fast on the short keys a
//! KV cache uses, and seeded per table, unlike an unseeded FxHash.

use std::hash::Hash;
use std::mem;

use hashbrown::HashMap;
use hashbrown::hash_map::Entry as MapEntry;

use super::stats::LookupStats;
use super::submission::{Group, GroupOutcome, GroupResult, Submission};
use super::types::{Generation, KeyState, Phase, Request, TableId, Ticket, Verdict};
use crate::invariant::InvariantViolation;

/// "No slot" in [`Entry::first`] and [`Entry::more`].
const NONE: u32 = u32::MAX;

/// Outcome codes in the low bits of [`Entry::packed`].
const UNRESOLVED: u64 = 0;
const MISS: u64 = 2;
const HIT: u64 = 3;

/// A slot's `batch_epoch` when it caches no group index.
const NO_EPOCH: u64 = u64::MAX;

/// A freed request slot keeps its key list's allocation for the next
/// request up to this many keys (so one huge request does not pin memory).
const REUSE_KEYS: usize = 4096;

/// Free slots (and maps' spare capacity, in entries) kept however sparse
/// the table is: below this, nothing is shrunk.
const SPARE_SLOTS: usize = 1024;

/// Shrinks `map` to twice its contents once at most an eighth of its
/// capacity is used (see [`LookupTable::shrink_if_sparse`]).
fn shrink_map<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    // guard: L11-maps-shrink-after-cleanup
    if map.capacity() > SPARE_SLOTS && map.len() * 8 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// One key's lookup state.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// `generation << 2 | outcome code` (see [`Entry::phase`]). Generations
    /// come from a counter bumped once per new state, so 62 bits do not run
    /// out (10^9 new keys a second would take 146 years).
    packed: u64,
    /// Slot of one live request that asked for the key, `NONE` when no live
    /// request holds it (an orphaned in-flight probe).
    first: u32,
    /// Index in the overflow lists of the other requesters' slots, `NONE`
    /// when there are none. Never set while `first` is `NONE`.
    more: u32,
}

impl Entry {
    fn new(generation: Generation, requester: u32) -> Self {
        Self {
            packed: generation.0 << 2,
            first: requester,
            more: NONE,
        }
    }

    fn generation(self) -> Generation {
        Generation(self.packed >> 2)
    }

    /// The phase, given the table's flush watermark: an unresolved state
    /// created since the last flush is pending, an older one is in flight.
    /// So a flush moves every batched key to in flight by moving the
    /// watermark, without touching the keys.
    fn phase(self, flushed_below: u64) -> Phase {
        match self.packed & 3 {
            UNRESOLVED if self.packed >> 2 >= flushed_below => Phase::Pending,
            UNRESOLVED => Phase::InFlight,
            MISS => Phase::Resolved { found: false },
            _ => Phase::Resolved { found: true },
        }
    }

    fn resolve(&mut self, found: bool) {
        self.packed = (self.packed & !3) | if found { HIT } else { MISS };
    }

    fn has_requesters(self) -> bool {
        self.first != NONE
    }
}

/// The requesters of shared keys beyond each key's first, in lists that are
/// recycled (allocation and all) when a key is left with one requester.
#[derive(Default)]
struct Overflow {
    lists: Vec<Vec<u32>>,
    free: Vec<u32>,
    /// For each list longer than [`INDEX_ABOVE`]: the position of every slot
    /// in it, so linking and unlinking a key shared by very many requests
    /// (10^5 share a system prompt) are O(1) each instead of a scan. Short
    /// lists, the common case, are scanned in place.
    positions: HashMap<u32, HashMap<u32, u32>>,
}

/// Lists longer than this are indexed (see [`Overflow::positions`]).
const INDEX_ABOVE: usize = 256;

impl Overflow {
    #[inline]
    fn holds(&self, entry: Entry, slot: u32) -> bool {
        entry.first == slot || (entry.more != NONE && self.list_holds(entry.more, slot))
    }

    #[inline]
    fn list_holds(&self, more: u32, slot: u32) -> bool {
        let list = &self.lists[more as usize];
        if list.len() <= INDEX_ABOVE {
            list.contains(&slot)
        } else {
            self.indexed_holds(more, slot)
        }
    }

    /// Out of line, so the scheduler's lookup inlines only the short scan.
    #[cold]
    #[inline(never)]
    fn indexed_holds(&self, more: u32, slot: u32) -> bool {
        self.positions
            .get(&more)
            .is_some_and(|index| index.contains_key(&slot))
    }

    fn count(&self, entry: Entry) -> usize {
        match (entry.first, entry.more) {
            (NONE, _) => 0,
            (_, NONE) => 1,
            (_, more) => 1 + self.lists[more as usize].len(),
        }
    }

    /// Adds `slot` to the entry's requesters (the caller checked it is not one).
    fn add(&mut self, entry: &mut Entry, slot: u32) {
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
    fn remove(&mut self, entry: &mut Entry, slot: u32) {
        if entry.more == NONE {
            if entry.first == slot {
                entry.first = NONE;
            }
            return;
        }
        let more = entry.more;
        let list = &mut self.lists[more as usize];
        let index = self.positions.get_mut(&more);
        if entry.first == slot {
            // The list is never empty while it is attached.
            entry.first = list.pop().unwrap_or(NONE);
            if let Some(index) = index {
                index.remove(&entry.first);
            }
        } else {
            let position = match index {
                Some(index) => index.remove(&slot).map(|at| at as usize),
                None => list.iter().position(|&s| s == slot),
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
        if list.is_empty() {
            self.free.push(more);
            entry.more = NONE;
        }
    }

    /// The entry's requesters, for the invariant check.
    fn all(&self, entry: Entry) -> Vec<u32> {
        let mut slots = Vec::new();
        if entry.first != NONE {
            slots.push(entry.first);
        }
        if entry.more != NONE {
            slots.extend(&self.lists[entry.more as usize]);
        }
        slots
    }

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

/// A live request (or a free slot, `id == None`).
struct Slot<K, I> {
    id: Option<I>,
    /// Reverse index: the keys whose requesters include this slot, each once,
    /// in the order the request first asked for them.
    keys: Vec<K>,
    /// Where in `keys` the request's next lookup is expected: a scheduler
    /// asks about a request's blocks in the same order every step, so a
    /// key found here (or at the start) is known to be linked without
    /// scanning the key's requesters. Only ever a shortcut: a miss falls
    /// back to the scan.
    cursor: usize,
    /// The request's group in this step's batch, valid while `batch_epoch`
    /// is the table's (saves hashing the id for every new key).
    batch_index: usize,
    batch_epoch: u64,
}

impl<K: Eq, I> Slot<K, I> {
    /// Whether `key` is the expected next key (at the cursor, or first in a
    /// new pass); advances the cursor past it.
    #[inline]
    fn follows(&mut self, key: &K) -> bool {
        // guard: L9-cursor-checks-the-key
        if self.keys.get(self.cursor) == Some(key) {
            self.cursor += 1;
            true
        } else if self.keys.first() == Some(key) {
            self.cursor = 1;
            true
        } else {
            false
        }
    }
}

/// The scheduler-owned state of the async lookup protocol.
///
/// Plain `&mut self` methods, no threads, clocks or I/O: whoever owns the
/// table decides when keys go to a backend and when answers come back. The
/// [`Lookup`](crate::Lookup) is one such owner; a test, a
/// model checker or a custom driver can be another.
///
/// The cycle of one scheduler step:
///
/// ```
/// use kvtier::{lookup::LookupTable, Verdict};
///
/// let mut table: LookupTable<u64, String> = LookupTable::new();
/// let request = "req-1".to_string();
///
/// // Unknown keys are pending until the tier has been asked.
/// assert_eq!(table.lookup(&7, &request), Verdict::Pending);
/// assert_eq!(table.lookup(&8, &request), Verdict::Pending);
///
/// // End of step: the new keys, grouped by request, go to a backend ...
/// let submission = table.take_submission().expect("two new keys");
/// for group in submission.into_groups() {
///     let answers: Vec<bool> = group.keys().iter().map(|key| key % 2 == 1).collect();
///     // ... and each group's answers come back, possibly much later.
///     table.apply(group.answered(answers));
/// }
///
/// let Verdict::Hit(ticket) = table.lookup(&7, &request) else { panic!("7 is odd") };
/// assert_eq!(table.lookup(&8, &request), Verdict::Miss);
///
/// // Loading block 7 failed: stop offering it, without re-probing.
/// assert!(table.mark_miss(&ticket));
/// assert_eq!(table.lookup(&7, &request), Verdict::Miss);
///
/// table.cleanup(&request);
/// assert!(table.is_empty());
/// ```
pub struct LookupTable<K, R: Request> {
    /// Carried by every ticket, group and result this table hands out.
    id: TableId,
    states: HashMap<K, Entry>,
    /// Live request ids and their slots.
    slot_of: HashMap<R::Id, u32>,
    slots: Vec<Slot<K, R::Id>>,
    free_slots: Vec<u32>,
    /// Half the live requests at the last compaction (or since): the next
    /// one waits until fewer are live (see [`LookupTable::shrink_if_sparse`]).
    compact_below: usize,
    /// The slot of the last request that called `lookup`: a scheduler asks
    /// about one request's keys in a row, so this saves hashing the id.
    last_slot: u32,
    overflow: Overflow,
    /// This step's new keys, grouped by request in first-appearance order.
    batch: Vec<Group<K, R>>,
    /// Index in `batch` of each request's group. Kept apart from the slots
    /// so a request cleaned up and seen again within one step still gets
    /// one group.
    batch_groups: HashMap<R::Id, usize>,
    /// Bumped by every `take_submission`: slots' cached group indices from
    /// an earlier batch are then stale.
    batch_epoch: u64,
    /// Generations below this were created before the last flush: an
    /// unresolved state below it is in flight, one at or above it pending.
    flushed_below: u64,
    /// Generations of batched (pending) states that cleanup removed before
    /// the flush; the flush leaves them out.
    dropped_pending: hashbrown::HashSet<u64>,
    next_generation: u64,
    stats: LookupStats,
    /// `(seq, outcome)` of every applied group, in application order, while
    /// recording is on (see [`LookupTable::record_applied`]).
    applied_log: Option<Vec<(u64, GroupOutcome)>>,
}

/// A summary: how many keys and requests, and the counters.
impl<K, R: Request> std::fmt::Debug for LookupTable<K, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupTable")
            .field("id", &self.id)
            .field("keys", &self.states.len())
            .field("requests", &self.slot_of.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<K, R: Request> Default for LookupTable<K, R> {
    fn default() -> Self {
        Self {
            id: TableId::new(),
            states: HashMap::new(),
            slot_of: HashMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            compact_below: 0,
            last_slot: NONE,
            overflow: Overflow::default(),
            batch: Vec::new(),
            batch_groups: HashMap::new(),
            batch_epoch: 0,
            flushed_below: 0,
            dropped_pending: hashbrown::HashSet::new(),
            next_generation: 0,
            stats: LookupStats::default(),
            applied_log: None,
        }
    }
}

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the tier knows about `key`, recording that `request` asked.
    ///
    /// An unknown key gets a fresh state (a new [`Generation`]) and joins this
    /// step's batch under `request`'s group; it is [`Verdict::Pending`] until
    /// its result is applied. A known key is never batched again: a second
    /// request asking for it shares the probe already pending or in flight.
    #[inline(always)]
    pub fn lookup(&mut self, key: &K, request: &R) -> Verdict<K> {
        self.stats.lookups += 1;
        let slot = self.slot_for(request.id());
        // guard: L1-known-key
        let entry = match self.states.get_mut(key) {
            Some(entry) => {
                // Already linked if the request is the key's first requester
                // (in the entry, already loaded), or the key is the one its
                // request is expected to ask next (the slot's keys are exactly
                // its links), or, failing both, it is in the overflow list.
                if entry.first != slot {
                    let record = &mut self.slots[slot as usize];
                    if !record.follows(key) && !self.overflow.holds(*entry, slot) {
                        self.overflow.add(entry, slot);
                        record.keys.push(key.clone());
                        record.cursor = record.keys.len();
                    }
                }
                *entry
            }
            None => self.insert_new(key, request, slot),
        };
        match entry.phase(self.flushed_below) {
            Phase::Pending | Phase::InFlight => {
                self.stats.pending += 1;
                Verdict::Pending
            }
            Phase::Resolved { found: true } => {
                self.stats.hits += 1;
                Verdict::Hit(Ticket {
                    key: key.clone(),
                    generation: entry.generation(),
                    table: self.id,
                })
            }
            Phase::Resolved { found: false } => {
                self.stats.misses += 1;
                Verdict::Miss
            }
        }
    }

    /// A fresh state for a key looked up for the first time, batched under
    /// `request`'s group. Kept out of line so the known-key path of
    /// [`lookup`](Self::lookup) stays small enough to inline.
    #[inline(never)]
    fn insert_new(&mut self, key: &K, request: &R, slot: u32) -> Entry {
        let generation = Generation(self.next_generation);
        self.next_generation += 1;
        let entry = Entry::new(generation, slot);
        self.states.insert(key.clone(), entry);
        let record = &mut self.slots[slot as usize];
        record.keys.push(key.clone());
        record.cursor = record.keys.len();
        let index = if record.batch_epoch == self.batch_epoch {
            record.batch_index
        } else {
            let id = request.id();
            let index = match self.batch_groups.get(id) {
                Some(&index) => index,
                None => {
                    self.batch.push(Group::new(self.id, request.clone()));
                    self.batch_groups.insert(id.clone(), self.batch.len() - 1);
                    self.batch.len() - 1
                }
            };
            let record = &mut self.slots[slot as usize];
            record.batch_index = index;
            record.batch_epoch = self.batch_epoch;
            index
        };
        let group = &mut self.batch[index];
        group.keys.push(key.clone());
        group.generations.push(generation);
        entry
    }

    /// The slot of live request `id`, taking a free one for a new request.
    #[inline]
    fn slot_for(&mut self, id: &R::Id) -> u32 {
        if let Some(slot) = self.slots.get(self.last_slot as usize)
            && slot.id.as_ref() == Some(id)
        {
            return self.last_slot;
        }
        self.slot_for_other(id)
    }

    #[inline(never)]
    fn slot_for_other(&mut self, id: &R::Id) -> u32 {
        let slot = match self.slot_of.get(id) {
            Some(&slot) => slot,
            None => {
                let slot = match self.free_slots.pop() {
                    Some(slot) => {
                        self.slots[slot as usize].id = Some(id.clone());
                        slot
                    }
                    None => {
                        // u32::MAX is NONE: 4 billion live requests at once
                        // is not a scheduler this table serves.
                        assert!(self.slots.len() < NONE as usize, "too many live requests");
                        self.slots.push(Slot {
                            id: Some(id.clone()),
                            keys: Vec::new(),
                            cursor: 0,
                            batch_index: 0,
                            batch_epoch: NO_EPOCH,
                        });
                        (self.slots.len() - 1) as u32
                    }
                };
                self.slot_of.insert(id.clone(), slot);
                slot
            }
        };
        self.last_slot = slot;
        slot
    }

    /// Ends the step: takes the keys looked up for the first time since the
    /// last call, grouped by request, and marks them in flight.
    ///
    /// Entries whose state was cleaned up (or cleaned up and created anew)
    /// since their lookup are left out; `None` when nothing is left, so an
    /// empty submission never reaches the worker.
    pub fn take_submission(&mut self) -> Option<Submission<K, R>> {
        self.batch_groups.clear();
        // guard: L9-batch-cache-epoch
        self.batch_epoch += 1;
        let mut groups = mem::take(&mut self.batch);
        // Every state created since the last flush is batched once, and
        // moving the watermark puts all of them in flight at once; only the
        // ones cleanup removed meanwhile have to be picked out.
        // guard: L9-flush-moves-the-watermark
        self.flushed_below = self.next_generation;
        if !self.dropped_pending.is_empty() {
            let dropped = &self.dropped_pending;
            groups.retain_mut(|group| {
                let mut kept = 0;
                for i in 0..group.keys.len() {
                    // guard: L1-batch-generation
                    if dropped.contains(&group.generations[i].0) {
                        continue; // cleaned up before the flush
                    }
                    group.keys.swap(kept, i);
                    group.generations.swap(kept, i);
                    kept += 1;
                }
                group.keys.truncate(kept);
                group.generations.truncate(kept);
                kept > 0
            });
            self.dropped_pending.clear();
        }
        if groups.is_empty() {
            return None;
        }
        for (seq, group) in (self.stats.groups_submitted..).zip(&mut groups) {
            group.seq = seq;
        }
        self.stats.groups_submitted += groups.len() as u64;
        self.stats.keys_submitted += groups.iter().map(|g| g.len() as u64).sum::<u64>();
        Some(Submission { groups })
    }

    /// Applies one group's answers.
    ///
    /// An answer whose key is gone, or whose generation is not the state's, is
    /// stale and dropped. An answer for a state nobody waits for any more (an
    /// orphan: every requester was cleaned up in flight) removes the state.
    /// Otherwise the state becomes resolved. A result of another table's
    /// group is refused whole (counted in [`LookupStats::foreign`]).
    pub fn apply(&mut self, result: GroupResult<K>) {
        // guard: L10-apply-checks-the-table
        if result.table != self.id {
            // L10: generations are only comparable within one table.
            self.stats.foreign += 1;
            tracing::error!(
                seq = result.seq,
                "a group result of another lookup table was applied; dropped"
            );
            return;
        }
        self.stats.groups_applied += 1;
        match result.outcome {
            GroupOutcome::Answered => {}
            GroupOutcome::Short { .. } => self.stats.short_results += 1,
            GroupOutcome::Surplus => self.stats.surplus_results += 1,
            GroupOutcome::BackendError => self.stats.backend_errors += 1,
            GroupOutcome::BackendPanic { .. } => self.stats.backend_panics += 1,
            GroupOutcome::TimedOut => self.stats.timeouts += 1,
            GroupOutcome::Cancelled => self.stats.cancelled += 1,
        }
        if let Some(log) = &mut self.applied_log {
            log.push((result.seq, result.outcome));
        }
        let entries = result
            .keys
            .into_iter()
            .zip(result.generations)
            .zip(result.found);
        for ((key, generation), found) in entries {
            let MapEntry::Occupied(mut slot) = self.states.entry(key) else {
                self.stats.stale_results += 1;
                continue;
            };
            let state = slot.get_mut();
            // guard: L2-apply-generation
            if state.generation() != generation {
                // L3: a late answer for an older incarnation of the key.
                self.stats.stale_results += 1;
                continue;
            }
            let phase = state.phase(self.flushed_below);
            // guard: L5-apply-in-flight-only
            if phase != Phase::InFlight {
                // A generation is submitted once and answered once, and
                // nothing but this method leaves InFlight: unreachable unless
                // a result is applied twice.
                self.stats.anomalies += 1;
                tracing::error!(
                    ?generation,
                    ?phase,
                    "result for a state that is not in flight"
                );
                continue;
            }
            // guard: L3-orphan-removal
            if !state.has_requesters() {
                slot.remove();
                self.stats.orphans_dropped += 1;
                continue;
            }
            state.resolve(found);
        }
    }

    /// Turns the hit recorded by `ticket` into a miss, after its load failed.
    ///
    /// Only the exact generation that resolved as a hit is touched: if the key
    /// was cleaned up and looked up again since, the ticket is stale and this
    /// is a no-op, so a late failure cannot corrupt a newer lookup. Returns
    /// whether the verdict changed. A ticket from another table is refused
    /// (counted in [`LookupStats::foreign`]).
    pub fn mark_miss(&mut self, ticket: &Ticket<K>) -> bool {
        // guard: L10-mark-miss-checks-the-table
        if ticket.table != self.id {
            // L10: another table's generation 3 is not this table's.
            self.stats.foreign += 1;
            return false;
        }
        match self.states.get_mut(&ticket.key) {
            Some(state)
                // guard: L4-ticket-generation
                if state.generation() == ticket.generation
                    && state.phase(self.flushed_below) == (Phase::Resolved { found: true }) =>
            {
                state.resolve(false);
                self.stats.marked_miss += 1;
                true
            }
            _ => false,
        }
    }

    /// Turns resolved hits of `keys` into misses, for callers that only kept
    /// keys. Pending and in-flight states are never touched (their answer is
    /// still to come, for a newer lookup than the failed load). Returns how
    /// many verdicts changed.
    pub fn mark_miss_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> usize
    where
        K: 'k,
    {
        let mut changed = 0;
        for key in keys {
            // guard: L4-keys-resolved-only
            if let Some(state) = self.states.get_mut(key)
                && state.phase(self.flushed_below) == (Phase::Resolved { found: true })
            {
                state.resolve(false);
                changed += 1;
            }
        }
        self.stats.marked_miss += changed as u64;
        changed
    }

    /// Forgets request `id`: it no longer holds any key.
    ///
    /// A key left without requesters is removed, unless its probe is in
    /// flight: that state stays (an orphan) so a later request for the same
    /// key shares the probe instead of submitting a second one; if nobody
    /// joins, its answer removes it. Unknown ids are a no-op.
    pub fn cleanup(&mut self, id: &R::Id) {
        let Some(slot) = self.slot_of.remove(id) else {
            return;
        };
        let record = &mut self.slots[slot as usize];
        record.id = None;
        record.cursor = 0;
        record.batch_epoch = NO_EPOCH;
        let mut keys = mem::take(&mut record.keys);
        for key in keys.drain(..) {
            let MapEntry::Occupied(mut occupied) = self.states.entry(key) else {
                continue;
            };
            let state = occupied.get_mut();
            self.overflow.remove(state, slot);
            if state.has_requesters() {
                continue;
            }
            match state.phase(self.flushed_below) {
                // guard: L3-inflight-retention
                Phase::InFlight => {} // kept as an orphan
                Phase::Pending => {
                    self.dropped_pending.insert(state.generation().0);
                    occupied.remove();
                }
                Phase::Resolved { .. } => {
                    occupied.remove();
                }
            }
        }
        // A free slot keeps its key list's allocation for the next request,
        // but only while free slots are not many more than live ones.
        if keys.capacity() <= REUSE_KEYS
            && self.free_slots.len() <= self.slot_of.len() + SPARE_SLOTS
        {
            self.slots[slot as usize].keys = keys;
        }
        self.free_slots.push(slot);
        self.shrink_if_sparse();
    }

    /// Gives memory back after large cleanups, amortised. The maps shrink to
    /// twice their contents once at most an eighth of their capacity is
    /// used (not sooner: a map that breathes with the steps is not resized
    /// back and forth): each shrink costs what the cleanups since the last
    /// one removed.
    /// The slots are compacted (trailing free slots dropped, the other free
    /// slots' key lists released) once at most a quarter of them is live and
    /// the live count has halved since the last compaction, or dropped to
    /// zero: a few compactions per wave of requests, however large.
    fn shrink_if_sparse(&mut self) {
        shrink_map(&mut self.states);
        shrink_map(&mut self.slot_of);
        let live = self.slot_of.len();
        self.compact_below = self.compact_below.max(live / 2);
        let sparse = self.slots.len() > SPARE_SLOTS && live * 4 < self.slots.len();
        if !sparse || (live >= self.compact_below && live > 0) {
            return;
        }
        while self.slots.last().is_some_and(|slot| slot.id.is_none()) {
            self.slots.pop();
        }
        self.slots.shrink_to_fit();
        self.free_slots.clear();
        // Lowest first out, so the slots at the end stay free and go at the
        // next compaction.
        for (index, slot) in self.slots.iter_mut().enumerate().rev() {
            if slot.id.is_none() {
                slot.keys = Vec::new();
                self.free_slots.push(index as u32);
            }
        }
        self.free_slots.shrink_to_fit();
        self.batch_groups.shrink_to(self.batch_groups.len());
        self.compact_below = live / 2;
    }

    /// Starts (or stops) recording which groups are applied, in order, with
    /// their outcomes; [`take_applied`](Self::take_applied) hands the record
    /// over. Off by default. For checkers and debugging: with groups
    /// answered concurrently the record is the only way to know the order in
    /// which answers reached the table. Not part of the stable API.
    #[doc(hidden)]
    pub fn record_applied(&mut self, on: bool) {
        self.applied_log = on.then(Vec::new);
    }

    /// `(seq, outcome)` of every group applied since recording started or
    /// since the last call, in application order (empty when not recording).
    /// Not part of the stable API.
    #[doc(hidden)]
    pub fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.applied_log.as_mut().map(mem::take).unwrap_or_default()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> LookupStats {
        self.stats
    }

    /// The state of `key`, if the table tracks it. For checkers, tools and
    /// debugging; not part of the stable API.
    #[doc(hidden)]
    pub fn key_state(&self, key: &K) -> Option<KeyState> {
        self.states.get(key).map(|&state| KeyState {
            generation: state.generation(),
            phase: state.phase(self.flushed_below),
            requesters: self.overflow.count(state),
        })
    }

    /// Number of keys tracked (including orphaned in-flight probes).
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Number of live requests (looked up at least one key, not cleaned up).
    pub fn request_count(&self) -> usize {
        self.slot_of.len()
    }

    /// True when the table tracks no key and no request: the state after every
    /// request was cleaned up and every submitted group's result applied.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty() && self.slot_of.is_empty()
    }

    /// Checks the table's structural invariants (reverse index and
    /// requester lists agree, no state is left without requesters unless its
    /// probe is in flight). For tests and models; not part of the stable
    /// API.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_structure().map_err(InvariantViolation)
    }

    fn check_structure(&self) -> Result<(), String> {
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

/// Results the public API cannot produce (a duplicate, a foreign
/// generation), built by hand to show the table's last-line guards.
#[cfg(test)]
mod tests {
    use super::*;

    fn result_for(
        table: &LookupTable<u64, u64>,
        key: u64,
        generation: Generation,
        found: bool,
    ) -> GroupResult<u64> {
        GroupResult {
            table: table.id,
            seq: 0,
            keys: vec![key],
            generations: vec![generation],
            found: vec![found],
            outcome: GroupOutcome::Answered,
        }
    }

    fn in_flight(table: &mut LookupTable<u64, u64>, key: u64, request: u64) -> Generation {
        table.lookup(&key, &request);
        table.take_submission().expect("a new key");
        table.key_state(&key).expect("tracked").generation
    }

    #[test]
    fn a_result_for_another_generation_is_dropped_as_stale() {
        let mut table = LookupTable::<u64, u64>::new();
        let current = in_flight(&mut table, 5, 1);
        table.apply(result_for(&table, 5, Generation(current.0 + 1), true));
        table.apply(result_for(&table, 6, current, true)); // no such key
        assert_eq!(table.stats().stale_results, 2);
        assert_eq!(table.key_state(&5).unwrap().phase, Phase::InFlight);
        table.apply(result_for(&table, 5, current, false));
        assert_eq!(table.lookup(&5, &1), Verdict::Miss);
        assert_eq!(table.stats().anomalies, 0);
    }

    #[test]
    fn a_duplicate_result_is_counted_as_an_anomaly_and_changes_nothing() {
        let mut table = LookupTable::<u64, u64>::new();
        let generation = in_flight(&mut table, 5, 1);
        table.apply(result_for(&table, 5, generation, true));
        table.apply(result_for(&table, 5, generation, false));
        assert_eq!(table.stats().anomalies, 1);
        assert!(table.lookup(&5, &1).is_hit(), "the first answer stands");
    }

    #[test]
    fn a_result_for_a_pending_state_is_an_anomaly() {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        let generation = table.key_state(&5).unwrap().generation;
        table.apply(result_for(&table, 5, generation, true));
        assert_eq!(table.stats().anomalies, 1);
        assert_eq!(table.key_state(&5).unwrap().phase, Phase::Pending);
        // The key is still submitted and resolved normally afterwards.
        let group = table.take_submission().unwrap().into_groups().remove(0);
        table.apply(group.answered([true]));
        assert!(table.lookup(&5, &1).is_hit());
    }

    #[test]
    fn a_flush_leaves_out_exactly_the_batched_keys_cleanup_removed() {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        table.lookup(&6, &1);
        table.lookup(&6, &2);
        table.lookup(&7, &2);
        table.cleanup(&1); // removes pending 5; 6 is still held by 2
        table.lookup(&5, &3); // a new state for 5, batched again
        let submission = table.take_submission().expect("keys left");
        let batched: Vec<(u64, u64)> = submission
            .groups()
            .iter()
            .flat_map(|g| {
                g.keys
                    .iter()
                    .zip(&g.generations)
                    .map(|(k, gen_)| (*k, gen_.0))
            })
            .collect();
        assert_eq!(batched, [(6, 1), (7, 2), (5, 3)]);
        assert!(table.dropped_pending.is_empty(), "cleared by the flush");
        for key in [5, 6, 7] {
            assert_eq!(table.key_state(&key).unwrap().phase, Phase::InFlight);
        }
        table.lookup(&8, &3);
        assert_eq!(table.key_state(&8).unwrap().phase, Phase::Pending);
    }

    /// A table with two requests sharing key 5 and request 2 holding key 6.
    fn populated() -> LookupTable<u64, u64> {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        table.lookup(&5, &2);
        table.lookup(&6, &2);
        table.check_invariants().expect("a consistent table");
        table
    }

    #[test]
    fn check_invariants_reports_each_kind_of_corruption() {
        // Corrupted by hand: the public API cannot produce any of these.
        fn slot(table: &LookupTable<u64, u64>, id: u64) -> usize {
            table.slot_of[&id] as usize
        }
        fn expect(table: &LookupTable<u64, u64>, needle: &str) {
            let error = table.check_invariants().unwrap_err();
            assert!(error.message().contains(needle), "{error}");
        }

        let mut table = populated();
        let s1 = slot(&table, 1);
        table.slots[s1].keys.push(7);
        expect(&table, "no state");

        let mut table = populated();
        table.states.get_mut(&6).unwrap().first = NONE;
        expect(&table, "does not list it");

        let mut table = populated();
        let s1 = slot(&table, 1);
        table.slots[s1].id = None;
        table.slots[s1].keys.clear();
        table.slot_of.remove(&1);
        expect(&table, "lists unknown request");

        let mut table = populated();
        let s2 = slot(&table, 2);
        table.states.get_mut(&6).unwrap().first = NONE;
        table.slots[s2].keys.retain(|&key| key == 5);
        expect(&table, "no requesters");

        let mut table = populated();
        let s2 = slot(&table, 2) as u32;
        let entry = table.states.get_mut(&5).unwrap();
        table.overflow.add(entry, s2);
        expect(&table, "a duplicate");

        let mut table = populated();
        let s1 = slot(&table, 1);
        table.slots[s1].id = None;
        expect(&table, "free slot");

        let mut table = populated();
        table.slot_of.insert(1, 7);
        expect(&table, "not indexed at its slot");

        let mut table = populated();
        table.free_slots.push(0);
        expect(&table, "a slot leaked or is listed twice");

        let mut table = populated();
        table.slot_of.insert(9, 0);
        expect(&table, "indexed request ids");

        let mut table = populated();
        let s1 = slot(&table, 1);
        table.states.get_mut(&5).unwrap().first = NONE;
        table.slots[s1].keys.clear();
        expect(&table, "overflow requesters but no first");
    }

    #[test]
    fn requesters_beyond_the_first_come_and_go_through_reused_lists() {
        let mut table = LookupTable::<u64, u64>::new();
        for request in 1..=4 {
            table.lookup(&5, &request);
        }
        assert_eq!(table.key_state(&5).unwrap().requesters, 4);
        assert_eq!(table.overflow.lists.len(), 1);
        // Cleaning up the first requester promotes one from the list.
        table.cleanup(&1);
        table.cleanup(&3);
        assert_eq!(table.key_state(&5).unwrap().requesters, 2);
        table.check_invariants().unwrap();
        table.cleanup(&4);
        // One requester left: the list went back to the free pool.
        assert_eq!(table.overflow.free.len(), 1);
        table.lookup(&6, &2);
        table.lookup(&6, &7);
        assert_eq!(table.overflow.lists.len(), 1, "the freed list was reused");
        table.check_invariants().unwrap();
        table.cleanup(&2);
        table.cleanup(&7);
        assert!(table.key_state(&5).is_none());
        assert!(
            table.key_state(&6).is_none(),
            "pending, not in flight: removed"
        );
        assert!(table.is_empty());
    }

    /// Compaction after a large cleanup keeps every live request's slot and
    /// every in-flight state, and slots are reused afterwards.
    #[test]
    fn compaction_after_a_large_cleanup_keeps_live_requests_and_probes_in_flight() {
        let mut table = LookupTable::<u64, u64>::new();
        let requests = 3 * SPARE_SLOTS as u64;
        for request in 0..requests {
            table.lookup(&request, &request);
            table.lookup(&(request % 7 + 1_000_000), &request); // shared
        }
        let submission = table.take_submission().unwrap();
        let slots_before = table.slots.len();
        // Keep every 100th request, and the last one (the highest slot).
        for request in (0..requests).filter(|r| r % 100 != 0 && *r != requests - 1) {
            table.cleanup(&request);
        }
        assert!(table.slots.len() <= slots_before);
        assert!(
            table.free_slots.len() < slots_before,
            "compacted: {} free of {}",
            table.free_slots.len(),
            table.slots.len()
        );
        table.check_invariants().unwrap();
        // New requests reuse free slots; answers reach live and orphaned states.
        for request in requests..requests + 50 {
            table.lookup(&request, &request);
        }
        for group in submission.into_groups() {
            let answers = vec![true; group.len()];
            table.apply(group.answered(answers));
        }
        table.check_invariants().unwrap();
        assert!(table.lookup(&0, &0).is_hit());
        assert!(table.lookup(&(requests - 1), &(requests - 1)).is_hit());
        for request in (0..requests + 50).filter(|r| r % 100 == 0 || *r >= requests - 1) {
            table.cleanup(&request);
        }
        if let Some(submission) = table.take_submission() {
            for group in submission.into_groups() {
                table.apply(group.failed());
            }
        }
        table.check_invariants().unwrap();
        assert!(table.is_empty(), "{} keys left", table.len());
        assert!(
            table.slots.len() <= SPARE_SLOTS,
            "{} slots kept for no live request",
            table.slots.len()
        );
        assert_eq!(table.stats().anomalies, 0);
    }

    /// A key shared by very many requests indexes its requesters: each
    /// link and unlink is a hash operation, not a scan of the others.
    #[test]
    fn a_key_shared_by_many_requests_links_and_unlinks_without_scans() {
        let mut table = LookupTable::<u64, u64>::new();
        let requests = 10_000u64;
        for request in 0..requests {
            table.lookup(&5, &request);
        }
        let entry = table.states[&5];
        assert_eq!(
            table.overflow.positions[&entry.more].len(),
            requests as usize - 1
        );
        assert_eq!(table.key_state(&5).unwrap().requesters, requests as usize);
        table.check_invariants().unwrap();
        // Out of order, so positions move under the index.
        for request in (0..requests).filter(|r| r % 3 == 0) {
            table.cleanup(&request);
        }
        table.check_invariants().unwrap();
        for request in (0..requests).filter(|r| r % 3 != 0) {
            table.cleanup(&request);
        }
        assert!(table.is_empty());
        assert!(
            table.overflow.positions.is_empty(),
            "indexes go with their lists"
        );
    }
}
