//! The reference lookup design (`../shared/reference/lookup-protocol.md`)
//! ported directly to Rust, as a Rust engineer would write it first: a
//! state per key in a `HashMap` with its requesters in a `HashSet`, a
//! reverse index request -> `HashSet` of keys, the step's batch as a
//! `Vec`, `mpsc` channels to and from one worker thread that probes each
//! request's group and publishes its answers as soon as the group is done,
//! generations against stale answers, and the reference's drain flag
//! (answers are applied by the first lookup after a flush).
//!
//! Generic over the maps' hasher: `std`'s SipHash (`RandomState`) is what
//! the port would use as written; hashbrown's foldhash is the hasher
//! kvtier uses, so that variant prices the design apart from the hash.
//!
//! A baseline for the benches, not a second implementation: none of
//! kvtier's fixes are here (see the reference's known defects).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, JoinHandle};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Pending,
    InFlight,
    Resolved,
}

struct KeyState<R, S> {
    generation: u64,
    phase: Phase,
    result: Option<bool>,
    requests: HashSet<R, S>,
}

/// One submitted entry: key, request, generation.
type Entry<K, R> = (K, R, u64);
/// One group's answers: key, generation, found.
type Answers<K> = Vec<(K, u64, bool)>;

/// The reference manager: the scheduler's side, owning a worker thread.
pub struct ReferencePort<K, R, S> {
    states: HashMap<K, KeyState<R, S>, S>,
    keys_of: HashMap<R, HashSet<K, S>, S>,
    batch: Vec<Entry<K, R>>,
    next_generation: u64,
    drain_due: bool,
    submit: Option<Sender<Vec<Entry<K, R>>>>,
    results: Receiver<Answers<K>>,
    worker: Option<JoinHandle<()>>,
    /// Groups submitted, and groups the worker published (for the benches'
    /// untimed wait between steps).
    groups_submitted: u64,
    groups_published: Arc<AtomicU64>,
}

impl<K, R, S> ReferencePort<K, R, S>
where
    K: Hash + Eq + Clone + Send + 'static,
    R: Hash + Eq + Clone + Send + 'static,
    S: BuildHasher + Default + Clone,
{
    /// A manager whose worker answers each group with `backend`.
    pub fn new(backend: impl Fn(&[K], &R) -> Vec<bool> + Send + 'static) -> Self {
        let (submit, submissions) = channel::<Vec<Entry<K, R>>>();
        let (publish, results) = channel();
        let groups_published = Arc::new(AtomicU64::new(0));
        let published = groups_published.clone();
        let worker = thread::spawn(move || {
            for submission in submissions {
                // Group by request in order of first appearance.
                let mut groups: Vec<(R, Vec<K>, Vec<u64>)> = Vec::new();
                for (key, request, generation) in submission {
                    match groups.iter_mut().find(|(r, _, _)| *r == request) {
                        Some((_, keys, generations)) => {
                            keys.push(key);
                            generations.push(generation);
                        }
                        None => groups.push((request, vec![key], vec![generation])),
                    }
                }
                for (request, keys, generations) in groups {
                    let found = backend(&keys, &request);
                    let answers: Answers<K> = keys
                        .into_iter()
                        .zip(generations)
                        .zip(found)
                        .map(|((key, generation), found)| (key, generation, found))
                        .collect();
                    if publish.send(answers).is_err() {
                        return;
                    }
                    published.fetch_add(1, Ordering::Release);
                }
            }
        });
        Self {
            states: HashMap::default(),
            keys_of: HashMap::default(),
            batch: Vec::new(),
            next_generation: 0,
            drain_due: false,
            submit: Some(submit),
            results,
            worker: Some(worker),
            groups_submitted: 0,
            groups_published,
        }
    }

    /// `Some(found)` once known, `None` while pending.
    pub fn lookup(&mut self, key: &K, request: &R) -> Option<bool> {
        if self.drain_due {
            self.drain_due = false;
            self.drain();
        }
        let state = self.states.entry(key.clone()).or_insert_with(|| {
            let generation = self.next_generation;
            self.next_generation += 1;
            self.batch.push((key.clone(), request.clone(), generation));
            KeyState {
                generation,
                phase: Phase::Pending,
                result: None,
                requests: HashSet::default(),
            }
        });
        state.requests.insert(request.clone());
        let result = state.result;
        self.keys_of
            .entry(request.clone())
            .or_default()
            .insert(key.clone());
        result
    }

    /// Ends the step: submits the batch's live entries as one item.
    pub fn flush(&mut self) {
        self.drain();
        let mut submitted = Vec::new();
        for (key, request, generation) in self.batch.drain(..) {
            let Some(state) = self.states.get_mut(&key) else {
                continue;
            };
            if state.generation != generation {
                continue;
            }
            assert_eq!(state.phase, Phase::Pending);
            state.phase = Phase::InFlight;
            submitted.push((key, request, generation));
        }
        let mut requests: Vec<&R> = Vec::new();
        for (_, request, _) in &submitted {
            if !requests.contains(&request) {
                requests.push(request);
            }
        }
        self.groups_submitted += requests.len() as u64;
        if !submitted.is_empty()
            && let Some(submit) = &self.submit
        {
            submit.send(submitted).expect("worker alive");
        }
        self.drain_due = true;
    }

    /// Applies every published answer.
    pub fn drain(&mut self) {
        while let Ok(answers) = self.results.try_recv() {
            for (key, generation, found) in answers {
                let Some(state) = self.states.get_mut(&key) else {
                    continue;
                };
                if state.generation != generation {
                    continue;
                }
                if state.requests.is_empty() {
                    self.states.remove(&key);
                    continue;
                }
                assert_eq!(state.phase, Phase::InFlight, "second result");
                state.phase = Phase::Resolved;
                state.result = Some(found);
            }
        }
    }

    /// Forgets `request`.
    pub fn cleanup(&mut self, request: &R) {
        let Some(keys) = self.keys_of.remove(request) else {
            return;
        };
        for key in keys {
            let Some(state) = self.states.get_mut(&key) else {
                continue;
            };
            state.requests.remove(request);
            if state.requests.is_empty() && state.phase != Phase::InFlight {
                self.states.remove(&key);
            }
        }
    }

    /// Waits (spinning, for the benches) until the worker has published
    /// every group submitted so far.
    pub fn wait_published(&self) {
        while self.groups_published.load(Ordering::Acquire) < self.groups_submitted {
            thread::yield_now();
        }
    }

    /// Keys tracked.
    pub fn len(&self) -> usize {
        self.states.len()
    }
}

impl<K, R, S> Drop for ReferencePort<K, R, S> {
    fn drop(&mut self) {
        self.submit = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
