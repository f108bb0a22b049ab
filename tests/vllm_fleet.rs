//! vLLM's transfers and lookups on a bucket whose budget is the fleet's
//! books in a real Valkey (tests/common/valkey.rs; skipped with the reason
//! without one), the objects on the loopback S3 server: hosts stay within
//! one budget at every store, one host's stores are another's hits in one
//! round trip per group, a read's pin holds a block against another
//! host's evictions, and a restarted Valkey's books come back from a
//! listing.
#![cfg(all(feature = "fleet", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::time::Duration;

use common::s3::{S3Server, unique_bucket};
use common::valkey::ValkeyServer;
use kvtier::capacity::Policy;
use kvtier::lookup::AsyncBackend;
use kvtier::settings::{BudgetConfig, IndexConfig};
use kvtier::tier::fleet::{FleetBooks, FleetBudget, IndexTimeouts};
use kvtier::tier::{
    FinishedTransfer, PrimaryRegion, S3Options, TransferKind, VllmObjectLayout, VllmTransfers,
};

const BLOCK: usize = 4096;
const RANK: &str = "fleet/model_0123456789ab_r0";

fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

fn index(server: &ValkeyServer) -> IndexConfig {
    IndexConfig::new(&server.url)
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap()
}

fn budget(blocks: u64) -> BudgetConfig {
    BudgetConfig::new(blocks * BLOCK as u64)
        .unwrap()
        .with_policy(Policy::Lru)
}

/// One host: its own region and transfers on the shared bucket, budgeted
/// by the fleet's books.
fn host(options: &S3Options, server: &ValkeyServer, blocks: usize) -> VllmTransfers {
    let layout = VllmObjectLayout::s3(options, RANK).unwrap();
    let region = PrimaryRegion::zeroed(blocks, BLOCK).unwrap();
    let mut transfers = VllmTransfers::on_objects(layout, region, 2, 2).unwrap();
    transfers
        .set_fleet_budget(budget(4), index(server))
        .unwrap();
    transfers
}

fn run(
    transfers: &mut VllmTransfers,
    kind: TransferKind,
    id: u64,
    keys: &[u64],
    blocks: &[usize],
) -> FinishedTransfer {
    let keys = keys.iter().map(|&n| key(n)).collect();
    transfers.submit(kind, id, keys, blocks).unwrap();
    transfers.wait_idle();
    let mut finished = transfers.finished();
    assert_eq!(finished.len(), 1, "one job, one report");
    finished.pop().unwrap()
}

fn listed(options: &S3Options) -> usize {
    let layout = VllmObjectLayout::s3(options, RANK).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use futures_util::StreamExt;
        let prefix = object_store::path::Path::from(RANK);
        let mut listing = layout.store().list(Some(&prefix));
        let mut n = 0;
        while let Some(meta) = listing.next().await {
            meta.unwrap();
            n += 1;
        }
        n
    })
}

/// The lookups' side: a layout answering from the same books.
fn lookups(
    options: &S3Options,
    server: &ValkeyServer,
) -> (tokio::runtime::Runtime, VllmObjectLayout) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let layout = VllmObjectLayout::s3(options, RANK).unwrap();
    let namespace = format!("{}/{}", layout.store(), layout.rank_prefix());
    let books = runtime
        .block_on(FleetBooks::connect(
            &server.url,
            &namespace,
            IndexTimeouts::default(),
        ))
        .unwrap();
    let fleet = runtime.block_on(FleetBudget::open(
        books,
        4 * BLOCK as u64,
        Duration::from_secs(5),
    ));
    (runtime, layout.with_index(fleet))
}

#[test]
fn hosts_share_the_books_budget_and_hits() {
    let Some(valkey) = ValkeyServer::start("hosts_share_the_books_budget_and_hits") else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-fleet");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, &valkey, 6);
    let mut b = host(&options, &valkey, 6);
    // Six stores from two hosts into room for four: never more than four
    // objects, whichever host evicts.
    for i in 0..6 {
        let host = if i % 2 == 0 { &mut a } else { &mut b };
        host.region()
            .unwrap()
            .write_block(i, &vec![i as u8; BLOCK])
            .unwrap();
        let stored = run(host, TransferKind::Store, i as u64, &[i as u64], &[i]);
        assert!(stored.succeeded(), "{stored:?}");
        assert!(listed(&options) <= 4, "after store {i}");
    }
    // The figures are the last upkeep's: one now.
    a.reconcile().unwrap();
    let stats = a.capacity_stats().unwrap();
    assert_eq!(
        (stats.resident_bytes, stats.capacity_bytes),
        (4 * BLOCK as u64, 4 * BLOCK as u64)
    );
    // The lookups answer from the books, one round trip, no HEAD.
    let (runtime, layout) = lookups(&options, &valkey);
    let keys: Vec<Vec<u8>> = (0..6).map(key).collect();
    let verdicts = runtime.block_on(layout.batch_lookup(&keys, &())).unwrap();
    assert_eq!(verdicts, [false, false, true, true, true, true]);
    assert_eq!(layout.stats().heads, 0);
    // B loads what A stored.
    let loaded = run(&mut b, TransferKind::Load, 10, &[4], &[0]);
    assert!(loaded.succeeded(), "{loaded:?}");
    assert_eq!(b.region().unwrap().read_block(0).unwrap(), vec![4u8; BLOCK]);
    // A load of an evicted block fails (vLLM's failure path).
    let missing = run(&mut b, TransferKind::Load, 11, &[0], &[0]);
    assert!(!missing.succeeded());
    // Stored again while committed: nothing written.
    let again = run(&mut a, TransferKind::Store, 12, &[5], &[5]);
    assert!(again.succeeded());
    assert_eq!(listed(&options), 4);
}

#[test]
fn a_restarted_index_is_rebuilt_from_the_bucket() {
    let Some(mut valkey) = ValkeyServer::start("a_restarted_index_is_rebuilt_from_the_bucket")
    else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-fleet");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, &valkey, 4);
    for i in 0..3 {
        a.region().unwrap().write_block(i, &vec![9; BLOCK]).unwrap();
        assert!(run(&mut a, TransferKind::Store, i as u64, &[i as u64], &[i]).succeeded());
    }
    if !valkey.stop() {
        return; // a server the test did not start cannot be restarted
    }
    valkey.restart();
    // Lost books: a store is refused (never admitted unbudgeted).
    let refused = run(&mut a, TransferKind::Store, 20, &[7], &[3]);
    assert!(!refused.succeeded());
    // The upkeep task (every third of the 5 s lease) rebuilds them from a
    // listing of the bucket.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a
        .capacity_stats()
        .is_none_or(|stats| stats.resident_bytes != 3 * BLOCK as u64)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the books were not rebuilt"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        a.reconcile().unwrap().evicted,
        0,
        "an upkeep round on demand"
    );
    let (runtime, layout) = lookups(&options, &valkey);
    let verdicts = runtime
        .block_on(layout.batch_lookup(&[key(0), key(1), key(2), key(7)], &()))
        .unwrap();
    assert_eq!(verdicts, [true, true, true, false]);
}

#[test]
fn a_hosts_commits_and_the_blocks_it_takes_out_are_its_changes() {
    let Some(valkey) = ValkeyServer::start("a_hosts_commits_and_the_blocks_it_takes_out") else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-fleet");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let (mut a, mut b) = (host(&options, &valkey, 6), host(&options, &valkey, 6));
    // Recording starts after the budget here (the tier may start it in
    // either order).
    a.record_changes(true);
    b.record_changes(true);
    for i in 0..6 {
        let host = if i % 2 == 0 { &mut a } else { &mut b };
        host.region()
            .unwrap()
            .write_block(i, &vec![1; BLOCK])
            .unwrap();
        assert!(run(host, TransferKind::Store, i as u64, &[i as u64], &[i]).succeeded());
    }
    // Room for four: A's store of 4 evicted 0 (A's), B's store of 5
    // evicted 1 (B's); each host logs its own steps, in order.
    let change = |n: u64, present: bool| (key(n), present);
    assert_eq!(
        a.take_changes(),
        [
            change(0, true),
            change(2, true),
            change(0, false),
            change(4, true)
        ]
    );
    assert_eq!(
        b.take_changes(),
        [
            change(1, true),
            change(3, true),
            change(1, false),
            change(5, true)
        ]
    );
    // An object gone behind the books' back: B's load finds it missing and
    // the block leaves the books, a change of B's.
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    let location = layout.location_of(&key(2)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(object_store::ObjectStoreExt::delete(
            &**layout.store(),
            &location,
        ))
        .unwrap();
    assert!(!run(&mut b, TransferKind::Load, 20, &[2], &[0]).succeeded());
    assert_eq!(b.take_changes(), [change(2, false)]);
    assert!(a.take_changes().is_empty(), "taken once");
}

#[test]
fn a_process_without_transfers_looks_up_through_books_of_its_own() {
    let Some(valkey) = ValkeyServer::start("a_process_without_transfers_looks_up") else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("vllm-fleet");
    server.create_bucket(&bucket);
    let options = server.s3_options(&bucket);
    let mut a = host(&options, &valkey, 2);
    a.region().unwrap().write_block(0, &[3; BLOCK]).unwrap();
    assert!(run(&mut a, TransferKind::Store, 1, &[0], &[0]).succeeded());
    // The KV connector's scheduler: its lookups run on a runtime of the
    // lookup's, the books' connection on its own.
    let layout = VllmObjectLayout::s3(&options, RANK)
        .unwrap()
        .with_own_index(&budget(4), &index(&valkey))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let verdicts = runtime
        .block_on(layout.batch_lookup(&[key(0), key(1)], &()))
        .unwrap();
    assert_eq!(verdicts, [true, false]);
    assert_eq!(layout.stats().heads, 0, "answered by the books");
    // Its last clone may go inside a task: the books' runtime stops
    // without blocking it.
    runtime.block_on(async move { drop(layout) });
    // An unreachable index is an error at once.
    let unreachable = IndexConfig::new("redis://127.0.0.1:9/").unwrap();
    let refused = VllmObjectLayout::s3(&options, RANK)
        .unwrap()
        .with_own_index(&budget(4), &unreachable);
    assert!(
        matches!(refused, Err(kvtier::TierError::Index { .. })),
        "{refused:?}"
    );
}
