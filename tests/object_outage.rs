//! An object tier under a budget while its store does not answer: a store
//! that needs room fails without reordering the blocks' recency, so once
//! the store is back the oldest block is evicted, as before the outage.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::sync::Arc;

use common::outage::Outage;
use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::{ObjectTier, TierError};
use object_store::ObjectStore;

/// 84 bytes of payload: 100 bytes with the block header.
const BLOCK: u64 = 100;

#[test]
fn an_outage_does_not_reorder_which_block_is_evicted_next() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let outage = Arc::new(Outage::default());
        let store: Arc<dyn ObjectStore> = outage.clone();
        let tier = ObjectTier::new(store, "ns")
            .unwrap()
            .with_budget(
                BudgetConfig::new(3 * BLOCK)
                    .unwrap()
                    .with_policy(Policy::Lru),
            )
            .await
            .unwrap();
        for key in 0u64..3 {
            tier.store(&key, vec![key as u8; 84]).await.unwrap();
        }
        outage.set_down(true);
        // Needs room: the oldest block (0) is chosen, cannot be deleted,
        // and the store fails (at once: no further victim is tried).
        for _ in 0..2 {
            let failed = tier.store(&3u64, vec![3; 84]).await;
            assert!(matches!(failed, Err(TierError::Store { .. })), "{failed:?}");
        }
        let stats = tier.capacity_stats().unwrap();
        assert_eq!((stats.resident_bytes, stats.evictions), (3 * BLOCK, 0));
        assert_eq!(stats.eviction_failures, 2, "one victim tried per store");
        outage.set_down(false);
        tier.store(&3u64, vec![3; 84]).await.unwrap();
        // Block 0 went, as it would have without the outage; 1 and 2 stay.
        assert_eq!(tier.load(&0u64).await.unwrap(), None);
        for key in 1u64..4 {
            assert_eq!(
                tier.load(&key).await.unwrap(),
                Some(vec![key as u8; 84]),
                "{key}"
            );
        }
    });
}
