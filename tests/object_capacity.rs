//! An object tier under a byte budget (`ObjectTier::with_capacity`): the
//! objects below its prefix stay within it, on memory, on local files and
//! on a real S3-compatible server on loopback; a restart lists the prefix
//! and keeps the newest blocks that fit; loads pin; an object removed or
//! damaged behind the tier's back leaves the books and is written again.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::sync::Arc;

use common::s3::{S3Server, unique_bucket};
use futures_util::StreamExt;
use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::tier::S3Options;
use kvtier::{ObjectTier, TierError};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// 84 bytes of payload: 100 bytes with the block header.
const BLOCK: u64 = 100;
const PAYLOAD: usize = 84;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A tier on `store` below "ns" with a budget of `blocks` blocks.
async fn budgeted(store: &Arc<dyn ObjectStore>, blocks: u64) -> ObjectTier {
    ObjectTier::new(store.clone(), "ns")
        .unwrap()
        .with_budget(
            BudgetConfig::new(blocks * BLOCK)
                .unwrap()
                .with_policy(Policy::Lru),
        )
        .await
        .unwrap()
}

/// The bytes of the objects below `prefix`.
async fn bytes_below(store: &dyn ObjectStore, prefix: &str) -> u64 {
    let prefix = ObjectPath::from(prefix);
    let mut listing = store.list(Some(&prefix));
    let mut total = 0;
    while let Some(meta) = listing.next().await {
        total += meta.unwrap().size;
    }
    total
}

/// Ten stores into room for three, checked after each against the objects
/// the store lists; then what is left loads and what went does not.
async fn stays_within(store: Arc<dyn ObjectStore>) {
    let tier = ObjectTier::new(store.clone(), "model/rank0")
        .unwrap()
        .with_budget(
            BudgetConfig::new(3 * BLOCK)
                .unwrap()
                .with_policy(Policy::Lru),
        )
        .await
        .unwrap();
    for key in 0u64..10 {
        tier.store(&key, vec![key as u8; 84]).await.unwrap();
        assert!(
            bytes_below(&*store, "model/rank0").await <= 3 * BLOCK,
            "after {key}"
        );
    }
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.resident_bytes, stats.evictions), (3 * BLOCK, 7));
    assert_eq!(bytes_below(&*store, "model/rank0").await, 3 * BLOCK);
    assert_eq!(tier.load(&0u64).await.unwrap(), None);
    assert_eq!(tier.load(&9u64).await.unwrap(), Some(vec![9u8; 84]));
    assert_eq!(tier.capacity_stats().unwrap().pins, 1);
    // Stored again while resident: counted once, not written again.
    tier.store(&9u64, vec![9u8; 84]).await.unwrap();
    assert_eq!(tier.capacity_stats().unwrap().already_resident, 1);
}

#[test]
fn the_objects_stay_within_the_budget_in_memory_and_on_local_files() {
    let root = tempfile::tempdir().unwrap();
    let local: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root.path()).unwrap());
    runtime().block_on(async {
        stays_within(Arc::new(InMemory::new())).await;
        stays_within(local).await;
    });
}

#[test]
fn the_objects_stay_within_the_budget_on_a_loopback_s3_server() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-budget");
    server.create_bucket(&bucket);
    let options = S3Options::new(&bucket)
        .endpoint(server.endpoint.clone())
        .allow_http(true)
        .credentials("testing", "testing")
        .region("us-east-1");
    let tier = ObjectTier::s3(&options, "model/rank0").unwrap();
    let runtime = runtime();
    runtime.block_on(async {
        let tier = tier
            .with_budget(
                BudgetConfig::new(3 * BLOCK)
                    .unwrap()
                    .with_policy(Policy::Lru),
            )
            .await
            .unwrap();
        for key in 0u64..6 {
            tier.store(&key, vec![key as u8; 84]).await.unwrap();
        }
        let stats = tier.capacity_stats().unwrap();
        assert_eq!((stats.resident_bytes, stats.evictions), (3 * BLOCK, 3));
        for key in 0u64..6 {
            assert_eq!(tier.contains(&key).await.unwrap(), key >= 3, "block {key}");
        }
        // A restart with a smaller budget lists the prefix on the server.
        let reopened = ObjectTier::s3(&options, "model/rank0")
            .unwrap()
            .with_budget(
                BudgetConfig::new(2 * BLOCK)
                    .unwrap()
                    .with_policy(Policy::Lru),
            )
            .await
            .unwrap();
        let report = reopened.scan_report().unwrap();
        assert_eq!(
            (report.blocks, report.bytes, report.trimmed),
            (2, 2 * BLOCK, 1)
        );
        let left: Vec<bool> = futures_util::future::join_all((3u64..6).map(|k| {
            let reopened = reopened.clone();
            async move { reopened.contains(&k).await.unwrap() }
        }))
        .await;
        assert_eq!(left.iter().filter(|&&here| here).count(), 2);
    });
}

#[test]
fn a_restart_keeps_the_newest_blocks_and_a_trim_lowers_the_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    runtime().block_on(async {
        let tier = ObjectTier::new(store.clone(), "ns").unwrap();
        for key in 0u64..5 {
            tier.store(&key, vec![0; 84]).await.unwrap();
            // Distinct modification times, oldest first.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let tier = budgeted(&store, 3).await;
        let report = tier.scan_report().unwrap();
        assert_eq!((report.blocks, report.trimmed), (3, 2));
        for key in 0u64..5 {
            assert_eq!(tier.contains(&key).await.unwrap(), key >= 2, "block {key}");
        }
        assert_eq!(tier.trim(BLOCK).await.unwrap(), 2);
        assert_eq!(bytes_below(&*store, "ns").await, BLOCK);
        // The other namespace's objects are not this budget's.
        let other = ObjectTier::new(store.clone(), "other").unwrap();
        other.store(&1u64, vec![0; 84]).await.unwrap();
        assert_eq!(tier.trim(BLOCK).await.unwrap(), 0);
    });
}

#[test]
fn the_scan_counts_and_deletes_only_the_layouts_blocks() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    runtime().block_on(async {
        let tier = ObjectTier::new(store.clone(), "ns").unwrap();
        tier.store(&7u64, vec![0; 84]).await.unwrap();
        // Objects whose names end in .bin, none where the layout puts one.
        let foreign = [
            "ns/photos/2024/holiday.bin",
            "ns/firmware/boot.bin",
            "ns/001/00/0000000000000007.bin",
            "ns/000/00/0000000000000007.bin/extra.bin",
            "ns/000/00/NOTHEX.bin",
        ];
        for name in foreign {
            store
                .put(&ObjectPath::from(name), PutPayload::from(vec![1u8; 100]))
                .await
                .unwrap();
        }
        assert_eq!((tier.usage().await.unwrap().blocks), 1);
        let tier = budgeted(&store, 1).await;
        assert_eq!(tier.scan_report().unwrap().blocks, 1);
        assert_eq!(tier.trim(1).await.unwrap(), 1, "the one block");
        for name in foreign {
            assert!(
                store.head(&ObjectPath::from(name)).await.is_ok(),
                "{name} deleted"
            );
        }
    });
}

#[test]
fn an_object_removed_or_damaged_behind_the_tiers_back_leaves_the_books() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    runtime().block_on(async {
        let tier = budgeted(&store, 3).await;
        tier.store(&1u64, vec![1; 84]).await.unwrap();
        tier.store(&2u64, vec![2; 84]).await.unwrap();
        // Removed: a store writes it again (the books said resident).
        store.delete(&tier.location_of(&1u64)).await.unwrap();
        tier.store(&1u64, vec![1; 84]).await.unwrap();
        assert!(tier.contains(&1u64).await.unwrap());
        // Damaged: the load refuses it, and it is deleted and off the books.
        store
            .put(
                &tier.location_of(&2u64),
                PutPayload::from_static(b"not a block"),
            )
            .await
            .unwrap();
        assert!(matches!(
            tier.load(&2u64).await,
            Err(TierError::Corrupt { .. })
        ));
        assert!(!tier.contains(&2u64).await.unwrap());
        let stats = tier.capacity_stats().unwrap();
        assert_eq!((stats.lost, stats.resident_bytes), (2, BLOCK));
    });
}

#[test]
fn a_budget_of_nothing_and_a_second_budget_are_config_errors() {
    runtime().block_on(async {
        // A budget of nothing cannot be built: the capacity is non-zero.
        let zero = BudgetConfig::new(0).unwrap_err();
        assert_eq!(zero.setting, "capacity_bytes");
        let tier = ObjectTier::memory("ns")
            .unwrap()
            .with_budget(BudgetConfig::new(10).unwrap().with_policy(Policy::Lru))
            .await
            .unwrap();
        assert!(matches!(
            tier.clone()
                .with_budget(BudgetConfig::new(10).unwrap().with_policy(Policy::Lru))
                .await,
            Err(TierError::Config(_))
        ));
        assert!(matches!(
            ObjectTier::memory("ns").unwrap().trim(5).await,
            Err(TierError::Config(_))
        ));
        // A block larger than the budget: refused, nothing stored.
        let refused = tier.store(&1u64, vec![0; 84]).await;
        assert!(matches!(refused, Err(TierError::NoRoom { .. })));
        assert!(!tier.contains(&1u64).await.unwrap());
    });
}

/// An in-memory store whose puts take 20 ms: a caller can stop waiting
/// for one while it runs.
#[derive(Debug, Default)]
struct SlowPuts(InMemory);

impl std::fmt::Display for SlowPuts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlowPuts")
    }
}

#[async_trait::async_trait]
impl ObjectStore for SlowPuts {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        // The put runs on its own task, as a request already sent does.
        let (store, location) = (self.0.clone(), location.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            store.put_opts(&location, payload, opts).await
        })
        .await
        .unwrap()
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
        self.0.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
    {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[test]
fn a_store_whose_caller_stops_waiting_still_ends_with_the_books_equal_to_the_objects() {
    let store: Arc<dyn ObjectStore> = Arc::new(SlowPuts::default());
    runtime().block_on(async {
        let tier = budgeted(&store, 3).await;
        for key in 0u64..3 {
            // The caller gives up while the put runs.
            let stopped = tokio::time::timeout(
                std::time::Duration::from_millis(5),
                tier.store(&key, vec![0; 84]),
            )
            .await;
            assert!(stopped.is_err(), "the put of {key} was quicker than 5 ms");
        }
        // Every put lands in 20 ms. Waited for (up to 10 s on a loaded
        // machine): all three objects listed, nothing reserved and the books
        // counting what is listed. A store that reserves late must not end
        // the wait early, so the wait is on the listing, not on the
        // reservations alone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let stats = tier.capacity_stats().unwrap();
            let listed = bytes_below(&*store, "ns").await;
            let settled =
                listed == 3 * BLOCK && stats.reserved_bytes == 0 && stats.resident_bytes == listed;
            if settled || std::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let stats = tier.capacity_stats().unwrap();
        assert_eq!(
            bytes_below(&*store, "ns").await,
            stats.resident_bytes,
            "{stats:?}"
        );
        assert_eq!((stats.reserved_bytes, stats.committed), (0, 3), "{stats:?}");
        // A fourth store, awaited, evicts one of them.
        tier.store(&3u64, vec![0; 84]).await.unwrap();
        let stats = tier.capacity_stats().unwrap();
        assert_eq!(
            bytes_below(&*store, "ns").await,
            stats.resident_bytes,
            "{stats:?}"
        );
        assert!(stats.resident_bytes <= 3 * BLOCK);
    });
}

#[test]
fn hosts_sharing_a_prefix_stay_within_one_budget_through_reconciles() {
    runtime().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        // Two hosts, each with the whole budget of four blocks in its books.
        let (a, b) = (budgeted(&store, 4).await, budgeted(&store, 4).await);
        for key in 0u64..3 {
            a.store(&key, vec![1; PAYLOAD]).await.unwrap();
        }
        for key in 10u64..13 {
            b.store(&key, vec![2; PAYLOAD]).await.unwrap();
        }
        // Each counted only its own: six blocks where four fit.
        assert_eq!(bytes_below(&*store, "ns").await, 6 * BLOCK);
        // A's reconcile counts B's blocks and deletes its least recent.
        let report = a.reconcile().await.unwrap();
        assert_eq!((report.adopted, report.evicted), (3, 2));
        assert_eq!(bytes_below(&*store, "ns").await, 4 * BLOCK);
        // B's books come to the same four blocks: it forgets whichever of
        // its own A deleted and counts A's that are left, deleting nothing.
        let report = b.reconcile().await.unwrap();
        assert_eq!(report.evicted, 0);
        assert_eq!(report.adopted - report.forgotten, 1, "{report:?}");
        for tier in [&a, &b] {
            assert_eq!(tier.capacity_stats().unwrap().resident_bytes, 4 * BLOCK);
        }
        // An object that is not a block of the layout is neither counted
        // nor deleted.
        let foreign = ObjectPath::from("ns/abc/de/notes.txt");
        store.put(&foreign, vec![0u8; 10].into()).await.unwrap();
        let report = a.reconcile().await.unwrap();
        assert_eq!((report.adopted, report.evicted), (0, 0));
        assert!(store.head(&foreign).await.is_ok());
        // Without a budget there is nothing to reconcile.
        assert!(ObjectTier::memory("ns").unwrap().reconcile().await.is_err());
    });
}

#[test]
fn a_rescan_interval_reconciles_on_its_own_until_the_tier_is_dropped() {
    runtime().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let rescanning = BudgetConfig::new(4 * BLOCK)
            .unwrap()
            .with_rescan_interval(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        let a = ObjectTier::new(store.clone(), "ns")
            .unwrap()
            .with_budget(rescanning)
            .await
            .unwrap();
        let b = budgeted(&store, 4).await;
        for key in 0u64..6 {
            b.store(&key, vec![3; PAYLOAD]).await.unwrap();
        }
        // B kept its own books within four; now A's task finds them.
        a.store(&100u64, vec![4; PAYLOAD]).await.unwrap();
        let mut waited = 0;
        while a.capacity_stats().unwrap().reconciles == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            waited += 1;
            assert!(waited < 1000, "no reconcile ran");
        }
        assert!(bytes_below(&*store, "ns").await <= 4 * BLOCK);
        let stats = a.capacity_stats().unwrap();
        assert!(
            stats.adopted >= 4 && stats.resident_bytes <= 4 * BLOCK,
            "{stats:?}"
        );
        drop(a);
    });
}

#[test]
fn a_budgets_start_aborts_the_stale_uploads_of_its_blocks() {
    let Some(server) = S3Server::with_upload_listing() else {
        return;
    };
    let bucket = unique_bucket("object-uploads");
    server.create_bucket(&bucket);
    let options = S3Options::new(&bucket)
        .endpoint(server.endpoint.clone())
        .allow_http(true)
        .credentials("testing", "testing")
        .region("us-east-1");
    runtime().block_on(async {
        use object_store::multipart::MultipartStore;
        let s3 = server.amazon_s3(&bucket);
        let tier = ObjectTier::s3(&options, "ns").unwrap();
        // One upload of a block's name, one of another object's.
        s3.create_multipart(&tier.location_of(&7u64)).await.unwrap();
        s3.create_multipart(&ObjectPath::from("ns/notes.txt"))
            .await
            .unwrap();
        let budget = BudgetConfig::new(10 * BLOCK)
            .unwrap()
            .with_stale_temp_age(Some(std::time::Duration::ZERO))
            .unwrap();
        let tier = tier.with_budget(budget).await.unwrap();
        let left = tier
            .abort_stale_uploads(std::time::Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(left.found, 0, "the block's upload was aborted at start");
        // Off S3 there is nothing to do.
        let memory = ObjectTier::memory("ns").unwrap();
        assert_eq!(
            memory
                .abort_stale_uploads(std::time::Duration::ZERO)
                .await
                .unwrap()
                .found,
            0
        );
    });
}
