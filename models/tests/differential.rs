//! The real table and the specification, driven by the same pseudo-random
//! operation sequences and compared after every operation (see
//! [`Lockstep`]).
//!
//! Seeded and deterministic: a failure prints the seed and the operation
//! index, and `KVTIER_DIFF_SEED=<seed>` replays that one sequence. The
//! proptest state machine (tests/proptest_lookup.rs) covers the same ground
//! with shrinking; this test adds volume and long sequences.

use kvtier_models::lockstep::{Lockstep, TableOp};
use kvtier_models::reference::ModelLimits;

/// splitmix64: tiny, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// The next operation: mostly lookups, then flushes, answers (mostly
/// complete, sometimes short or long), cleanups, failed loads, and the
/// tier's own stores and evictions settling keys.
fn next_op(rng: &mut Rng, run: &Lockstep) -> TableOp {
    match rng.below(100) {
        0..=44 => TableOp::Lookup {
            key: rng.byte(),
            req: rng.byte(),
        },
        45..=52 => TableOp::Flush,
        53..=59 => TableOp::FlushAt {
            advance: rng.below(4) as u8,
        },
        60..=73 if run.unanswered() > 0 => {
            let group = rng.below(run.unanswered() as u64) as u8;
            let len = run.group_len(usize::from(group)) as u64;
            let count = if rng.below(5) == 0 {
                rng.below(len + 2)
            } else {
                len
            };
            TableOp::Answer {
                group,
                bits: rng.next() as u16,
                count: count as u8,
            }
        }
        74..=80 if run.unanswered() > 0 => TableOp::Claim { group: rng.byte() },
        81..=82 if run.tickets() > 0 => TableOp::MarkMiss { ticket: rng.byte() },
        83..=86 => TableOp::MarkMissKeys {
            keys: (0..rng.below(3) + 1).map(|_| rng.byte()).collect(),
        },
        87..=91 => TableOp::Settle {
            keys: (0..rng.below(3) + 1).map(|_| rng.byte()).collect(),
            present: rng.below(2) == 0,
        },
        _ => TableOp::Cleanup { req: rng.byte() },
    }
}

fn run(seed: u64, ops: usize, keys: u64, requests: u64) {
    run_with(seed, ops, keys, requests, ModelLimits::default());
}

/// One sequence; returns the table's final counters.
fn run_with(
    seed: u64,
    ops: usize,
    keys: u64,
    requests: u64,
    limits: ModelLimits,
) -> kvtier::lookup::LookupStats {
    let mut rng = Rng(seed);
    let mut run = Lockstep::with_limits(keys, requests, limits);
    let mut trace = Vec::new();
    for i in 0..ops {
        let op = next_op(&mut rng, &run);
        if let Err(error) = run.apply(&op) {
            panic!(
                "seed {seed}, operation {i} ({op:?}): {error}\nreplay with KVTIER_DIFF_SEED={seed} (or KVTIER_DIFF_BOUNDED_SEED for the bounded test)\ntrace: {trace:#?}"
            );
        }
        trace.push(op);
    }
    if let Err(error) = run.finish() {
        panic!("seed {seed}, at the end: {error}\nreplay with KVTIER_DIFF_SEED={seed}");
    }
    run.table().stats()
}

#[test]
fn table_agrees_with_the_specification_on_random_sequences() {
    if let Ok(seed) = std::env::var("KVTIER_DIFF_SEED") {
        run(seed.parse().expect("KVTIER_DIFF_SEED is a u64"), 300, 8, 4);
        return;
    }
    // Unoptimised builds (the plain `cargo test`) run a tenth of the
    // sequences; `cargo test --release` (as .ci/run does) runs them all.
    let scale = if cfg!(debug_assertions) { 10 } else { 1 };
    for seed in 0..2_000 / scale {
        // Few keys and requests: collisions, reuse and orphans are frequent.
        run(seed, 300, 8, 4);
    }
    for seed in 10_000..10_000 + 100 / scale {
        run(seed, 2_000, 64, 16);
    }
}

/// Bounds tight enough that every rule of them is exercised many times per
/// sequence: budgets of a few steps or ticks, room for a few keys and
/// groups, with and without unwanted groups skipped.
fn tight(seed: u64) -> ModelLimits {
    let pick = |bits: u64, n: u64| (seed >> bits) % n;
    ModelLimits {
        pending_steps: [None, Some(1), Some(2), Some(3)][pick(0, 4) as usize],
        pending_time: [None, Some(1), Some(4)][pick(2, 3) as usize],
        max_keys: 1 + pick(4, 6) as usize,
        max_groups: 1 + pick(7, 3) as usize,
        skip_unwanted: pick(9, 4) != 0,
    }
}

#[test]
fn bounded_table_agrees_with_the_specification_on_random_sequences() {
    if let Ok(seed) = std::env::var("KVTIER_DIFF_BOUNDED_SEED") {
        let seed = seed.parse().expect("KVTIER_DIFF_BOUNDED_SEED is a u64");
        run_with(seed, 300, 8, 4, tight(seed));
        return;
    }
    let scale = if cfg!(debug_assertions) { 10 } else { 1 };
    let mut seen = [0u64; 6];
    let mut count = |stats: kvtier::lookup::LookupStats| {
        let events = [
            stats.deadline_misses,
            stats.late_answers,
            stats.shed,
            stats.abandoned,
            stats.settled_hits,
            stats.settled_misses,
        ];
        for (total, n) in seen.iter_mut().zip(events) {
            *total += n;
        }
    };
    for seed in 0..2_000 / scale {
        count(run_with(seed, 300, 8, 4, tight(seed)));
    }
    for seed in 20_000..20_000 + 100 / scale {
        count(run_with(seed, 2_000, 64, 16, tight(seed)));
    }
    // The sequences reach every rule of the bounds, many times.
    assert!(
        seen.iter().all(|&n| n >= 10),
        "deadline misses, late answers, shed keys, abandoned groups, settled hits and \
         misses: {seen:?}"
    );
}
