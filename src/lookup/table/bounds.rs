//! The table's bounds (see [`LookupLimits`]): steps whose pending budget
//! runs out, the room admission leaves, and the interest that tells a
//! prober whether a group is still wanted.

use std::hash::Hash;
use std::time::Instant;

use super::state::LookupTable;
use super::step::StepMark;
use super::storage::Entry;
use crate::lookup::error::LookupError;
use crate::lookup::limits::LookupLimits;
use crate::lookup::submission::{Group, Interest};
use crate::lookup::types::{Phase, Request};
use crate::sync::Arc;

/// Marks kept at most. Flushes that never say the time, with a budget
/// only in time, would otherwise add one per step for ever; beyond this
/// the second-oldest mark is merged into the oldest (its keys become
/// overdue with the oldest's: early, never late).
const MAX_MARKS: usize = 1 << 16;

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// An empty table with these bounds.
    ///
    /// ```
    /// use kvtier::Verdict;
    /// use kvtier::lookup::{LookupLimits, LookupTable};
    ///
    /// let limits = LookupLimits::default().pending_steps(Some(2)).max_outstanding_keys(2);
    /// let mut table: LookupTable<u64, u64> = LookupTable::with_limits(limits)?;
    /// assert_eq!(table.lookup(&1, &9), Verdict::Pending);
    /// assert_eq!(table.lookup(&2, &9), Verdict::Pending);
    /// assert_eq!(table.lookup(&3, &9), Verdict::Miss); // no room: shed
    /// let _probing = table.take_submission(); // step 0 ends; the tier is slow
    /// assert_eq!(table.lookup(&1, &9), Verdict::Pending);
    /// let _ = table.take_submission(); // step 1 ends: the budget of 2 steps ran out
    /// assert_eq!(table.lookup(&1, &9), Verdict::Miss);
    /// assert_eq!((table.stats().shed, table.stats().deadline_misses), (1, 1));
    /// # Ok::<(), kvtier::LookupError>(())
    /// ```
    pub fn with_limits(limits: LookupLimits) -> Result<Self, LookupError> {
        let mut table = Self::new();
        table.set_limits(limits)?;
        Ok(table)
    }

    /// The bounds in force.
    pub fn limits(&self) -> &LookupLimits {
        &self.limits
    }

    /// Changes the bounds from now on. Refused (with the bounds unchanged)
    /// when a setting is out of range, or when more keys or groups are
    /// outstanding than the new bounds allow. A new budget applies to the
    /// steps that end from now on.
    pub fn set_limits(&mut self, limits: LookupLimits) -> Result<(), LookupError> {
        limits.validate()?;
        let keys = self.batched_keys + self.outstanding_keys;
        let groups = self.batch.len() + self.outstanding_groups;
        if keys > limits.max_outstanding_keys || groups > limits.max_outstanding_groups {
            return Err(LookupError::Config(format!(
                "{keys} keys and {groups} groups are outstanding, more than the new bounds \
                 ({} keys, {} groups) allow",
                limits.max_outstanding_keys, limits.max_outstanding_groups
            )));
        }
        self.limits = limits;
        Ok(())
    }

    /// Keys handed out and not answered yet (the prober's queue and its
    /// running probes), not counting this step's batch.
    pub fn outstanding_keys(&self) -> usize {
        self.outstanding_keys
    }

    /// Groups handed out and not answered yet.
    pub fn outstanding_groups(&self) -> usize {
        self.outstanding_groups
    }

    /// Keys in this step's batch, to be handed out at the next flush.
    pub fn batched_keys(&self) -> usize {
        self.batched_keys
    }

    /// Ends a step whose keys start at generation `step_first`: records it
    /// while a deadline is set, and makes overdue the keys of every step
    /// whose budget ran out.
    pub(super) fn pass_deadlines(&mut self, step_first: u64, now: Option<Instant>) {
        // The step's keys waited since it started, not since this flush:
        // time queued before the backend call counts.
        // guard: L13-budget-in-time-counts-from-the-step-start
        let started = self.step_started.or(now);
        if now.is_some() {
            self.step_started = now;
        }
        let step = self.steps;
        self.steps += 1;
        if !self.limits.has_deadline() {
            self.marks.clear();
            return;
        }
        if step_first < self.flushed_below {
            self.marks.push_back(StepMark {
                first_generation: step_first,
                step,
                started,
            });
            if self.marks.len() > MAX_MARKS {
                self.marks.remove(1);
            }
        }
        if let Some(now) = now {
            // Steps that ended before any flush said the time count from
            // the first one that does (only ever a prefix of the marks).
            for mark in self
                .marks
                .iter_mut()
                .take_while(|mark| mark.started.is_none())
            {
                mark.started = Some(now);
            }
        }
        let mut passed = false;
        while let Some(&mark) = self.marks.front() {
            if !self.budget_ran_out(mark, now) {
                break;
            }
            self.marks.pop_front();
            passed = true;
        }
        if passed {
            // Every key of the steps that remain is newer; everything older
            // was submitted before `flushed_below`.
            self.overdue_below = self
                .marks
                .front()
                .map_or(self.flushed_below, |mark| mark.first_generation);
        }
    }

    fn budget_ran_out(&self, mark: StepMark, now: Option<Instant>) -> bool {
        // guard: L13-budget-in-steps
        let by_steps = self
            .limits
            .pending_steps
            .is_some_and(|budget| self.steps - mark.step >= budget);
        // guard: L13-budget-in-time
        let by_time = match (self.limits.pending_time, mark.started, now) {
            (Some(budget), Some(started), Some(now)) => {
                now.saturating_duration_since(started) >= budget
            }
            _ => false,
        };
        by_steps || by_time
    }

    /// Gives each group of a submission its interest, shared with the
    /// table under the group's number (which its keys' entries carry).
    pub(super) fn hand_out_interest(&mut self, groups: &mut [Group<K, R>]) {
        for group in groups {
            let interest = Arc::new(Interest::new(group.len()));
            self.interest_of.insert(group.number, interest.clone());
            group.interest = Some(interest);
        }
    }

    /// A group of `keys` keys was answered: its room is free again.
    pub(super) fn settle_outstanding(&mut self, keys: usize) {
        if self.outstanding_groups == 0 || self.outstanding_keys < keys {
            // Every result comes from a group this table handed out, once;
            // only a result built by hand gets here (its keys are then
            // checked one by one, as any result's).
            tracing::error!("a group result was applied that was never handed out");
        }
        // guard: L14-answers-free-their-room
        self.outstanding_groups = self.outstanding_groups.saturating_sub(1);
        self.outstanding_keys = self.outstanding_keys.saturating_sub(keys);
    }

    /// `request` (in `slot`) asks for `key`, whose state has no requester
    /// left: an orphaned probe. It is joined if its group is still wanted;
    /// a probe given up or past its budget is not shared, and the key gets
    /// a fresh state instead (`None` when admission has no room for it).
    #[inline(never)]
    pub(super) fn rejoin(
        &mut self,
        hash: u64,
        cell: u32,
        key: &K,
        request: &R,
        slot: u32,
    ) -> Option<Entry> {
        let entry = self.keys.entry_mut(cell);
        let overdue = entry.phase(self.flushed_below, self.overdue_below) == Phase::Overdue;
        // guard: L15-joining-an-orphan-wants-it-again
        let wanted = !overdue
            && self
                .interest_of
                .get(&entry.group)
                .is_none_or(|interest| interest.gain());
        if wanted {
            self.overflow.add(entry, slot);
            let entry = *entry;
            let record = &mut self.slots[slot as usize];
            record.keys.push(cell);
            record.cursor = record.keys.len();
            return Some(entry);
        }
        // Its answer, if one comes, is stale from now on.
        self.keys.remove(hash, cell);
        self.insert_new(hash, key, request, slot)
    }
}
