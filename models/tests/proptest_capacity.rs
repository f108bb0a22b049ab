//! proptest: random operation sequences on the real capacity ledger (LRU
//! and S3-FIFO) compared with the specification after every operation
//! (`kvtier_models::capacity_reference`): admissions, victims, the budget,
//! each token released once, every counter, and reconciles with listings
//! begun and ended among the other operations. A failure shrinks to a minimal
//! sequence.
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_capacity`;
//! more cases: `PROPTEST_CASES=100000`.

use kvtier::capacity::Policy;
use kvtier_models::capacity_lockstep::CapacityLockstep;
use kvtier_models::capacity_reference::CapacityOp;
use proptest::prelude::*;

const KEYS: u8 = 12;

fn op() -> impl Strategy<Value = CapacityOp> {
    prop_oneof![
        6 => (0..KEYS, 1..=60u8).prop_map(|(key, bytes)| CapacityOp::Reserve { key, bytes }),
        4 => any::<u8>().prop_map(|pick| CapacityOp::Commit { pick }),
        1 => any::<u8>().prop_map(|pick| CapacityOp::Abort { pick }),
        3 => (0..KEYS).prop_map(|key| CapacityOp::Pin { key }),
        3 => any::<u8>().prop_map(|pick| CapacityOp::Unpin { pick }),
        4 => any::<u8>().prop_map(|pick| CapacityOp::Evicted { pick }),
        1 => any::<u8>().prop_map(|pick| CapacityOp::EvictionFailed { pick }),
        1 => (0..KEYS).prop_map(|key| CapacityOp::Lose { key }),
        1 => (40..=260u16).prop_map(|capacity| CapacityOp::SetCapacity { capacity }),
        1 => Just(CapacityOp::BeginListing),
        1 => (any::<u8>(), 0..(1u16 << KEYS)).prop_map(|(pick, listed)| CapacityOp::Reconcile { pick, listed }),
        1 => any::<u8>().prop_map(|pick| CapacityOp::AbandonListing { pick }),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::Lru), Just(Policy::S3Fifo)]
}

proptest! {
    #[test]
    fn the_ledger_agrees_with_the_specification(
        policy in policy(),
        capacity in 40..=260u64,
        seeds in prop::collection::vec((0..KEYS, 1..=60u8), 0..8),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut both = CapacityLockstep::new(capacity, policy, &seeds);
        for op in &ops {
            both.apply(op);
        }
        both.finish();
    }
}
