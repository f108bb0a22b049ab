//! The multi-turn, prefix-sharing trace the capacity figures run on
//! (benches/capacity.rs, benches/fleet_hits.rs; docs/performance.md).
//!
//! 400 conversations, each opening with one of 8 shared system prompts (8
//! blocks each) and going on for 1–8 turns of 1–4 new blocks; each turn
//! sends the whole conversation so far. Conversations are picked by a
//! skewed popularity (a few are continued often), and one request in ten
//! is a one-off document of 16–48 blocks nobody reads again (the scan).
//! Seeded: every run sees the same trace.

use kvtier::capacity::{Admission, CapacityLedger};

/// xorshift64*: a seeded generator, so every run sees the same trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A block key: the hash of its prefix (the chain of ids before it).
fn chain(parent: u64, id: u64) -> u64 {
    let mut x = parent ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x.wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// The requests of the trace, each the keys of its prompt's blocks.
pub fn trace() -> Vec<Vec<u64>> {
    let mut rng = Rng(0x5eed);
    const CONVERSATIONS: usize = 400;
    let mut conversations: Vec<(Vec<u64>, u64)> = (0..CONVERSATIONS)
        .map(|_| {
            let system = rng.below(8);
            let mut keys = Vec::new();
            let mut parent = 0;
            for b in 0..8 {
                parent = chain(parent, 1_000 + system * 8 + b);
                keys.push(parent);
            }
            (keys, 1 + rng.below(8))
        })
        .collect();
    let mut requests = Vec::new();
    let mut next_id = 1_000_000;
    let mut doc = 0;
    while conversations.iter().any(|(_, turns)| *turns > 0) {
        if rng.below(10) == 0 {
            // A one-off document.
            let mut parent = chain(0, 500_000 + doc);
            doc += 1;
            let mut keys = vec![parent];
            for _ in 0..16 + rng.below(33) {
                next_id += 1;
                parent = chain(parent, next_id);
                keys.push(parent);
            }
            requests.push(keys);
            continue;
        }
        // Skewed popularity: low indexes are picked far more often.
        let r = rng.below(1 << 20) as f64 / f64::from(1 << 20);
        let pick = ((r * r * r) * CONVERSATIONS as f64) as usize;
        let Some(index) = (pick..CONVERSATIONS)
            .chain(0..pick)
            .find(|&i| conversations[i].1 > 0)
        else {
            break;
        };
        let (keys, turns) = &mut conversations[index];
        *turns -= 1;
        for _ in 0..1 + rng.below(4) {
            next_id += 1;
            let parent = *keys.last().expect("a conversation has its system prompt");
            keys.push(chain(parent, next_id));
        }
        requests.push(keys.clone());
    }
    requests
}

/// Stores `key`'s block, deleting the victims named (nothing to delete
/// here); whether it was stored.
pub fn store(ledger: &mut CapacityLedger<u64>, key: u64, bytes: u64) -> bool {
    loop {
        match ledger.reserve(key, bytes) {
            Admission::Granted(r) => {
                ledger.commit(r).expect("reserved just now");
                return true;
            }
            Admission::Evict(victims) => {
                for v in victims {
                    ledger.evicted(v).expect("named just now");
                }
            }
            Admission::Present | Admission::Rejected(_) => return false,
        }
    }
}
