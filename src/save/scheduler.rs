//! The scheduler-side half: which finished requests delay their free.

use hashbrown::{DefaultHashBuilder, HashSet, HashTable};
use std::fmt::Debug;
use std::hash::BuildHasher;
use std::hash::Hash;

/// One step's save metadata, as the scheduler recorded it: what it ships to
/// every worker.
///
/// It carries the step's sequence number, the requests that save blocks in
/// it, the requests preempted since the previous step (the workers' fence)
/// and the delayed requests that finished since the previous step (what the
/// workers report once their saves are done).
///
/// Only [`SaveScheduler::record_step`] makes one — or the wire decoder
/// ([`SaveStep::decode`]), from bytes a scheduler encoded — and the workers
/// record exactly its requests ([`SaveTracker::begin_step`](crate::SaveTracker::begin_step)),
/// so the scheduler's set and each worker's set are built from one value and
/// cannot disagree (S6): a code path that builds a step's metadata without
/// recording it on the scheduler side has no way to produce a `SaveStep`.
/// The sequence number carries that across processes: a worker refuses a
/// step that does not follow the last one it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveStep<R> {
    pub(crate) step: u64,
    pub(crate) requests: Vec<R>,
    pub(crate) preempted: Vec<R>,
    pub(crate) finished: Vec<R>,
}

impl<R> SaveStep<R> {
    /// The step's sequence number (0 for a scheduler's first step, then one
    /// more each step).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The requests that save blocks this step, in the order given.
    pub fn requests(&self) -> &[R] {
        &self.requests
    }

    /// The requests preempted since the previous step
    /// ([`SaveScheduler::preempt`]): the worker waits for their saves before
    /// this step's forward pass may overwrite their blocks.
    pub fn preempted(&self) -> &[R] {
        &self.preempted
    }

    /// The delayed requests that finished since the previous step (those
    /// [`SaveScheduler::request_finished`] answered true for), in the order
    /// they finished: what a worker passes to
    /// [`get_finished`](crate::SaveTracker::get_finished).
    pub fn finished(&self) -> &[R] {
        &self.finished
    }

    /// Whether the step carries nothing: nobody saves, nobody was preempted,
    /// nobody finished.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.preempted.is_empty() && self.finished.is_empty()
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
///
/// // The next step tells the workers that "a" finished.
/// let next = scheduler.record_step([]);
/// assert_eq!((next.step(), next.finished()), (1, &["a"][..]));
/// ```
#[derive(Debug)]
pub struct SaveScheduler<R> {
    next_step: u64,
    delayed: HashSet<R>,
    /// Preempted since the last step was recorded: the next step carries them.
    preempted: Vec<R>,
    /// Delayed requests finished since the last step was recorded.
    finished: Vec<R>,
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
            preempted: Vec::new(),
            finished: Vec::new(),
            stats: SchedulerSaveStats::default(),
        }
    }

    /// Records, while the step's metadata is built, every request with a
    /// non-empty save range (`(request, blocks to save)` pairs; zero-length
    /// ranges are skipped) and returns the step's [`SaveStep`] for the
    /// workers, with the preemptions and delayed finishes since the last
    /// step. A request listed twice is recorded once.
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
        SaveStep {
            step,
            requests,
            preempted: std::mem::take(&mut self.preempted),
            finished: std::mem::take(&mut self.finished),
        }
    }

    /// Notes requests preempted by the scheduler (their blocks are freed at
    /// once and may be reused); the next recorded step carries them, so each
    /// worker waits for their saves before its forward pass overwrites the
    /// blocks. They stay recorded: a preempted request resumes and finishes
    /// later.
    pub fn preempt<'r>(&mut self, requests: impl IntoIterator<Item = &'r R>)
    where
        R: 'r,
    {
        self.preempted.extend(requests.into_iter().cloned());
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
            // guard: S2-step-carries-the-finish
            self.finished.push(request.clone());
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
    fn a_step_carries_the_preemptions_and_delayed_finishes_since_the_last_one() {
        let mut scheduler = SaveScheduler::new();
        scheduler.record_step([("a", 1), ("b", 1)]);
        scheduler.preempt(&["b"]);
        assert!(scheduler.request_finished(&"a"));
        assert!(!scheduler.request_finished(&"c")); // not delayed: workers need not hear of it
        let step = scheduler.record_step([("b", 1)]);
        assert_eq!(step.preempted(), &["b"]);
        assert_eq!(step.finished(), &["a"]);
        assert!(
            scheduler.is_delayed(&"b"),
            "a preempted request stays recorded"
        );
        let next = scheduler.record_step([]);
        assert!(
            next.is_empty(),
            "each preemption and finish is carried once"
        );
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
