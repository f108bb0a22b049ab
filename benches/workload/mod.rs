//! The scheduler step trace shared by `benches/hot_path.rs` and
//! `examples/step_workload.rs`, so both measure exactly the same sequence.
//!
//! 200 steps (the benches keep going past that, the trace has no end) of
//! 32 live requests × 128 keys each. The first 64 keys of every request are
//! one prefix shared by all requests; the other 64 are the request's own.
//! Every request asks for all of its keys in every step it lives, lives 4
//! steps, and is then cleaned up and replaced by a new request (8 per step:
//! the initial ages are staggered). Half the keys are present in the tier,
//! chosen by a hash of the key so every implementation can reproduce it.

#![allow(dead_code)] // each user takes the parts it needs

pub mod floor;
pub mod reference_port;

/// Steps in the reference trace.
pub const STEPS: usize = 200;
/// Requests alive in every step.
pub const LIVE: usize = 32;
/// Keys each request asks for in every step.
pub const KEYS_PER_REQUEST: usize = 128;
/// Leading keys shared by every request.
pub const SHARED_PREFIX: usize = 64;
/// Steps a request lives before it is cleaned up.
pub const LIFETIME: usize = 4;

/// SplitMix64's finaliser: spreads consecutive integers over all of `u64`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Whether the tier holds `key` (half of all keys).
pub fn present(key: u64) -> bool {
    mix(key ^ 0x5EED) & 1 == 0
}

/// The `index`-th key of `request` (the first [`SHARED_PREFIX`] are the same
/// for every request).
pub fn key_of(request: u64, index: usize) -> u64 {
    if index < SHARED_PREFIX {
        mix(index as u64)
    } else {
        mix(((request + 1) << 16) | index as u64)
    }
}

/// One step of the trace: the lookups in call order, then the requests that
/// end after it.
pub struct Step {
    /// `(key, request)` in the order the scheduler asks.
    pub lookups: Vec<(u64, u64)>,
    /// Requests cleaned up at the end of the step.
    pub finished: Vec<u64>,
}

/// The trace generator.
pub struct Trace {
    /// `(request id, steps lived)` of the live requests.
    live: Vec<(u64, usize)>,
    next_request: u64,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    /// The trace at step 0.
    pub fn new() -> Self {
        Self {
            live: (0..LIVE as u64)
                .map(|r| (r, r as usize % LIFETIME))
                .collect(),
            next_request: LIVE as u64,
        }
    }

    /// The next step (the trace never ends; the reference run takes [`STEPS`]).
    pub fn next_step(&mut self) -> Step {
        let mut lookups = Vec::with_capacity(LIVE * KEYS_PER_REQUEST);
        for &(request, _) in &self.live {
            lookups.extend((0..KEYS_PER_REQUEST).map(|i| (key_of(request, i), request)));
        }
        let mut finished = Vec::new();
        for (request, age) in &mut self.live {
            *age += 1;
            if *age == LIFETIME {
                finished.push(*request);
                *request = self.next_request;
                *age = 0;
                self.next_request += 1;
            }
        }
        Step { lookups, finished }
    }
}

/// Every group of `submission` answered by the trace's [`present`] rule,
/// as the worker would answer it.
pub fn answers(
    submission: kvtier::lookup::Submission<u64, u64>,
) -> Vec<kvtier::lookup::GroupResult<u64>> {
    submission
        .into_groups()
        .into_iter()
        .map(|group| {
            let found: Vec<bool> = group.keys().iter().map(|&k| present(k)).collect();
            group.answered(found)
        })
        .collect()
}

/// A save tracker whose step recorded requests `0..recorded`, with one
/// running `CompletionTask` for each of requests `0..outstanding`, and the
/// tasks' completers.
pub fn saving_tracker(
    outstanding: u64,
    recorded: u64,
) -> (
    kvtier::SaveTracker<u64, kvtier::save::CompletionTask>,
    Vec<kvtier::save::Completer>,
) {
    let mut scheduler = kvtier::SaveScheduler::new();
    let mut tracker = kvtier::SaveTracker::new();
    let step = scheduler.record_step((0..recorded).map(|r| (r, 1)));
    tracker.begin_step(&step).expect("steps in sequence");
    let completers = (0..outstanding)
        .map(|request| {
            let (task, completer) = kvtier::save::CompletionTask::new(());
            tracker.submit(task, &[request]);
            completer
        })
        .collect();
    (tracker, completers)
}
