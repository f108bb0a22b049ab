//! Write-back: the step's submission, its groups' answers, and failed loads.

use std::hash::Hash;
use std::mem;
use std::time::Instant;

use crate::lookup::submission::{Group, GroupBuffers, GroupOutcome, GroupResult, Submission};
use crate::lookup::types::{Generation, Phase, Request, Ticket};

use super::state::LookupTable;
use super::storage::{SPARE_GROUP_KEYS, SPARE_GROUPS};

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
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

    pub(super) fn end_step(&mut self, now: Option<Instant>) -> Option<Submission<K, R>> {
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
    /// group is refused whole (counted in [`LookupStats::foreign`](crate::lookup::LookupStats::foreign)).
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

    pub(super) fn apply_answers(&mut self, keys: &[K], generations: &[Generation], found: &[bool]) {
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
    /// (counted in [`LookupStats::foreign`](crate::lookup::LookupStats::foreign)).
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
}
