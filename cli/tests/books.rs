//! `kvtier trim --s3 URL --layout vllm --index REDIS_URL`: the fleet's
//! books read beside a listing, a fleet-wide capacity set through them,
//! orphans deleted, lost books rebuilt; `kvtier probe --index`: lookups
//! asked of the books, their state reported, none made; bad and
//! unreachable indexes exit 2 and 3. On the loopback S3 server and a real Valkey (skipped with the
//! reason without one).
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

#[path = "../../tests/common/mod.rs"]
mod common;

mod run;

use std::time::Duration;

use common::s3::{S3Server, unique_bucket};
use common::valkey::ValkeyServer;
use kvtier::tier::fleet::{Admission, FleetBooks, FleetBudget, IndexTimeouts};
use kvtier::tier::{S3Options, VllmObjectLayout};
use object_store::ObjectStoreExt;
use run::{json, kvtier};

const RANK: &str = "fleet/model_0123456789ab_r0";
const BLOCK: u64 = 4096;

fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

#[test]
fn trim_reads_and_repairs_the_fleets_books() {
    let Some(valkey) = ValkeyServer::start("trim_reads_and_repairs_the_fleets_books") else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-books");
    server.create_bucket(&bucket);
    let url = format!("s3://{bucket}/{RANK}?endpoint={}", server.endpoint);
    let (options, _) = S3Options::from_url(&url).unwrap();
    let options = options.credentials("testing", "testing");
    let layout = VllmObjectLayout::s3(&options, RANK).unwrap();
    let store = layout.store().clone();
    let namespace = format!("{}/{RANK}", layout.store());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let books = FleetBooks::connect(&valkey.url, &namespace, IndexTimeouts::default())
            .await
            .unwrap();
        let fleet = FleetBudget::open(books, 4 * BLOCK, Duration::from_secs(30)).await;
        let prefix = object_store::path::Path::from(RANK);
        fleet.maintain(&*store, &prefix, |_| true).await.unwrap();
        for n in 0..3 {
            let location = layout.location_of(&key(n)).unwrap();
            let Admission::Write(write) = fleet.admit(&*store, &location, BLOCK).await.unwrap()
            else {
                panic!("room");
            };
            store
                .put(&location, vec![1u8; BLOCK as usize].into())
                .await
                .unwrap();
            write.commit(&*store).await.unwrap();
        }
        // An object no books count, at a block's name.
        let orphan = layout.location_of(&key(9)).unwrap();
        store
            .put(&orphan, vec![2u8; BLOCK as usize].into())
            .await
            .unwrap();
    });
    let index = valkey.url.as_str();
    let read = json(&kvtier(&[
        "trim", "--s3", &url, "--layout", "vllm", "--index", index, "--json",
    ]));
    assert_eq!(
        read["books"]["committed_bytes"].as_u64(),
        Some(3 * BLOCK),
        "{read}"
    );
    assert_eq!(read["books"]["capacity_bytes"].as_u64(), Some(4 * BLOCK));
    assert_eq!(
        (read["listed_blocks"].as_u64(), read["orphans"].as_u64()),
        (Some(4), Some(1))
    );
    // A fleet-wide capacity of two blocks: one evicted, the orphan swept.
    let trimmed = json(&kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--index",
        index,
        "--capacity",
        "8K",
        "--stale-temp-age",
        "0",
        "--json",
    ]));
    assert_eq!(
        (
            trimmed["evicted"].as_u64(),
            trimmed["orphans_deleted"].as_u64()
        ),
        (Some(1), Some(1)),
        "{trimmed}"
    );
    assert_eq!(trimmed["listed_blocks"].as_u64(), Some(2));
    assert_eq!(trimmed["books"]["capacity_bytes"].as_u64(), Some(2 * BLOCK));
    // Lost books: read as none, then rebuilt from the listing.
    runtime.block_on(async {
        FleetBooks::connect(&valkey.url, &namespace, IndexTimeouts::default())
            .await
            .unwrap()
            .wipe()
            .await
            .unwrap();
    });
    let lost = json(&kvtier(&[
        "trim", "--s3", &url, "--layout", "vllm", "--index", index, "--json",
    ]));
    assert!(lost["books"].is_null(), "{lost}");
    let refused = kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--index",
        index,
        "--rebuild",
    ]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "no capacity to rebuild with"
    );
    let rebuilt = json(&kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--index",
        index,
        "--rebuild",
        "--capacity",
        "8K",
        "--json",
    ]));
    assert_eq!(rebuilt["rebuilt"].as_bool(), Some(true), "{rebuilt}");
    assert_eq!(
        rebuilt["books"]["committed_bytes"].as_u64(),
        Some(2 * BLOCK)
    );
    // Bad and unreachable indexes.
    let bad = kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--index",
        "http://u:hunter2@h",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&bad.stderr).contains("hunter2"));
    let kvtier_layout = kvtier(&["trim", "--s3", &url, "--index", index]);
    assert_eq!(
        kvtier_layout.status.code(),
        Some(2),
        "--index needs --layout vllm"
    );
    let closed = kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--index",
        "redis://127.0.0.1:1",
        "--timeout",
        "500",
    ]);
    assert_eq!(
        closed.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&closed.stderr)
    );
}

#[test]
fn probe_asks_the_books_and_reports_them_but_makes_none() {
    let Some(valkey) = ValkeyServer::start("probe_asks_the_books") else {
        return;
    };
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-books");
    server.create_bucket(&bucket);
    let url = format!("s3://{bucket}/probed?endpoint={}", server.endpoint);
    let probe = |index: &str| {
        kvtier(&[
            "probe", "--s3", &url, "--index", index, "--keys", "40", "--groups", "4", "--json",
        ])
    };
    // No books for the namespace: refused, and none made.
    let none = probe(&valkey.url);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
    assert!(String::from_utf8_lossy(&none.stderr).contains("no books ready"));
    assert_eq!(
        probe(&valkey.url).status.code(),
        Some(2),
        "the first probe made none"
    );
    // A tier with the index makes them and stores two blocks.
    let (options, namespace) = S3Options::from_url(&url).unwrap();
    let options = options.credentials("testing", "testing");
    let budget = kvtier::settings::BudgetConfig::new(10 * BLOCK).unwrap();
    let index = kvtier::settings::IndexConfig::new(&valkey.url).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let tier = kvtier::ObjectTier::s3(&options, &namespace)
            .unwrap()
            .with_index(budget, index)
            .await
            .unwrap();
        for n in 0u64..2 {
            tier.store(&n, vec![1; 100]).await.unwrap();
        }
    });
    let report = json(&probe(&valkey.url));
    assert!(
        report["tier"].as_str().unwrap().contains("the books at"),
        "{report}"
    );
    assert_eq!(report["books"]["blocks"], 2, "{report}");
    assert_eq!(report["books"]["capacity_bytes"], 10 * BLOCK, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    // A bad index is bad input; one that does not answer, unreachable.
    assert_eq!(probe("http://nowhere").status.code(), Some(2));
    assert_eq!(probe("redis://127.0.0.1:9").status.code(), Some(3));
}
