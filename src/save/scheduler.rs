//! The scheduler-side half: which finished requests delay their free.

use hashbrown::{DefaultHashBuilder, HashSet, HashTable};
use std::fmt::Debug;
use std::hash::BuildHasher;
use std::hash::Hash;

/// The saving requests of one step, as the scheduler recorded them: the
/// metadata it ships to every worker.
///
/// Only [`SaveScheduler::record_step`] makes one, and the workers record
/// exactly its requests ([`SaveTracker::begin_step`](crate::SaveTracker::begin_step)),
/// so the scheduler's set and each worker's set are built from one value and
/// cannot disagree (S6): a code path that builds a step's metadata without
/// recording it on the scheduler side has no way to produce a `SaveStep`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveStep<R> {
    step: u64,
    requests: Vec<R>,
}

impl<R> SaveStep<R> {
    /// The step's number (0 for a scheduler's first step).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The requests that save blocks this step, in the order given.
    pub fn requests(&self) -> &[R] {
        &self.requests
    }

    /// Whether nobody saves this step.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

/// Counters of the scheduler side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerSaveStats {
    /// Steps recorded.
    pub steps: u64,
    /// Requests that started delaying their free.
    pub recorded: u64,
    /// `request_finished` calls answered true (free delayed).
    pub delayed: u64,
    /// `request_finished` calls answered false.
    pub freed_at_once: u64,
}

/// The scheduler's half of deferred save completion: remembers every request
/// that saved blocks in some step and answers, when it finishes, whether its
/// free must wait for the workers' report.
///
/// ```
/// use kvtier::SaveScheduler;
///
/// let mut scheduler = SaveScheduler::new();
/// let step = scheduler.record_step([("a", 3), ("b", 0)]);
/// assert_eq!(step.requests(), &["a"]);
///
/// assert!(scheduler.request_finished(&"a")); // delay: "a" has a save in flight
/// assert!(!scheduler.request_finished(&"a")); // answered once, then forgotten
/// assert!(!scheduler.request_finished(&"b")); // never saved: free at once
/// ```
#[derive(Debug)]
pub struct SaveScheduler<R> {
    next_step: u64,
    delayed: HashSet<R>,
    stats: SchedulerSaveStats,
}

impl<R: Eq + Hash + Clone + Debug> Default for SaveScheduler<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: Eq + Hash + Clone + Debug> SaveScheduler<R> {
    /// An empty scheduler side.
    pub fn new() -> Self {
        Self {
            next_step: 0,
            delayed: HashSet::new(),
            stats: SchedulerSaveStats::default(),
        }
    }

    /// Records, while the step's metadata is built, every request with a
    /// non-empty save range (`(request, blocks to save)` pairs; zero-length
    /// ranges are skipped) and returns the step's [`SaveStep`] for the
    /// workers. A request listed twice is recorded once.
    pub fn record_step(&mut self, saves: impl IntoIterator<Item = (R, usize)>) -> SaveStep<R> {
        let step = self.next_step;
        self.next_step += 1;
        self.stats.steps += 1;
        let mut requests: Vec<R> = Vec::new();
        // This step's requests, indexed by position in `requests` (no copy
        // of an id): a duplicate is found in O(1), however long the step.
        let hasher = DefaultHashBuilder::default();
        let mut listed: HashTable<usize> = HashTable::new();
        for (request, blocks) in saves {
            if blocks == 0 {
                continue;
            }
            let hash = hasher.hash_one(&request);
            // guard: S11-record-step-dedupes-by-hash
            if listed.find(hash, |&i| requests[i] == request).is_some() {
                continue;
            }
            listed.insert_unique(hash, requests.len(), |&i| hasher.hash_one(&requests[i]));
            if self.delayed.insert(request.clone()) {
                self.stats.recorded += 1;
            }
            requests.push(request);
        }
        SaveStep { step, requests }
    }

    /// Called once when `request` finishes: true means "do not free its
    /// blocks until every worker reported it", exactly for requests a step
    /// recorded. The request is forgotten either way. Preemption does not go
    /// through here: a preempted request stays recorded.
    pub fn request_finished(&mut self, request: &R) -> bool {
        // guard: S3-scheduler-forgets
        let delay = self.delayed.remove(request);
        if delay {
            self.stats.delayed += 1;
        } else {
            self.stats.freed_at_once += 1;
        }
        delay
    }

    /// Whether `request` would delay its free if it finished now.
    pub fn is_delayed(&self, request: &R) -> bool {
        self.delayed.contains(request)
    }

    /// How many requests would delay their free.
    pub fn delayed_count(&self) -> usize {
        self.delayed.len()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SchedulerSaveStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_numbered_and_know_when_nobody_saves() {
        let mut scheduler = SaveScheduler::new();
        let first = scheduler.record_step([("a", 0)]);
        let second = scheduler.record_step([("a", 1), ("a", 2)]);
        assert_eq!((first.step(), first.is_empty()), (0, true));
        assert_eq!((second.step(), second.is_empty()), (1, false));
        assert_eq!(second.requests(), &["a"]);
    }

    #[test]
    fn the_counters_follow_every_answer() {
        let mut scheduler = SaveScheduler::new();
        scheduler.record_step([(1u64, 1), (2, 1), (3, 0)]);
        scheduler.record_step([(1, 1)]);
        assert!(scheduler.request_finished(&1));
        assert!(!scheduler.request_finished(&1));
        assert!(!scheduler.request_finished(&3));
        let stats = scheduler.stats();
        assert_eq!(
            (
                stats.steps,
                stats.recorded,
                stats.delayed,
                stats.freed_at_once
            ),
            (2, 2, 1, 2)
        );
        assert_eq!(scheduler.delayed_count(), 1);
    }
}
