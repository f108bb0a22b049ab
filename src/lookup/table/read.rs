//! The read path: a scheduler's lookups, and the keys and requests they add.

use std::hash::Hash;

use crate::lookup::submission::Group;
use crate::lookup::types::{Generation, Phase, Request, Ticket, Verdict};

use super::state::LookupTable;
use super::storage::{Entry, NO_EPOCH, NONE, Slot, link_requester};

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
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
    pub(super) fn lookup_in(&mut self, slot: u32, key: &K, request: &R) -> Verdict<K> {
        self.lookup_in_with(slot, key, request, |verdict| verdict)
    }

    /// [`lookup_in`](Self::lookup_in), handing the verdict to `emit` (see
    /// [`verdict_with`](Self::verdict_with)).
    #[inline(always)]
    pub(super) fn lookup_in_with<T>(
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
    pub(super) fn lookup_hashed(&mut self, slot: u32, key: &K, request: &R) -> Verdict<K> {
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
    pub(super) fn verdict(&mut self, entry: Entry, key: &K) -> Verdict<K> {
        self.verdict_with(entry, key, |verdict| verdict)
    }

    /// The verdict on `entry`, handed to `emit` in each arm: a caller that
    /// stores it (the batched call) then writes it in place, where a
    /// verdict returned from the match would be assembled on the stack and
    /// copied.
    #[inline(always)]
    pub(super) fn verdict_with<T>(
        &mut self,
        entry: Entry,
        key: &K,
        emit: impl FnOnce(Verdict<K>) -> T,
    ) -> T {
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
    pub(super) fn insert_new(
        &mut self,
        hash: u64,
        key: &K,
        request: &R,
        slot: u32,
    ) -> Option<Entry> {
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
    pub(super) fn take_group_number(&mut self) -> u32 {
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
    pub(super) fn shed(&mut self) -> Verdict<K> {
        self.stats.misses += 1;
        self.stats.shed += 1;
        Verdict::Miss
    }

    /// The slot of live request `id`, taking a free one for a new request.
    #[inline]
    pub(super) fn slot_for(&mut self, id: &R::Id) -> u32 {
        if let Some(slot) = self.slots.get(self.last_slot as usize)
            && slot.id.as_ref() == Some(id)
        {
            return self.last_slot;
        }
        self.slot_for_other(id)
    }

    #[inline(never)]
    pub(super) fn slot_for_other(&mut self, id: &R::Id) -> u32 {
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
}
