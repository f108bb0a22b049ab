//! The real table and the specification, driven by the same pseudo-random
//! operation sequences and compared after every operation.
//!
//! Seeded and deterministic: a failure prints the seed and the operation
//! index, and `KVTIER_DIFF_SEED=<seed>` replays that one sequence.
//! (Shrinking proptest state machines come with the verification suite.)

use kvtier::{Group, Ticket, Verdict};
use kvtier_models::conformance::{Table, check_state, check_verdict};
use kvtier_models::reference::{Key, Reference, Req};

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
}

struct Run {
    table: Table,
    spec: Reference,
    /// Submitted groups not answered yet, in any order.
    in_flight: Vec<Group<Key, Req>>,
    tickets: Vec<Ticket<Key>>,
}

impl Run {
    fn new() -> Self {
        Self {
            table: Table::new(),
            spec: Reference::new(),
            in_flight: Vec::new(),
            tickets: Vec::new(),
        }
    }

    fn lookup(&mut self, key: Key, req: Req) -> Result<(), String> {
        let real = self.table.lookup(&key, &req);
        check_verdict(&real, self.spec.lookup(key, req))?;
        if let Verdict::Hit(ticket) = real {
            self.tickets.push(ticket);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        let expected = self.spec.take_submission();
        let real: Vec<Group<Key, Req>> = self
            .table
            .take_submission()
            .map(|s| s.into_groups())
            .unwrap_or_default();
        let seen: Vec<(Req, Vec<Key>)> = real
            .iter()
            .map(|g| (*g.request(), g.keys().to_vec()))
            .collect();
        let wanted: Vec<(Req, Vec<Key>)> = expected
            .iter()
            .map(|(r, entries)| (*r, entries.iter().map(|(k, _)| *k).collect()))
            .collect();
        if seen != wanted {
            return Err(format!("submission {seen:?}, specification {wanted:?}"));
        }
        self.in_flight.extend(real);
        Ok(())
    }

    /// Answers one in-flight group; `answers` may be short (the rest miss).
    fn answer(&mut self, index: usize, answers: Vec<bool>) {
        let group = self.in_flight.swap_remove(index);
        let result = group.answered(answers);
        let entries: Vec<(Key, u64, bool)> = result
            .entries()
            .map(|(key, generation, found)| (*key, generation.get(), found))
            .collect();
        self.table.apply(result);
        for (key, generation, found) in entries {
            self.spec.apply(key, generation, found);
        }
    }

    fn step(&mut self, rng: &mut Rng, keys: u64, requests: u64) -> Result<String, String> {
        let op = rng.below(100);
        let description = match op {
            0..=44 => {
                let (key, req) = (rng.below(keys), rng.below(requests));
                self.lookup(key, req)?;
                format!("lookup({key}, {req})")
            }
            45..=59 => {
                self.flush()?;
                "flush".to_owned()
            }
            60..=74 if !self.in_flight.is_empty() => {
                let index = rng.below(self.in_flight.len() as u64) as usize;
                let len = self.in_flight[index].len();
                // Mostly complete answers, sometimes short ones.
                let answered = if rng.below(5) == 0 {
                    rng.below(len as u64 + 1) as usize
                } else {
                    len
                };
                let answers: Vec<bool> = (0..answered).map(|_| rng.below(2) == 0).collect();
                self.answer(index, answers.clone());
                format!("answer(group {index}, {answers:?})")
            }
            75..=82 if !self.tickets.is_empty() => {
                let ticket = self.tickets[rng.below(self.tickets.len() as u64) as usize].clone();
                let real = self.table.mark_miss(&ticket);
                let spec = self
                    .spec
                    .mark_miss(*ticket.key(), ticket.generation().get());
                if real != spec {
                    return Err(format!(
                        "mark_miss({ticket:?}): table {real}, specification {spec}"
                    ));
                }
                format!("mark_miss({ticket:?})")
            }
            83..=86 => {
                let batch: Vec<Key> = (0..rng.below(3) + 1).map(|_| rng.below(keys)).collect();
                let real = self.table.mark_miss_keys(&batch);
                let spec = self.spec.mark_miss_keys(&batch);
                if real != spec {
                    return Err(format!(
                        "mark_miss_keys({batch:?}): table {real}, specification {spec}"
                    ));
                }
                format!("mark_miss_keys({batch:?})")
            }
            _ => {
                let req = rng.below(requests);
                self.table.cleanup(&req);
                self.spec.cleanup(req);
                format!("cleanup({req})")
            }
        };
        check_state(&self.table, &self.spec)?;
        Ok(description)
    }

    /// Cleans every request up and answers every group: nothing may remain.
    fn finish(&mut self, requests: u64) -> Result<(), String> {
        for req in 0..requests {
            self.table.cleanup(&req);
            self.spec.cleanup(req);
        }
        while !self.in_flight.is_empty() {
            let len = self.in_flight[0].len();
            self.answer(0, vec![true; len]);
        }
        check_state(&self.table, &self.spec)?;
        if !self.table.is_empty() {
            return Err(format!("{} keys leaked", self.table.len()));
        }
        Ok(())
    }
}

fn run(seed: u64, ops: usize, keys: u64, requests: u64) {
    let mut rng = Rng(seed);
    let mut run = Run::new();
    let mut trace = Vec::new();
    for i in 0..ops {
        match run.step(&mut rng, keys, requests) {
            Ok(description) => trace.push(description),
            Err(error) => panic!(
                "seed {seed}, operation {i}: {error}\nreplay with KVTIER_DIFF_SEED={seed}\ntrace: {trace:#?}"
            ),
        }
    }
    if let Err(error) = run.finish(requests) {
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
