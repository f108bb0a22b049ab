//! What travels between the table and whoever probes the tier: a step's
//! [`Submission`] of request [`Group`]s out, one [`GroupResult`] per group back.

use super::types::{Generation, TableId};
use std::future::Future;
use std::task::{Context, Poll, Waker};

use crate::sync::{Arc, Mutex};

/// The new keys of one step, grouped by request in order of first appearance.
///
/// Produced by [`LookupTable::take_submission`](super::LookupTable::take_submission)
/// (and handed to a [`Prober`](super::Prober) by [`Lookup::flush`](super::Lookup::flush));
/// never empty. Probe each group once and hand its result back, in any
/// order: with [`LookupTable::apply`](super::LookupTable::apply), or through
/// a prober's [`Publisher`](super::Publisher).
#[derive(Debug)]
pub struct Submission<K, R> {
    pub(crate) groups: Vec<Group<K, R>>,
}

impl<K, R> Submission<K, R> {
    /// The groups, in first-appearance order of their requests.
    pub fn groups(&self) -> &[Group<K, R>] {
        &self.groups
    }

    /// Takes the groups out, in first-appearance order of their requests.
    pub fn into_groups(self) -> Vec<Group<K, R>> {
        self.groups
    }

    /// Keys in the submission, over all groups.
    pub fn key_count(&self) -> usize {
        self.groups.iter().map(Group::len).sum()
    }
}

/// The keys one request asked for first in a step, each with the generation
/// of the state it was submitted for.
#[derive(Debug)]
pub struct Group<K, R> {
    pub(crate) table: TableId,
    pub(crate) seq: u64,
    /// The table's name for the group while it is out (see
    /// `LookupTable::interest_of`); carried back by the result.
    pub(crate) number: u32,
    pub(crate) request: R,
    pub(crate) keys: Vec<K>,
    pub(crate) generations: Vec<Generation>,
    /// Shared with the table while the group is out, when the table skips
    /// unwanted groups (see [`Group::claim`]).
    pub(crate) interest: Option<Arc<Interest>>,
    /// Room for the answers, recycled by the table (see
    /// [`found_buffer`](Self::found_buffer)).
    pub(crate) found: Vec<bool>,
}

impl<K, R> Group<K, R> {
    #[cfg(test)]
    pub(crate) fn new(table: TableId, request: R, number: u32) -> Self {
        Self::with_buffers(table, request, number, GroupBuffers::default())
    }

    /// A group whose vectors reuse `buffers`' allocations (all empty).
    pub(crate) fn with_buffers(
        table: TableId,
        request: R,
        number: u32,
        buffers: GroupBuffers<K>,
    ) -> Self {
        Self {
            table,
            seq: 0,
            number,
            request,
            keys: buffers.keys,
            generations: buffers.generations,
            interest: None,
            found: buffers.found,
        }
    }

    /// An empty vector with room for one answer per key, for a prober to
    /// collect the answers in (it reuses an earlier group's allocation when
    /// the table kept one).
    pub(crate) fn found_buffer(&mut self) -> Vec<bool> {
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        found.reserve(self.keys.len());
        found
    }

    /// Decides, just before the backend call, whether to probe the group.
    /// `true`: probe it. `false`: every key of the group lost its requests
    /// since the flush (they were cleaned up and nobody asked for the keys
    /// again), so nobody wants the answers; publish
    /// [`abandoned`](Self::abandoned) instead of calling the backend. From
    /// the first `false` on, the table treats the probe as given up: a
    /// request asking for one of the keys later gets a new probe.
    ///
    /// Always `true` when the table does not skip unwanted groups (see
    /// [`LookupLimits::skip_unwanted`](super::LookupLimits::skip_unwanted)).
    pub fn claim(&self) -> bool {
        // guard: L15-prober-claims-before-probing
        self.interest
            .as_ref()
            .is_none_or(|interest| interest.claim())
    }

    /// The table that handed the group out.
    pub fn table(&self) -> TableId {
        self.table
    }

    /// The group's sequence number: groups are numbered 0, 1, 2, ... in the
    /// order the table handed them out, over all submissions (so the `n`-th
    /// group ever submitted has `seq() == n`). Results carry it back, which
    /// lets logs and checkers tell groups apart when they finish out of order.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The request whose lookups created these keys' states, passed to the
    /// backend as context.
    pub fn request(&self) -> &R {
        &self.request
    }

    /// The keys to probe.
    pub fn keys(&self) -> &[K] {
        &self.keys
    }

    /// Number of keys in the group.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Never true for a group in a submission; present for completeness.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The result for a group the backend answered: one answer per key, in
    /// key order. Fewer answers than keys make the rest misses (and are
    /// counted as a short result); answers beyond the keys are ignored (and
    /// counted). At most `len() + 1` answers are pulled from the iterator.
    pub fn answered(mut self, answers: impl IntoIterator<Item = bool>) -> GroupResult<K> {
        let mut found = self.found_buffer();
        let surplus = collect_answers(answers, self.len(), &mut found);
        let outcome = GroupOutcome::of_answers(found.len(), self.len(), surplus);
        self.finish(found, outcome)
    }

    /// The result for a group whose backend call failed: every key is a
    /// miss (counted in [`LookupStats::backend_errors`](super::LookupStats::backend_errors)).
    pub fn failed(self) -> GroupResult<K> {
        self.finish(Vec::new(), GroupOutcome::BackendError)
    }

    /// The result for a group whose backend call panicked after giving
    /// `answers` (pulled up to `len()`): unanswered keys are misses (counted
    /// in [`LookupStats::backend_panics`](super::LookupStats::backend_panics)).
    pub fn panicked(mut self, answers: impl IntoIterator<Item = bool>) -> GroupResult<K> {
        let mut found = self.found_buffer();
        found.extend(answers.into_iter().take(self.len()));
        let answered = found.len();
        self.finish(found, GroupOutcome::BackendPanic { answered })
    }

    /// The result for a group whose backend call did not finish within the
    /// prober's time bound: every key is a miss (counted in
    /// [`LookupStats::timeouts`](super::LookupStats::timeouts)).
    pub fn timed_out(self) -> GroupResult<K> {
        self.finish(Vec::new(), GroupOutcome::TimedOut)
    }

    /// The result for a group that will never be probed (the prober is
    /// shutting down, its executor went away): every key is a miss (counted
    /// in [`LookupStats::cancelled`](super::LookupStats::cancelled)).
    pub fn cancelled(self) -> GroupResult<K> {
        self.finish(Vec::new(), GroupOutcome::Cancelled)
    }

    /// Ready once nobody wants the group's answers any more (as
    /// [`claim`](Self::claim) would say), which gives the probe up for good;
    /// pending for ever when the table does not skip unwanted groups. For a
    /// prober that can drop a running probe: race the backend call against
    /// this and publish [`abandoned`](Self::abandoned) if this wins.
    #[cfg_attr(not(tokio_driver), allow(dead_code))]
    pub(crate) fn unwanted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| match &self.interest {
            Some(interest) => interest.poll_unwanted(cx),
            None => Poll::Pending,
        })
    }

    /// The result for a group [`claim`](Self::claim) said nobody wants: not
    /// probed, every key is a miss (counted in
    /// [`LookupStats::abandoned`](super::LookupStats::abandoned)).
    pub fn abandoned(self) -> GroupResult<K> {
        self.finish(Vec::new(), GroupOutcome::Abandoned)
    }

    /// The result with the given answers and outcome; missing answers are
    /// misses, surplus ones are dropped.
    pub(crate) fn finish(mut self, mut found: Vec<bool>, outcome: GroupOutcome) -> GroupResult<K> {
        if found.capacity() == 0 {
            found = self.found_buffer();
        }
        // Every key gets exactly one answer: a key left without one would
        // stay in flight forever (the reference's `zip` defect).
        // guard: L6-one-answer-per-key
        found.resize(self.keys.len(), false);
        GroupResult {
            table: self.table,
            seq: self.seq,
            number: self.number,
            keys: self.keys,
            generations: self.generations,
            found,
            outcome,
        }
    }
}

/// The allocations of a group's vectors, kept by the table from an applied
/// result for a later group.
pub(crate) struct GroupBuffers<K> {
    pub(crate) keys: Vec<K>,
    pub(crate) generations: Vec<Generation>,
    pub(crate) found: Vec<bool>,
}

impl<K> Default for GroupBuffers<K> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            generations: Vec::new(),
            found: Vec::new(),
        }
    }
}

/// Pulls at most `limit` answers into `found`; returns whether the iterator
/// had more than `limit`. Bounded so an endless backend iterator cannot hang
/// the worker.
pub(crate) fn collect_answers(
    answers: impl IntoIterator<Item = bool>,
    limit: usize,
    found: &mut Vec<bool>,
) -> bool {
    let mut answers = answers.into_iter();
    while found.len() < limit {
        match answers.next() {
            Some(answer) => found.push(answer),
            None => return false,
        }
    }
    answers.next().is_some()
}

/// How the backend dealt with a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupOutcome {
    /// One answer per key.
    Answered,
    /// Fewer answers than keys; the rest are misses.
    Short {
        /// Answers received.
        answered: usize,
    },
    /// More answers than keys; the surplus was ignored.
    Surplus,
    /// The backend returned an error; every key is a miss.
    BackendError,
    /// The backend panicked, in the call or while its answers were consumed;
    /// unanswered keys are misses.
    BackendPanic {
        /// Answers received before the panic.
        answered: usize,
    },
    /// The backend did not answer within the driver's per-group timeout;
    /// every key is a miss.
    TimedOut,
    /// The group was never answered because the driver shut down (or its
    /// runtime went away) first; every key is a miss.
    Cancelled,
    /// The group was not probed, or its running probe was dropped, because
    /// nobody wanted its answers any more (see [`Group::claim`]); every key
    /// is a miss.
    Abandoned,
}

impl GroupOutcome {
    /// The outcome of a call that returned answers: `answered` of `keys`
    /// received, and whether there were more.
    pub(crate) fn of_answers(answered: usize, keys: usize, surplus: bool) -> Self {
        if answered < keys {
            Self::Short { answered }
        } else if surplus {
            Self::Surplus
        } else {
            Self::Answered
        }
    }
}

/// The answers for one group, ready to be applied to the table.
///
/// Always holds exactly one answer per key (faults are already converted to
/// misses); each key carries the generation it was submitted with, so the
/// table can drop answers for states that were cleaned up or recreated since.
#[derive(Debug)]
pub struct GroupResult<K> {
    pub(crate) table: TableId,
    pub(crate) seq: u64,
    pub(crate) number: u32,
    pub(crate) keys: Vec<K>,
    pub(crate) generations: Vec<Generation>,
    pub(crate) found: Vec<bool>,
    pub(crate) outcome: GroupOutcome,
}

impl<K> GroupResult<K> {
    /// The table whose group this answers; [`LookupTable::apply`](crate::lookup::LookupTable::apply)
    /// refuses a result of another table.
    pub fn table(&self) -> TableId {
        self.table
    }

    /// The sequence number of the group this answers (see [`Group::seq`]).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// How the backend dealt with the group.
    pub fn outcome(&self) -> GroupOutcome {
        self.outcome
    }

    /// `(key, generation, found)` for every key of the group, in key order.
    pub fn entries(&self) -> impl Iterator<Item = (&K, Generation, bool)> {
        self.keys
            .iter()
            .zip(&self.generations)
            .zip(&self.found)
            .map(|((key, generation), found)| (key, *generation, *found))
    }
}

/// Whether anyone still wants a group's answers: how many of its keys have a
/// live requester, or given up once a prober gave the probe up. The table
/// counts down and up as requests leave and join the keys; a prober gives
/// up only at zero, so a key joined in the same instant either keeps the
/// probe (the join came first) or learns that it was given up (the give-up
/// came first) and gets a new one. A lock, not an atomic: it is taken only
/// when a key loses or regains its last requester and once or twice per
/// group by the prober, never on the lookup path, and one lock is the
/// simplest thing that makes "check zero, then give up" a single step for
/// the model checkers too.
#[derive(Debug)]
pub(crate) struct Interest {
    wanted: Mutex<Wanted>,
}

#[derive(Debug)]
struct Wanted {
    /// Keys with a requester; [`ABANDONED`] once given up.
    keys: u32,
    /// A running probe to wake when the count reaches zero (see
    /// [`Interest::poll_unwanted`]).
    waker: Option<Waker>,
}

/// [`Wanted::keys`] of a probe a prober gave up.
const ABANDONED: u32 = u32::MAX;

impl Interest {
    /// Interest in a group of `keys` keys, all of them wanted.
    pub(crate) fn new(keys: usize) -> Self {
        debug_assert!(keys < ABANDONED as usize);
        Self {
            wanted: Mutex::new(Wanted {
                keys: keys as u32,
                waker: None,
            }),
        }
    }

    /// The prober's side: true to probe; false when nobody wants the
    /// answers, which gives the probe up for good.
    fn claim(&self) -> bool {
        let mut wanted = self.wanted.lock();
        // guard: L15-claim-gives-up-only-at-zero
        match wanted.keys {
            0 => {
                wanted.keys = ABANDONED;
                false
            }
            ABANDONED => false,
            _ => true,
        }
    }

    /// The prober's side while the probe runs: ready (and given up for
    /// good) once nobody wants the answers; until then the task is woken
    /// when the count reaches zero.
    fn poll_unwanted(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut wanted = self.wanted.lock();
        // guard: L15-a-running-probe-is-given-up-only-at-zero
        match wanted.keys {
            0 | ABANDONED => {
                wanted.keys = ABANDONED;
                Poll::Ready(())
            }
            _ => {
                wanted.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The table's side: one of the keys lost its last requester.
    pub(crate) fn lose(&self) {
        let mut wanted = self.wanted.lock();
        // Never below zero, never out of ABANDONED.
        if wanted.keys != 0 && wanted.keys != ABANDONED {
            wanted.keys -= 1;
            if wanted.keys == 0
                && let Some(waker) = wanted.waker.take()
            {
                drop(wanted);
                // guard: L15-the-last-loss-wakes-the-running-probe
                waker.wake();
            }
        }
    }

    /// The table's side: one of the keys has a requester again. False when
    /// the probe was given up first: the key needs a new one.
    pub(crate) fn gain(&self) -> bool {
        let mut wanted = self.wanted.lock();
        if wanted.keys == ABANDONED {
            return false;
        }
        wanted.keys += 1;
        true
    }

    /// The counter as it stands (`None` once given up), for the self-check.
    pub(crate) fn wanted(&self) -> Option<u32> {
        let keys = self.wanted.lock().keys;
        (keys != ABANDONED).then_some(keys)
    }
}
