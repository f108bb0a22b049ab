//! vLLM's transfers on a bucket whose budget is the fleet's books in
//! Valkey (feature `fleet`): set up, kept up (leases, touches, expired
//! entries, lost books rebuilt) by a task on the bucket's runtime, trimmed,
//! and their figures. docs/design.md, "The fleet's books in Valkey".

use std::time::Instant;

use object_store::path::Path as ObjectPath;

use super::books::{Books, Budget};
use super::home::{Bucket, Home};
use super::layout::vllm_entry;
use super::transfers::VllmTransfers;
use crate::capacity::CapacityStats;
use crate::settings::{BudgetConfig, IndexConfig};
use crate::tier::error::{ReconcileReport, ScanReport, TierError};
use crate::tier::fleet::FleetBudget;
use crate::tier::object_budget::is_block_below;

impl VllmTransfers {
    /// Bounds the rank prefix with the fleet's books at `index` instead of
    /// this host's own ledger: every host writing into the prefix shares
    /// one budget (`config`'s capacity; the books keep the one the host
    /// that made them gave) and one recency, and the lookups' layout
    /// should answer from the same books
    /// ([`VllmObjectLayout::with_index`](crate::tier::VllmObjectLayout::with_index)).
    /// Connects now (an unreachable index is an error), attaches to the
    /// books or rebuilds them from a listing, and keeps them up on the
    /// bucket's runtime until shutdown. Only on a bucket; call it once,
    /// before the first job, instead of [`set_budget`](Self::set_budget).
    pub fn set_fleet_budget(
        &mut self,
        config: BudgetConfig,
        index: IndexConfig,
    ) -> Result<&ScanReport, TierError> {
        self.check_new_budget(config.capacity().get())?;
        let Home::Bucket(bucket) = &self.home else {
            return Err(TierError::Config(
                "the fleet's books (index) need the blocks in an object store".into(),
            ));
        };
        let started = Instant::now();
        let namespace = format!("{}/{}", bucket.layout.store(), bucket.layout.rank_prefix());
        let fleet = bucket.run(FleetBudget::connect(
            &index,
            &namespace,
            config.capacity().get(),
        ))?;
        if self.changes.is_some() {
            fleet.record_changes(true);
        }
        // Attached, or the books rebuilt, before the first store.
        if let Err(error) = bucket.run(upkeep(&fleet, bucket)) {
            tracing::warn!(%error, "the fleet's books are not ready yet");
        }
        let mut scan = ScanReport::default();
        if let Some(status) = fleet.last_status() {
            scan.blocks = status.blocks;
            scan.bytes = status.committed;
        }
        scan.elapsed = started.elapsed();
        let every = index.lease() / 3;
        // With an index, listings serve the orphan sweep (every
        // rescan_interval, or every stale_temp_age) and the rebuild.
        let (age, sweep_every) = (
            config.sweep_age(),
            config.rescan_interval().unwrap_or(config.sweep_age()),
        );
        let (task_fleet, task_bucket) = (fleet.clone(), crate::sync::Arc::downgrade(bucket));
        // guard: G16-the-books-are-kept-up-on-a-task
        let task = bucket.spawn(async move {
            let mut swept = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(every).await;
                let Some(bucket) = task_bucket.upgrade() else {
                    return;
                };
                if let Err(error) = upkeep(&task_fleet, &bucket).await {
                    tracing::warn!(%error, "cannot keep up the fleet's books");
                }
                if swept.elapsed() >= sweep_every {
                    swept = tokio::time::Instant::now();
                    if let Err(error) = sweep_orphans(&task_fleet, &bucket, age).await {
                        tracing::warn!(%error, "cannot sweep the bucket's orphans");
                    }
                }
            }
        });
        let budget = Budget {
            books: Books::Fleet(fleet),
            scan,
            stale_temp_age: config.sweep_age(),
            rescanner: None,
            reconciler: Some(task),
        };
        Ok(&self.budget.insert(budget).scan)
    }
}

impl VllmTransfers {
    /// The fleet's books these transfers are budgeted by (`None` without):
    /// the lookups' layout answers from them
    /// ([`VllmObjectLayout::with_index`](crate::tier::VllmObjectLayout::with_index)).
    pub fn fleet_budget(&self) -> Option<FleetBudget> {
        match self.budget.as_ref().map(|budget| &budget.books) {
            Some(Books::Fleet(fleet)) => Some(fleet.clone()),
            _ => None,
        }
    }
}

/// One round of upkeep (see [`FleetBudget::maintain`]), as a reconcile's
/// report: expired entries settled count as evicted.
pub(super) async fn upkeep(
    fleet: &FleetBudget,
    bucket: &Bucket,
) -> Result<ReconcileReport, TierError> {
    let started = Instant::now();
    let prefix = ObjectPath::from(bucket.layout.rank_prefix());
    let done = fleet
        .maintain(&**bucket.layout.store(), &prefix, |location| {
            is_block_below(&prefix, location, vllm_entry)
        })
        .await?;
    Ok(ReconcileReport {
        adopted: 0,
        forgotten: 0,
        evicted: done.settled,
        swept: 0,
        elapsed: started.elapsed(),
    })
}

/// Deletes the rank prefix's orphans older than `age` (see
/// [`FleetBudget::sweep_orphans`]).
pub(super) async fn sweep_orphans(
    fleet: &FleetBudget,
    bucket: &Bucket,
    age: std::time::Duration,
) -> Result<u64, TierError> {
    let prefix = ObjectPath::from(bucket.layout.rank_prefix());
    fleet
        .sweep_orphans(
            &**bucket.layout.store(),
            &prefix,
            |location| is_block_below(&prefix, location, vllm_entry),
            age,
        )
        .await
}

/// A new capacity for the fleet; the victims' objects deleted.
pub(super) async fn trim(
    fleet: &FleetBudget,
    bucket: &Bucket,
    capacity: u64,
) -> Result<usize, TierError> {
    fleet.set_capacity(&**bucket.layout.store(), capacity).await
}

/// The books' figures as a ledger's gauges, as the last upkeep read them
/// (no request: vLLM's tier manager reads them every step).
pub(super) fn stats(fleet: &FleetBudget) -> Option<CapacityStats> {
    Some(fleet.last_status()?.capacity_stats())
}
