//! The sans-IO lookup table: every rule of the protocol, no threads inside.
//!
//! This file holds the rules; `keys` the slab of key records and its index;
//! `storage` the per-key entries, requester lists and request slots; `check`
//! the structural self-check the tests and models run.
//!
//! Layout (see docs/performance.md for what it costs): each key is stored
//! once, with its 24-byte [`Entry`], in a slab cell found through a hash
//! index of `u32` cell numbers; live requests are interned into a slab of
//! [`Slot`]s, so a link is a `u32` both ways (a key's requesters are slot
//! numbers, a request's keys are cell numbers), never a copy of a key or a
//! request id; the requesters of shared keys beyond the first sit in
//! reusable overflow lists. Hashing is hashbrown's default (foldhash): fast
//! on the short keys a KV cache uses, and seeded per table, unlike an
//! unseeded FxHash.

use std::collections::VecDeque;
use std::hash::Hash;
use std::mem;
use std::time::Instant;

use hashbrown::HashMap;

use super::limits::LookupLimits;
use super::stats::LookupStats;
use super::submission::{Group, GroupBuffers, GroupOutcome, GroupResult, Interest, Submission};
use super::types::{Generation, Phase, Request, TableId, Ticket, Verdict};
use crate::invariant::InvariantViolation;
use crate::sync::Arc;

mod bounds;
mod check;
mod inspect;
mod keys;
mod settle;
mod storage;
#[cfg(test)]
mod tests;

use bounds::StepMark;
use keys::KeyStore;
use storage::{
    Entry, NO_EPOCH, NONE, Overflow, REUSE_KEYS, SPARE_GROUP_KEYS, SPARE_GROUPS, SPARE_SLOTS, Slot,
    link_requester, shrink_map,
};

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
    /// Every tracked key and its state.
    keys: KeyStore<K>,
    /// Live request ids and their slots.
    slot_of: HashMap<R::Id, u32>,
    slots: Vec<Slot<R::Id>>,
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
    /// The vectors of applied results, emptied, for the next groups (at
    /// most [`SPARE_GROUPS`]): a group's keys, generations and answers
    /// reuse allocations instead of growing new ones every step.
    spare_buffers: Vec<GroupBuffers<K>>,
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
    /// The deadline and admission bounds.
    limits: LookupLimits,
    /// Keys in this step's batch (pending states).
    batched_keys: usize,
    /// Keys and groups handed out by `take_submission` whose results have
    /// not been applied yet.
    outstanding_keys: usize,
    outstanding_groups: usize,
    /// Steps ended (`take_submission` calls) so far.
    steps: u64,
    /// When the current step started: the time of the last timed flush.
    step_started: Option<Instant>,
    /// The ended steps whose keys are not overdue yet, oldest first, while
    /// a deadline is set.
    marks: VecDeque<StepMark>,
    /// Unresolved states created before this generation are overdue: their
    /// step's pending budget ran out.
    overdue_below: u64,
    /// The interest of each group out, by group number (an [`Entry`]'s
    /// `group`), while unwanted groups are skipped: one entry a group, made
    /// at the flush and dropped when the group's result is applied.
    interest_of: HashMap<u32, Arc<Interest>>,
    /// The number the next batch group gets (numbers of groups out are
    /// skipped when it wraps).
    next_group: u32,
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
            .field("keys", &self.keys.len())
            .field("requests", &self.slot_of.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<K, R: Request> Default for LookupTable<K, R> {
    fn default() -> Self {
        Self {
            id: TableId::new(),
            keys: KeyStore::default(),
            slot_of: HashMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            compact_below: 0,
            last_slot: NONE,
            overflow: Overflow::default(),
            batch: Vec::new(),
            spare_buffers: Vec::new(),
            batch_groups: HashMap::new(),
            batch_epoch: 0,
            flushed_below: 0,
            dropped_pending: hashbrown::HashSet::new(),
            next_generation: 0,
            limits: LookupLimits::default(),
            batched_keys: 0,
            outstanding_keys: 0,
            outstanding_groups: 0,
            steps: 0,
            step_started: None,
            marks: VecDeque::new(),
            overdue_below: 0,
            interest_of: HashMap::new(),
            next_group: 0,
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
        let slot = self.slot_for(request.id());
        self.lookup_in(slot, key, request)
    }

    /// [`lookup`](Self::lookup) for the request in `slot`.
    #[inline(always)]
    fn lookup_in(&mut self, slot: u32, key: &K, request: &R) -> Verdict<K> {
        self.lookup_in_with(slot, key, request, |verdict| verdict)
    }

    /// [`lookup_in`](Self::lookup_in), handing the verdict to `emit` (see
    /// [`verdict_with`](Self::verdict_with)).
    #[inline(always)]
    fn lookup_in_with<T>(
        &mut self,
        slot: u32,
        key: &K,
        request: &R,
        emit: impl FnOnce(Verdict<K>) -> T,
    ) -> T {
        // A scheduler asks about a request's blocks in the same order every
        // step: the key the request is expected to ask next is found
        // without hashing, by comparing it with the key in the expected
        // cell. Its state lists the request (the slot's cells are exactly
        // its links), so nothing is to be linked.
        let record = &mut self.slots[slot as usize];
        let expected = if record.cursor < record.keys.len() {
            record.cursor
        } else {
            0
        };
        if let Some(&cell) = record.keys.get(expected)
            // guard: L9-expected-cell-holds-the-key
            && let Some(entry) = self.keys.entry_if_key(cell, key)
        {
            record.cursor = expected + 1;
            let entry = *entry;
            return self.verdict_with(entry, key, emit);
        }
        emit(self.lookup_hashed(slot, key, request))
    }

    /// [`lookup_in`](Self::lookup_in) for a key that is not the one its
    /// request was expected to ask: found (or created) through the index.
    #[inline(always)]
    fn lookup_hashed(&mut self, slot: u32, key: &K, request: &R) -> Verdict<K> {
        let hash = self.keys.hash(key);
        // guard: L1-known-key
        let entry = match self.keys.find(hash, key) {
            Some(cell) => {
                let entry = self.keys.entry_mut(cell);
                if entry.has_requesters() {
                    // A request asks once however often it looks the key up.
                    link_requester(
                        entry,
                        slot,
                        &mut self.slots[slot as usize],
                        &mut self.overflow,
                        cell,
                    );
                    *entry
                } else {
                    // An orphaned probe: joining it wants its group again.
                    match self.rejoin(hash, cell, key, request, slot) {
                        Some(entry) => entry,
                        None => return self.shed(),
                    }
                }
            }
            None => match self.insert_new(hash, key, request, slot) {
                Some(entry) => entry,
                None => return self.shed(),
            },
        };
        self.verdict(entry, key)
    }

    /// The verdict a lookup of `key`, whose state is `entry`, gives.
    #[inline(always)]
    fn verdict(&mut self, entry: Entry, key: &K) -> Verdict<K> {
        self.verdict_with(entry, key, |verdict| verdict)
    }

    /// The verdict on `entry`, handed to `emit` in each arm: a caller that
    /// stores it (the batched call) then writes it in place, where a
    /// verdict returned from the match would be assembled on the stack and
    /// copied.
    #[inline(always)]
    fn verdict_with<T>(&mut self, entry: Entry, key: &K, emit: impl FnOnce(Verdict<K>) -> T) -> T {
        match entry.phase(self.flushed_below, self.overdue_below) {
            Phase::Pending | Phase::InFlight => {
                self.stats.pending += 1;
                emit(Verdict::Pending)
            }
            Phase::Resolved { found: true } => {
                self.stats.hits += 1;
                emit(Verdict::Hit(Ticket {
                    key: key.clone(),
                    generation: entry.generation(),
                    table: self.id,
                }))
            }
            Phase::Resolved { found: false } => {
                self.stats.misses += 1;
                emit(Verdict::Miss)
            }
            Phase::Overdue => {
                // L13: past its budget, the scheduler computes the block.
                self.stats.misses += 1;
                self.stats.deadline_misses += 1;
                emit(Verdict::Miss)
            }
        }
    }

    /// Looks up a request's `keys` in order, exactly as that many
    /// [`lookup`](Self::lookup) calls would, writing their verdicts into
    /// `verdicts` (cleared first; its allocation is reused). Returns how many
    /// of the leading keys are hits: the blocks a scheduler can load before
    /// the first one it must compute or wait for.
    ///
    /// ```
    /// use kvtier::Verdict;
    /// use kvtier::lookup::LookupTable;
    ///
    /// let mut table: LookupTable<u64, u64> = LookupTable::new();
    /// let mut verdicts = Vec::new();
    /// assert_eq!(table.lookup_all(&[1, 2, 3], &7, &mut verdicts), 0); // all new: pending
    /// for group in table.take_submission().unwrap().into_groups() {
    ///     table.apply(group.answered([true, false, true]));
    /// }
    /// assert_eq!(table.lookup_all(&[1, 2, 3], &7, &mut verdicts), 1); // 2 is a miss
    /// assert!(verdicts[0].is_hit() && verdicts[1] == Verdict::Miss && verdicts[2].is_hit());
    /// ```
    #[inline]
    pub fn lookup_all(&mut self, keys: &[K], request: &R, verdicts: &mut Vec<Verdict<K>>) -> usize {
        verdicts.clear();
        // guard: L12-no-keys-registers-nothing
        if keys.is_empty() {
            return 0; // and the request is not registered, as by no lookup
        }
        // The request's slot found once, room for all verdicts made once,
        // and each verdict written where it belongs.
        let slot = self.slot_for(request.id());
        verdicts.reserve(keys.len());
        for key in keys {
            self.lookup_in_with(slot, key, request, |verdict| verdicts.push(verdict));
        }
        // guard: L12-leading-hits-stop-at-the-first-non-hit
        verdicts
            .iter()
            .take_while(|verdict| verdict.is_hit())
            .count()
    }

    /// A fresh state for a key looked up for the first time, batched under
    /// `request`'s group; `None` when the admission bounds leave no room
    /// (nothing is created). Kept out of line so the known-key path of
    /// [`lookup`](Self::lookup) stays small enough to inline.
    #[inline(never)]
    fn insert_new(&mut self, hash: u64, key: &K, request: &R, slot: u32) -> Option<Entry> {
        // guard: L14-admission-bounds-the-keys
        if self.batched_keys + self.outstanding_keys >= self.limits.max_outstanding_keys {
            return None;
        }
        let record = &self.slots[slot as usize];
        let index = if record.batch_epoch == self.batch_epoch {
            record.batch_index
        } else {
            let id = request.id();
            let index = match self.batch_groups.get(id) {
                Some(&index) => index,
                None => {
                    // guard: L14-admission-bounds-the-groups
                    if self.batch.len() + self.outstanding_groups
                        >= self.limits.max_outstanding_groups
                    {
                        return None;
                    }
                    let number = self.take_group_number();
                    let buffers = self.spare_buffers.pop().unwrap_or_default();
                    self.batch.push(Group::with_buffers(
                        self.id,
                        request.clone(),
                        number,
                        buffers,
                    ));
                    self.batch_groups.insert(id.clone(), self.batch.len() - 1);
                    self.batch.len() - 1
                }
            };
            let record = &mut self.slots[slot as usize];
            record.batch_index = index;
            record.batch_epoch = self.batch_epoch;
            index
        };
        let generation = Generation(self.next_generation);
        self.next_generation += 1;
        let group = &mut self.batch[index];
        let entry = Entry::new(generation, slot, group.number);
        let cell = self.keys.insert(hash, key.clone(), entry);
        let record = &mut self.slots[slot as usize];
        record.keys.push(cell);
        record.cursor = record.keys.len();
        group.keys.push(key.clone());
        group.generations.push(generation);
        self.batched_keys += 1;
        Some(entry)
    }

    /// A number for a new batch group that no group out has.
    fn take_group_number(&mut self) -> u32 {
        loop {
            let number = self.next_group;
            self.next_group = number.wrapping_add(1);
            if !self.interest_of.contains_key(&number) {
                return number;
            }
        }
    }

    /// The verdict for a new key the admission bounds refused.
    #[cold]
    #[inline(never)]
    fn shed(&mut self) -> Verdict<K> {
        self.stats.misses += 1;
        self.stats.shed += 1;
        Verdict::Miss
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
    ///
    /// Keys whose pending budget in steps ran out with this step become
    /// overdue. A budget in time needs
    /// [`take_submission_at`](Self::take_submission_at).
    pub fn take_submission(&mut self) -> Option<Submission<K, R>> {
        self.end_step(None)
    }

    /// [`take_submission`](Self::take_submission) for a step that ends at
    /// `now`: keys whose pending budget in time ran out by `now` become
    /// overdue too, and the next step is taken to start at `now`. The
    /// table reads no clock: `now` is whatever the caller's clock says,
    /// non-decreasing from call to call.
    pub fn take_submission_at(&mut self, now: Instant) -> Option<Submission<K, R>> {
        self.end_step(Some(now))
    }

    fn end_step(&mut self, now: Option<Instant>) -> Option<Submission<K, R>> {
        let step_first = self.flushed_below;
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
        self.batched_keys = 0;
        self.pass_deadlines(step_first, now);
        if groups.is_empty() {
            return None;
        }
        for (seq, group) in (self.stats.groups_submitted..).zip(&mut groups) {
            group.seq = seq;
        }
        let keys: usize = groups.iter().map(Group::len).sum();
        self.stats.groups_submitted += groups.len() as u64;
        self.stats.keys_submitted += keys as u64;
        self.outstanding_groups += groups.len();
        self.outstanding_keys += keys;
        if self.limits.skip_unwanted {
            self.hand_out_interest(&mut groups);
        }
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
        self.settle_outstanding(result.keys.len());
        if !self.interest_of.is_empty() {
            self.interest_of.remove(&result.number);
        }
        match result.outcome {
            GroupOutcome::Answered => {}
            GroupOutcome::Short { .. } => self.stats.short_results += 1,
            GroupOutcome::Surplus => self.stats.surplus_results += 1,
            GroupOutcome::BackendError => self.stats.backend_errors += 1,
            GroupOutcome::BackendPanic { .. } => self.stats.backend_panics += 1,
            GroupOutcome::TimedOut => self.stats.timeouts += 1,
            GroupOutcome::Cancelled => self.stats.cancelled += 1,
            GroupOutcome::Abandoned => self.stats.abandoned += 1,
        }
        if let Some(log) = &mut self.applied_log {
            log.push((result.seq, result.outcome));
        }
        let GroupResult {
            mut keys,
            mut generations,
            mut found,
            ..
        } = result;
        self.apply_answers(&keys, &generations, &found);
        if self.spare_buffers.len() < SPARE_GROUPS && keys.capacity() <= SPARE_GROUP_KEYS {
            keys.clear();
            generations.clear();
            found.clear();
            self.spare_buffers.push(GroupBuffers {
                keys,
                generations,
                found,
            });
        }
    }

    fn apply_answers(&mut self, keys: &[K], generations: &[Generation], found: &[bool]) {
        for ((key, &generation), &found) in keys.iter().zip(generations).zip(found) {
            let hash = self.keys.hash(key);
            let Some(cell) = self.keys.find(hash, key) else {
                self.stats.stale_results += 1;
                continue;
            };
            let state = self.keys.entry_mut(cell);
            // guard: L2-apply-generation
            if state.generation() != generation {
                // L3: a late answer for an older incarnation of the key.
                self.stats.stale_results += 1;
                continue;
            }
            let phase = state.phase(self.flushed_below, self.overdue_below);
            // guard: L5-apply-in-flight-only
            if phase != Phase::InFlight && phase != Phase::Overdue {
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
                self.keys.remove(hash, cell);
                self.stats.orphans_dropped += 1;
                continue;
            }
            if phase == Phase::Overdue {
                // L13: the probe went on past the budget; its answer serves
                // later lookups.
                self.stats.late_answers += 1;
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
        match self.keys.find_mut(&ticket.key) {
            Some(state)
                // guard: L4-ticket-generation
                if state.generation() == ticket.generation
                    && state.phase(self.flushed_below, self.overdue_below)
                        == (Phase::Resolved { found: true }) =>
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
            if let Some(state) = self.keys.find_mut(key)
                && state.phase(self.flushed_below, self.overdue_below)
                    == (Phase::Resolved { found: true })
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
        for cell in keys.drain(..) {
            let entry = self.keys.entry_mut(cell);
            self.overflow.remove(entry, slot);
            let state = *entry;
            if state.has_requesters() {
                continue;
            }
            match state.phase(self.flushed_below, self.overdue_below) {
                // guard: L3-inflight-retention
                Phase::InFlight => {
                    bounds::lose_interest(&self.interest_of, state.group);
                    // kept as an orphan, so a later request shares the probe
                }
                Phase::Overdue => {
                    // L13: a probe past its budget is not worth sharing; its
                    // state goes now, and its answer will be stale.
                    bounds::lose_interest(&self.interest_of, state.group);
                    // guard: L13-overdue-orphans-are-removed
                    self.keys.remove_cell(cell);
                }
                Phase::Pending => {
                    self.dropped_pending.insert(state.generation);
                    self.batched_keys -= 1;
                    self.keys.remove_cell(cell);
                }
                Phase::Resolved { .. } => {
                    self.keys.remove_cell(cell);
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
        if let Some(moved_to) = self.keys.shrink_if_sparse() {
            for slot in &mut self.slots {
                for cell in &mut slot.keys {
                    *cell = moved_to[*cell as usize];
                }
            }
        }
        shrink_map(&mut self.slot_of);
        shrink_map(&mut self.interest_of);
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
        // Every lookup gives exactly one verdict, so the hot path counts
        // the verdicts alone.
        LookupStats {
            lookups: self.stats.hits + self.stats.misses + self.stats.pending,
            ..self.stats
        }
    }

    /// Number of keys tracked (including orphaned in-flight probes).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Number of live requests (looked up at least one key, not cleaned up).
    pub fn request_count(&self) -> usize {
        self.slot_of.len()
    }

    /// True when the table tracks no key and no request: the state after every
    /// request was cleaned up and every submitted group's result applied.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.slot_of.is_empty()
    }

    /// Checks the table's structural invariants (reverse index and
    /// requester lists agree, no state is left without requesters unless its
    /// probe is in flight). For tests and models; not part of the stable
    /// API.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_structure().map_err(InvariantViolation)
    }
}
