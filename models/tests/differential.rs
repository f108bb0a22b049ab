//! The real table and the specification, driven by the same pseudo-random
//! operation sequences and compared after every operation (see
//! [`Lockstep`]).
//!
//! Seeded and deterministic: a failure prints the seed and the operation
//! index, and `KVTIER_DIFF_SEED=<seed>` replays that one sequence. The
//! proptest state machine (tests/proptest_lookup.rs) covers the same ground
//! with shrinking; this test adds volume and long sequences.

use kvtier_models::lockstep::{Lockstep, TableOp};

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
/// complete, sometimes short or long), cleanups and failed loads.
fn next_op(rng: &mut Rng, run: &Lockstep) -> TableOp {
    match rng.below(100) {
        0..=44 => TableOp::Lookup {
            key: rng.byte(),
            req: rng.byte(),
        },
        45..=59 => TableOp::Flush,
        60..=74 if run.unanswered() > 0 => {
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
        75..=82 if run.tickets() > 0 => TableOp::MarkMiss { ticket: rng.byte() },
        83..=86 => TableOp::MarkMissKeys {
            keys: (0..rng.below(3) + 1).map(|_| rng.byte()).collect(),
        },
        _ => TableOp::Cleanup { req: rng.byte() },
    }
}

fn run(seed: u64, ops: usize, keys: u64, requests: u64) {
    let mut rng = Rng(seed);
    let mut run = Lockstep::new(keys, requests);
    let mut trace = Vec::new();
    for i in 0..ops {
        let op = next_op(&mut rng, &run);
        if let Err(error) = run.apply(&op) {
            panic!(
                "seed {seed}, operation {i} ({op:?}): {error}\nreplay with KVTIER_DIFF_SEED={seed}\ntrace: {trace:#?}"
            );
        }
        trace.push(op);
    }
    if let Err(error) = run.finish() {
        panic!("seed {seed}, at the end: {error}\nreplay with KVTIER_DIFF_SEED={seed}");
    }
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
