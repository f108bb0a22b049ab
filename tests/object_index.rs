//! kvtier's own `ObjectTier` budgeted by the fleet's books on a real Valkey
//! (tests/common/valkey.rs; skipped with the reason without one), two
//! tiers standing for two processes on one in-memory store: one budget at
//! every store whichever tier writes, one tier's stores the other's hits
//! in one round trip, an evicted block absent, the figures from the books,
//! and bad set-ups refused.
#![cfg(all(feature = "fleet", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::valkey::{ValkeyServer, books_runtime};
use futures_util::StreamExt;
use kvtier::lookup::AsyncBackend;
use kvtier::settings::{BudgetConfig, IndexConfig};
use kvtier::{ObjectTier, TierError};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const PAYLOAD: usize = 1000;
/// A block's bytes in the store: the payload and kvtier's 16-byte header.
const BLOCK: u64 = PAYLOAD as u64 + 16;

fn index(server: &ValkeyServer) -> IndexConfig {
    IndexConfig::new(&server.url)
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap()
}

async fn tier(store: &Arc<InMemory>, server: &ValkeyServer) -> ObjectTier {
    let store: Arc<dyn ObjectStore> = store.clone();
    ObjectTier::new(store, "fleet")
        .unwrap()
        .with_index(BudgetConfig::new(3 * BLOCK).unwrap(), index(server))
        .await
        .unwrap()
}

async fn objects(store: &InMemory) -> usize {
    store.list(None).count().await
}

#[test]
fn two_tiers_share_one_budget_and_the_books_answer_their_lookups() {
    let Some(valkey) = ValkeyServer::start("two_tiers_share_one_budget") else {
        return;
    };
    books_runtime().block_on(shared(&valkey));
}

async fn shared(valkey: &ValkeyServer) {
    let store = Arc::new(InMemory::new());
    let (a, b) = (tier(&store, valkey).await, tier(&store, valkey).await);
    for n in 0u64..5 {
        let writer = if n % 2 == 0 { &a } else { &b };
        writer.store(&n, vec![n as u8; PAYLOAD]).await.unwrap();
        assert!(objects(&store).await <= 3, "after store {n}");
    }
    // The least recent across both tiers (0 and 1) were evicted; each
    // tier's lookups are answered by the same books, whoever wrote.
    let verdicts = AsyncBackend::<u64, ()>::batch_lookup(&b, &[0, 1, 2, 3, 4], &())
        .await
        .unwrap();
    assert_eq!(verdicts, [false, false, true, true, true]);
    assert_eq!(b.load(&4u64).await.unwrap(), Some(vec![4u8; PAYLOAD]));
    assert_eq!(a.load(&0u64).await.unwrap(), None, "evicted");
    // Stored again while committed: nothing written, nothing evicted.
    a.store(&4u64, vec![4u8; PAYLOAD]).await.unwrap();
    assert_eq!(objects(&store).await, 3);
    // The figures are the last upkeep's: one now.
    a.keep_up_books(Duration::from_secs(600)).await.unwrap();
    let stats = a.capacity_stats().unwrap();
    assert_eq!(
        (stats.resident_bytes, stats.capacity_bytes),
        (3 * BLOCK, 3 * BLOCK)
    );
}

#[test]
fn bad_set_ups_are_refused() {
    let Some(valkey) = ValkeyServer::start("bad_set_ups_are_refused") else {
        return;
    };
    books_runtime().block_on(refused(&valkey));
}

async fn refused(valkey: &ValkeyServer) {
    let budget = || BudgetConfig::new(3 * BLOCK).unwrap();
    let unreachable = IndexConfig::new("redis://127.0.0.1:9/").unwrap();
    let refused = ObjectTier::memory("fleet")
        .unwrap()
        .with_index(budget(), unreachable)
        .await;
    assert!(
        matches!(refused, Err(TierError::Index { .. })),
        "{refused:?}"
    );
    let twice = ObjectTier::memory("fleet")
        .unwrap()
        .with_budget(budget())
        .await
        .unwrap()
        .with_index(budget(), index(valkey))
        .await;
    assert!(matches!(twice, Err(TierError::Config(_))), "{twice:?}");
    // Without a runtime to keep the books up on: refused, not unbounded.
    let outside = std::thread::spawn(move || {
        futures_util::FutureExt::now_or_never(
            ObjectTier::memory("fleet")
                .unwrap()
                .with_index(budget(), IndexConfig::new("redis://127.0.0.1:9/").unwrap()),
        )
    })
    .join()
    .unwrap();
    assert!(
        matches!(outside, Some(Err(TierError::Config(_)))),
        "{outside:?}"
    );
}
