//! The byte budget of vLLM's transfers: the rank directory's block files
//! bounded, the startup scan's report, trims, and reconciles with the
//! directory when other processes share it (once, or on a thread every
//! interval).

use super::books::{Books, Budget};
use super::home::Home;
#[cfg(object_tier)]
use super::layout::vllm_entry;
use super::transfers::VllmTransfers;
use crate::capacity::CapacityStats;
use crate::settings::{BudgetConfig, SettingError};
use crate::tier::budget::DirBudget;
use crate::tier::error::{ReconcileReport, ScanReport, TierError};
#[cfg(object_tier)]
use crate::tier::object_budget::ObjectBudget;
use crate::tier::rescan::Rescanner;
use crate::tier::tree::BlockLayout;
#[cfg(object_tier)]
use object_store::path::Path as ObjectPath;

impl VllmTransfers {
    /// Bounds the rank directory's block files to the budget's capacity:
    /// scans it now (the newest blocks that fit are counted, older ones
    /// deleted, temporary files older than the budget's `stale_temp_age`
    /// deleted), then every store gets room first (evicting by the
    /// budget's policy; a store that cannot is a failed job, nothing lost)
    /// and every load pins its blocks. With a `rescan_interval`, the
    /// budget is reconciled with the directory that often on a thread of
    /// its own until [`shutdown`](Self::shutdown) (see
    /// [`FsOptions::budget`](crate::tier::FsOptions::budget) for when to).
    /// A capacity smaller than one block (every store would fail) is
    /// refused. Call it once, before the first job.
    pub fn set_budget(&mut self, config: BudgetConfig) -> Result<&ScanReport, TierError> {
        self.check_new_budget(config.capacity().get())?;
        let capacity = config.capacity().get();
        let budget = match &self.home {
            Home::Dir(layout) => {
                let rank_dir = layout.rank_dir();
                let (dir, scan) = DirBudget::scan(
                    capacity,
                    config.policy(),
                    rank_dir,
                    BlockLayout::Vllm,
                    config.sweep_age(),
                )?;
                if self.changes.is_some() {
                    dir.record_changes(true);
                }
                let rescanner = match config.rescan_interval() {
                    None => None,
                    Some(interval) => Some(
                        Rescanner::start(
                            dir.clone(),
                            rank_dir.to_path_buf(),
                            BlockLayout::Vllm,
                            config.sweep_age(),
                            interval,
                        )
                        .map_err(|source| {
                            TierError::io("start the rescan thread for", rank_dir, source)
                        })?,
                    ),
                };
                Budget {
                    books: Books::Dir(dir),
                    scan,
                    stale_temp_age: config.sweep_age(),
                    rescanner,
                    #[cfg(object_tier)]
                    reconciler: None,
                }
            }
            #[cfg(object_tier)]
            Home::Bucket(bucket) => self.bucket_budget(bucket, &config)?,
        };
        Ok(&self.budget.insert(budget).scan)
    }

    /// Whether a budget of `capacity` bytes may be set: none yet, the
    /// transfers running, and room for one block at least.
    pub(super) fn check_new_budget(&self, capacity: u64) -> Result<(), TierError> {
        if self.budget.is_some() {
            return Err(TierError::Config(
                "the transfers have a byte budget already".into(),
            ));
        }
        if self.region().is_none() {
            return Err(TierError::Config("the transfers are shut down".into()));
        }
        let block = self.shape().1 as u64;
        // guard: H10-a-budget-holds-a-block
        if capacity < block {
            return Err(SettingError::new(
                "capacity_bytes",
                format!("is {capacity}; it must hold at least one block ({block} bytes)"),
            )
            .into());
        }
        Ok(())
    }

    /// The byte budget's counters and gauges (`None` without one); with
    /// the fleet's books, their capacity, committed and held bytes and
    /// entries as the last upkeep (every third of a lease) or
    /// [`reconcile`](Self::reconcile) read them: no request is made here.
    pub fn capacity_stats(&self) -> Option<CapacityStats> {
        let budget = self.budget.as_ref()?;
        #[cfg(fleet_index)]
        if let Books::Fleet(fleet) = &budget.books {
            return super::fleet::stats(fleet);
        }
        Some(budget.books.stats())
    }

    /// What the budget's startup scan found (`None` without one).
    pub fn scan_report(&self) -> Option<&ScanReport> {
        self.budget.as_ref().map(|budget| &budget.scan)
    }

    /// Sets the budget to `capacity` and deletes blocks until the files
    /// (or objects) fit (blocks being read or written stay until those
    /// end); returns how many were deleted. An error without a budget.
    pub fn trim(&self, capacity: u64) -> Result<usize, TierError> {
        match (&self.budget()?.books, &self.home) {
            (Books::Dir(dir), _) => Ok(dir.trim(capacity)),
            #[cfg(object_tier)]
            (Books::Objects(objects), Home::Bucket(bucket)) => {
                Ok(bucket.run(objects.trim(&**bucket.layout.store(), capacity)))
            }
            #[cfg(fleet_index)]
            (Books::Fleet(fleet), Home::Bucket(bucket)) => {
                bucket.run(super::fleet::trim(fleet, bucket, capacity))
            }
            #[cfg(object_tier)]
            (_, Home::Dir(_)) => unreachable!("a bucket's budget has a bucket"),
        }
    }

    /// Lists the rank directory (or the rank prefix) and reconciles the
    /// budget with it, now, on this thread: blocks other processes or hosts
    /// sharing it wrote are counted, those they deleted forgotten, and the
    /// least valuable deleted until the books fit the capacity (see
    /// [`FsTier::reconcile`](crate::FsTier::reconcile)). An error without a
    /// budget, or when it cannot be listed.
    pub fn reconcile(&self) -> Result<ReconcileReport, TierError> {
        let budget = self.budget()?;
        match (&budget.books, &self.home) {
            (Books::Dir(dir), _) => dir.reconcile(
                self.home.dir()?.rank_dir(),
                BlockLayout::Vllm,
                budget.stale_temp_age,
            ),
            #[cfg(object_tier)]
            (Books::Objects(objects), Home::Bucket(bucket)) => {
                let prefix = ObjectPath::from(bucket.layout.rank_prefix());
                bucket.run(objects.reconcile(&**bucket.layout.store(), &prefix))
            }
            #[cfg(fleet_index)]
            (Books::Fleet(fleet), Home::Bucket(bucket)) => bucket.run(async {
                let mut report = super::fleet::upkeep(fleet, bucket).await?;
                report.swept =
                    super::fleet::sweep_orphans(fleet, bucket, budget.stale_temp_age).await?;
                Ok(report)
            }),
            #[cfg(object_tier)]
            (_, Home::Dir(_)) => unreachable!("a bucket's budget has a bucket"),
        }
    }

    fn budget(&self) -> Result<&Budget, TierError> {
        self.budget.as_ref().ok_or_else(|| {
            TierError::Config("the transfers have no byte budget (set_budget)".into())
        })
    }

    /// A bucket's budget: the rank prefix listed now (the newest blocks
    /// that fit counted, older ones deleted), and with a rescan interval a
    /// task on the bucket's runtime that reconciles the books with a
    /// listing that often (a failed listing is logged and tried again at
    /// the next interval), until shutdown.
    #[cfg(object_tier)]
    fn bucket_budget(
        &self,
        bucket: &crate::sync::Arc<super::home::Bucket>,
        config: &BudgetConfig,
    ) -> Result<Budget, TierError> {
        let store = bucket.layout.store().clone();
        let prefix = ObjectPath::from(bucket.layout.rank_prefix());
        let objects = bucket.run(ObjectBudget::scan(
            &*store,
            &prefix,
            config.capacity().get(),
            config.policy(),
            vllm_entry,
        ))?;
        if self.changes.is_some() {
            objects.record_changes(true);
        }
        let scan = objects.report().clone();
        let objects = crate::sync::Arc::new(objects);
        // guard: O11-the-rescan-interval-reconciles-the-bucket
        let reconciler = config.rescan_interval().map(|interval| {
            let (objects, prefix) = (crate::sync::Arc::downgrade(&objects), prefix.clone());
            bucket.spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    let Some(objects) = objects.upgrade() else { return };
                    if let Err(error) = objects.reconcile(&*store, &prefix).await {
                        tracing::warn!(%error, %prefix, "cannot reconcile the budget with the bucket");
                    }
                }
            })
        });
        Ok(Budget {
            books: Books::Objects(objects),
            scan,
            stale_temp_age: config.sweep_age(),
            rescanner: None,
            reconciler,
        })
    }
}
