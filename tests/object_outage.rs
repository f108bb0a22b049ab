//! An object tier under a budget while its store does not answer: a store
//! that needs room fails without reordering the blocks' recency, so once
//! the store is back the oldest block is evicted, as before the outage.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::{ObjectTier, TierError};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// 84 bytes of payload: 100 bytes with the block header.
const BLOCK: u64 = 100;

/// An in-memory store that answers every request with a connection error
/// while `down` is set, as a stopped server does.
#[derive(Debug, Default)]
struct Outage {
    inner: InMemory,
    down: AtomicBool,
}

impl Outage {
    fn check(&self) -> object_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "Outage",
                source: "connection refused".into(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Outage")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Outage {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check()?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check()?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        if self.down.load(Ordering::SeqCst) {
            return locations
                .map(|_| {
                    Err(object_store::Error::Generic {
                        store: "Outage",
                        source: "connection refused".into(),
                    })
                })
                .boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.check()?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy_opts(from, to, options).await
    }
}

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
        outage.down.store(true, Ordering::SeqCst);
        // Needs room: the oldest block (0) is chosen, cannot be deleted,
        // and the store fails (at once: no further victim is tried).
        for _ in 0..2 {
            let failed = tier.store(&3u64, vec![3; 84]).await;
            assert!(matches!(failed, Err(TierError::Store { .. })), "{failed:?}");
        }
        let stats = tier.capacity_stats().unwrap();
        assert_eq!((stats.resident_bytes, stats.evictions), (3 * BLOCK, 0));
        assert_eq!(stats.eviction_failures, 2, "one victim tried per store");
        outage.down.store(false, Ordering::SeqCst);
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
