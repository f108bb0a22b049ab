//! `kvtier trim --s3 URL --layout vllm --index REDIS_URL`: the fleet's
//! books of a rank prefix, read beside a listing of it, and repaired: a
//! new fleet-wide capacity (`--capacity`: what no longer fits is evicted
//! through the books), or books rebuilt from the listing (`--rebuild`: the
//! hosts see a new epoch), with the orphans (objects no books count) older
//! than `--stale-temp-age` deleted.

use std::time::Duration;

use futures_util::StreamExt;
use kvtier::settings::IndexConfig;
use kvtier::tier::fleet::{BooksStatus, FleetBooks, FleetBudget, IndexTimeouts, Op, Reply};
use kvtier::tier::{S3Options, VllmObjectLayout};
use object_store::path::Path as ObjectPath;

use super::failure::Failure;
use super::s3;

/// What `--index` was asked to do.
pub(crate) struct Repair {
    pub(crate) capacity: Option<u64>,
    pub(crate) rebuild: bool,
    pub(crate) stale_temp_age: Duration,
    pub(crate) timeout: Duration,
    pub(crate) json: bool,
}

pub(crate) fn run(url: &str, index: &str, repair: &Repair) -> Result<(), Failure> {
    let index = IndexConfig::new(index)
        .map_err(|error| Failure::input(error.spelled("--index").to_string()))?;
    let (options, rank) =
        S3Options::from_url(url).map_err(|error| Failure::input(error.to_string()))?;
    let layout =
        VllmObjectLayout::s3(&options, &rank).map_err(|error| Failure::input(error.to_string()))?;
    let (tier, _) = s3::connect(url)?;
    let runtime = s3::runtime()?;
    s3::reach(&runtime, &tier, url, repair.timeout)?;
    // The namespace vLLM's transfers use for these books.
    let namespace = format!("{}/{}", layout.store(), layout.rank_prefix());
    let shown = index.shown_url();
    let timeouts = IndexTimeouts {
        connect: repair.timeout,
        response: repair.timeout,
    };
    runtime.block_on(async {
        let books = FleetBooks::connect(index.url(), &namespace, timeouts)
            .await
            .map_err(|error| Failure::unreachable(error.to_string()))?;
        if repair.rebuild {
            books
                .wipe()
                .await
                .map_err(|error| Failure::unreachable(error.to_string()))?;
        }
        let capacity = match repair.capacity {
            Some(capacity) => capacity,
            None => match books.call("", &Op::Status).await {
                Ok(Reply::Status(status)) => status.capacity,
                Ok(_) if !repair.rebuild => 0,
                Ok(_) => {
                    return Err(Failure::input(
                        "--rebuild needs --capacity when there are no books to take it from",
                    ));
                }
                Err(error) => return Err(Failure::unreachable(error.to_string())),
            },
        };
        let store = layout.store().clone();
        let prefix = ObjectPath::from(layout.rank_prefix());
        let is_block = |location: &ObjectPath| layout.key_of(location).is_some();
        let fleet = FleetBudget::open(books.clone(), capacity, index.lease()).await;
        let failed = |error: kvtier::TierError| Failure::run(error.to_string());
        let mut evicted = 0;
        let mut rebuilt = false;
        if repair.rebuild {
            rebuilt = fleet
                .maintain(&*store, &prefix, is_block)
                .await
                .map_err(failed)?
                .rebuilt;
        }
        if let (Some(capacity), Some(_)) = (repair.capacity, fleet.epoch()) {
            evicted = fleet
                .set_capacity(&*store, capacity)
                .await
                .map_err(failed)?;
        }
        let orphans_deleted = if repair.rebuild || repair.capacity.is_some() {
            fleet
                .sweep_orphans(&*store, &prefix, is_block, repair.stale_temp_age)
                .await
                .map_err(failed)?
        } else {
            0
        };
        // The listing beside the books.
        let mut listed = Vec::new();
        let mut bytes = 0;
        let mut listing = store.list(Some(&prefix));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|error| Failure::unreachable(error.to_string()))?;
            if is_block(&meta.location) {
                bytes += meta.size;
                listed.push(meta.location.to_string());
            }
        }
        let status = match books.call("", &Op::Status).await {
            Ok(Reply::Status(status)) => Some(status),
            Ok(_) => None,
            Err(error) => return Err(Failure::unreachable(error.to_string())),
        };
        let mut orphans = 0;
        if let Some(status) = status.as_ref().filter(|status| status.ready) {
            for batch in listed.chunks(512) {
                let op = Op::Unlisted {
                    keys: batch.to_vec(),
                };
                if let Ok(Reply::Verdicts(verdicts)) = books.call(&status.epoch, &op).await {
                    orphans += verdicts.iter().filter(|orphan| **orphan).count();
                }
            }
        }
        let found = Found {
            listed: listed.len(),
            bytes,
            orphans,
            orphans_deleted,
            evicted,
            rebuilt,
        };
        report(url, &rank, &shown, status.as_ref(), &found, repair.json)
    })
}

struct Found {
    listed: usize,
    bytes: u64,
    orphans: usize,
    orphans_deleted: u64,
    evicted: usize,
    rebuilt: bool,
}

fn report(
    url: &str,
    rank: &str,
    index: &str,
    status: Option<&BooksStatus>,
    found: &Found,
    json: bool,
) -> Result<(), Failure> {
    if json {
        let books = status.map(|status| {
            serde_json::json!({
                "ready": status.ready,
                "epoch": status.epoch,
                "capacity_bytes": status.capacity,
                "committed_bytes": status.committed,
                "held_bytes": status.held,
                "blocks": status.blocks,
                "held_entries": status.held_entries,
            })
        });
        let value = serde_json::json!({
            "s3": url,
            "namespace": rank,
            "index": index,
            "books": books,
            "listed_blocks": found.listed,
            "listed_bytes": found.bytes,
            "orphans": found.orphans,
            "orphans_deleted": found.orphans_deleted,
            "evicted": found.evicted,
            "rebuilt": found.rebuilt,
        });
        say!("{value}");
        return Ok(());
    }
    say!("fleet books of s3 {url} (rank prefix {rank}) at {index}");
    match status {
        None => say!("  none: lost (a Valkey restart or a flush) or never made"),
        Some(status) => {
            let used =
                100.0 * (status.committed + status.held) as f64 / status.capacity.max(1) as f64;
            say!(
                "  {}, epoch {}: capacity {} bytes, {} committed in {} blocks, {} held in {} entries ({used:.1}% used)",
                if status.ready {
                    "ready"
                } else {
                    "being rebuilt"
                },
                status.epoch,
                status.capacity,
                status.committed,
                status.blocks,
                status.held,
                status.held_entries
            );
        }
    }
    say!(
        "  listed: {} blocks, {} bytes; {} not counted by the books (orphans)",
        found.listed,
        found.bytes,
        found.orphans
    );
    if found.rebuilt {
        say!("  rebuilt from the listing (the hosts see a new epoch)");
    }
    if found.evicted > 0 || found.orphans_deleted > 0 {
        say!(
            "  deleted: {} evicted to fit the capacity, {} orphans",
            found.evicted,
            found.orphans_deleted
        );
    }
    Ok(())
}
