//! vLLM's transfers and lookups on an object store (S3 on loopback: s3s in
//! this process, or the server of `KVTIER_S3_ENDPOINT`): blocks stored
//! from the primary region become vLLM's raw objects at vLLM's names and
//! load back into another region (another host); a block already there is
//! not written again; a failed load keeps the blocks before its first bad
//! one; with the server gone, lookups fail their group, stores and loads
//! are reported failed.
#![cfg(all(
    feature = "fs",
    feature = "object-store",
    not(any(kvtier_loom, kvtier_shuttle))
))]

mod common;

use std::time::Duration;

use common::s3::{S3Server, unique_bucket};
use kvtier::lookup::AsyncBackend;
use kvtier::tier::{
    FinishedTransfer, PrimaryRegion, S3Options, TransferKind, VllmObjectLayout, VllmTransfers,
};
use object_store::ObjectStoreExt;

const BLOCK: usize = 4096;
const RANK: &str = "fleet/model_0123456789ab_r0";

fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

/// vLLM's name of `key(n)`'s object below the rank prefix, spelled out.
fn vllm_name(n: u64) -> String {
    let hex: String = n.to_be_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("{RANK}/{}/{}_g0/{hex}.bin", &hex[0..3], &hex[3..5])
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

/// One host: its own region and transfers on the shared bucket.
fn host(options: &S3Options, blocks: usize) -> VllmTransfers {
    let layout = VllmObjectLayout::s3(options, RANK).expect("layout");
    let region = PrimaryRegion::zeroed(blocks, BLOCK).expect("region");
    VllmTransfers::on_objects(layout, region, 2, 2).expect("transfers")
}

fn run(
    transfers: &mut VllmTransfers,
    kind: TransferKind,
    id: u64,
    keys: &[u64],
    blocks: &[usize],
) -> FinishedTransfer {
    let keys = keys.iter().map(|&n| key(n)).collect();
    transfers.submit(kind, id, keys, blocks).expect("submitted");
    transfers.wait_idle();
    let mut finished = transfers.finished();
    assert_eq!(finished.len(), 1, "one job, one report");
    finished.pop().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_block_one_host_stores_is_vllms_raw_object_and_another_host_loads_it() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, 4);
    for (block, seed) in [(0, 1), (1, 2), (2, 3)] {
        a.region()
            .unwrap()
            .write_block(block, &pattern(seed))
            .unwrap();
    }
    let stored = run(&mut a, TransferKind::Store, 1, &[10, 11, 12], &[0, 1, 2]);
    assert!(stored.succeeded(), "{stored:?}");

    // The object is exactly the block, at vLLM's name.
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    let raw = runtime().block_on(async {
        let location = object_store::path::Path::from(vllm_name(11).as_str());
        assert_eq!(layout.location_of(&key(11)).unwrap(), location);
        layout
            .store()
            .get(&location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    });
    assert_eq!(&raw[..], &pattern(2)[..], "raw bytes, no header");

    // Another host, another region: the blocks load where it asks.
    let mut b = host(&options, 4);
    let loaded = run(&mut b, TransferKind::Load, 1, &[12, 10], &[3, 0]);
    assert!(loaded.succeeded(), "{loaded:?}");
    assert_eq!(b.region().unwrap().read_block(3).unwrap(), pattern(3));
    assert_eq!(b.region().unwrap().read_block(0).unwrap(), pattern(1));

    // Its lookups see them too, and only them.
    let answers = runtime().block_on(AsyncBackend::batch_lookup(
        &layout,
        &[key(10), key(13), key(12), vec![1, 2]],
        &(),
    ));
    assert_eq!(answers.unwrap(), [true, false, true, false]);
    assert_eq!(
        layout.stats().heads,
        3,
        "a key that names no block costs no request"
    );
}

#[test]
fn a_block_already_there_is_not_written_again() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, 2);
    a.region().unwrap().write_block(0, &pattern(7)).unwrap();
    assert!(run(&mut a, TransferKind::Store, 1, &[5], &[0]).succeeded());
    let mut b = host(&options, 2);
    b.region().unwrap().write_block(1, &pattern(8)).unwrap();
    assert!(run(&mut b, TransferKind::Store, 1, &[5], &[1]).succeeded());
    // b's store found a's block: the object is a's.
    assert!(run(&mut b, TransferKind::Load, 2, &[5], &[0]).succeeded());
    assert_eq!(b.region().unwrap().read_block(0).unwrap(), pattern(7));
}

#[test]
fn a_failed_load_keeps_the_blocks_before_its_first_missing_one() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, 4);
    a.region().unwrap().write_block(0, &pattern(1)).unwrap();
    a.region().unwrap().write_block(1, &pattern(2)).unwrap();
    assert!(run(&mut a, TransferKind::Store, 1, &[1, 3], &[0, 1]).succeeded());
    let mut b = host(&options, 4);
    let loaded = run(&mut b, TransferKind::Load, 1, &[1, 2, 3], &[0, 1, 2]);
    assert!(!loaded.succeeded());
    assert_eq!(loaded.done, 1);
    assert_eq!(loaded.done_keys(), &[key(1)][..]);
    assert_eq!(loaded.failed_keys(), &[key(2), key(3)][..]);
    assert_eq!(b.region().unwrap().read_block(0).unwrap(), pattern(1));
}

#[test]
fn with_the_server_gone_jobs_and_lookups_fail_within_their_timeouts() {
    // A server of this test's own, stopped mid-run.
    let mut server = S3Server::start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, 4);
    a.region().unwrap().write_block(0, &pattern(1)).unwrap();
    assert!(run(&mut a, TransferKind::Store, 1, &[1], &[0]).succeeded());
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    server.stop();

    let stored = run(&mut a, TransferKind::Store, 2, &[2], &[1]);
    let loaded = run(&mut a, TransferKind::Load, 3, &[1], &[2]);
    assert!(!stored.succeeded() && !loaded.succeeded());
    assert_eq!((stored.done, loaded.done), (0, 0));
    let answers = runtime().block_on(AsyncBackend::batch_lookup(&layout, &[key(1)], &()));
    assert!(
        answers.is_err(),
        "a lookup of a server that is gone fails its group"
    );
    assert_eq!(layout.stats().head_errors, 1);
    a.shutdown(Duration::ZERO);
}

/// The blocks below the rank prefix, listed.
fn listed(options: &S3Options) -> Vec<(String, u64)> {
    let layout = VllmObjectLayout::s3(options, RANK).unwrap();
    runtime().block_on(async {
        use futures_util::StreamExt;
        let prefix = object_store::path::Path::from(RANK);
        let mut listing = layout.store().list(Some(&prefix));
        let mut found = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.unwrap();
            found.push((meta.location.to_string(), meta.size));
        }
        found
    })
}

fn budget(blocks: u64) -> kvtier::settings::BudgetConfig {
    kvtier::settings::BudgetConfig::new(blocks * BLOCK as u64).unwrap()
}

#[test]
fn a_budget_bounds_the_rank_prefix_and_tells_the_lookups_what_it_evicted() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, 6);
    a.record_changes(true);
    let scan = a.set_budget(budget(3)).unwrap().clone();
    assert_eq!(scan.blocks, 0);
    for block in 0..5 {
        a.region()
            .unwrap()
            .write_block(block, &pattern(block as u8))
            .unwrap();
        let stored = run(
            &mut a,
            TransferKind::Store,
            block as u64,
            &[block as u64],
            &[block],
        );
        assert!(stored.succeeded(), "{stored:?}");
        assert!(
            listed(&options).len() <= 3,
            "within the budget after every store"
        );
    }
    let stats = a.capacity_stats().unwrap();
    assert_eq!(
        (stats.resident_bytes, stats.evictions),
        (3 * BLOCK as u64, 2)
    );
    // The lookups hear of five stores and two evictions, in order.
    let changes = a.take_changes();
    assert_eq!(changes.iter().filter(|(_, stored)| *stored).count(), 5);
    let evicted: Vec<_> = changes
        .iter()
        .filter(|(_, stored)| !stored)
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(evicted, [key(0), key(1)], "the least recent first");
    // A load pins; one of an evicted block fails and only its tail is lost.
    let loaded = run(&mut a, TransferKind::Load, 10, &[4, 0], &[5, 3]);
    assert_eq!(loaded.done, 1);
}

#[test]
fn hosts_sharing_a_prefix_stay_within_one_budget_through_reconciles() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let (mut a, mut b) = (host(&options, 4), host(&options, 4));
    a.set_budget(budget(4)).unwrap();
    b.set_budget(budget(4)).unwrap();
    for (host, first) in [(&mut a, 0u64), (&mut b, 10u64)] {
        for i in 0..3 {
            host.region()
                .unwrap()
                .write_block(i, &pattern(i as u8))
                .unwrap();
        }
        let stored = run(
            host,
            TransferKind::Store,
            1,
            &[first, first + 1, first + 2],
            &[0, 1, 2],
        );
        assert!(stored.succeeded());
    }
    assert_eq!(listed(&options).len(), 6, "each host counted its own");
    let report = a.reconcile().unwrap();
    assert_eq!((report.adopted, report.evicted), (3, 2));
    assert_eq!(listed(&options).len(), 4);
    b.reconcile().unwrap();
    for host in [&a, &b] {
        assert_eq!(
            host.capacity_stats().unwrap().resident_bytes,
            4 * BLOCK as u64
        );
    }
}

#[test]
fn stale_uploads_of_the_layouts_blocks_are_aborted_and_nothing_else() {
    let Some(server) = S3Server::with_upload_listing() else {
        return;
    };
    let bucket = unique_bucket("vllm-uploads");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    let block = |n: u64| object_store::path::Path::from(vllm_name(n).as_str());
    let foreign = object_store::path::Path::from(format!("{RANK}/notes/upload.txt").as_str());
    runtime().block_on(async {
        use object_store::multipart::MultipartStore;
        let s3 = server.amazon_s3(&bucket);
        // Two unfinished uploads: a block's and another object's.
        s3.create_multipart(&block(1)).await.unwrap();
        s3.create_multipart(&foreign).await.unwrap();
        // Younger than a thousand years (moto dates every upload 2010).
        let millennium = Duration::from_secs(1000 * 365 * 86_400);
        let young = layout.abort_stale_uploads(millennium).await.unwrap();
        assert_eq!(
            (young.found, young.aborted),
            (1, 0),
            "a young upload is a live writer's"
        );
        let old = layout.abort_stale_uploads(Duration::ZERO).await.unwrap();
        assert_eq!((old.found, old.aborted, old.failed), (1, 1, 0));
        let again = layout.abort_stale_uploads(Duration::ZERO).await.unwrap();
        assert_eq!(
            again.found, 0,
            "the block's upload is gone; the other stays"
        );
    });
}

#[test]
fn a_rescan_interval_reconciles_the_bucket_on_its_own() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-objects");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let (mut a, mut b) = (host(&options, 4), host(&options, 4));
    let every = budget(3)
        .with_rescan_interval(Some(Duration::from_millis(50)))
        .unwrap();
    a.set_budget(every).unwrap();
    b.set_budget(budget(3)).unwrap();
    for i in 0..3 {
        b.region()
            .unwrap()
            .write_block(i, &pattern(i as u8))
            .unwrap();
    }
    assert!(run(&mut b, TransferKind::Store, 1, &[1, 2, 3], &[0, 1, 2]).succeeded());
    a.region().unwrap().write_block(0, &pattern(9)).unwrap();
    assert!(run(&mut a, TransferKind::Store, 1, &[9], &[0]).succeeded());
    // A's own task counts B's three and deletes one to fit three.
    let mut waited = 0;
    while listed(&options).len() > 3 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
        assert!(
            waited < 500,
            "no reconcile brought the prefix back within the budget"
        );
    }
    let stats = a.capacity_stats().unwrap();
    assert!(stats.reconciles > 0 && stats.adopted >= 2, "{stats:?}");
    a.shutdown(Duration::ZERO);
}

#[test]
fn a_start_on_a_bucket_aborts_its_stale_uploads() {
    let Some(server) = S3Server::with_upload_listing() else {
        return;
    };
    let bucket = unique_bucket("vllm-uploads");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    runtime().block_on(async {
        use object_store::multipart::MultipartStore;
        let s3 = server.amazon_s3(&bucket);
        let block = object_store::path::Path::from(vllm_name(5).as_str());
        s3.create_multipart(&block).await.unwrap();
    });
    let transfers = host(&options, 2);
    transfers.sweep_stale_temps(Duration::ZERO);
    let mut waited = 0;
    while transfers.swept() == 0 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
        assert!(waited < 500, "the stale upload was not aborted");
    }
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    let left = runtime()
        .block_on(layout.abort_stale_uploads(Duration::ZERO))
        .unwrap();
    assert_eq!(left.found, 0, "nothing left to abort");
}
