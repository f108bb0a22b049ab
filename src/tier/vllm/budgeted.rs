//! The byte budget of vLLM's transfers: the rank directory's block files
//! bounded, the startup scan's report, trims, and reconciles with the
//! directory when other processes share it (once, or on a thread every
//! interval).

use super::books::Budget;
use super::transfers::VllmTransfers;
use crate::capacity::CapacityStats;
use crate::settings::{BudgetConfig, SettingError};
use crate::tier::budget::DirBudget;
use crate::tier::error::{ReconcileReport, ScanReport, TierError};
use crate::tier::rescan::Rescanner;
use crate::tier::tree::BlockLayout;

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
        if self.budget.is_some() {
            return Err(TierError::Config(
                "the transfers have a byte budget already".into(),
            ));
        }
        if self.region().is_none() {
            return Err(TierError::Config("the transfers are shut down".into()));
        }
        let capacity = config.capacity().get();
        let block = self.shape().1 as u64;
        // guard: H10-a-budget-holds-a-block
        if capacity < block {
            return Err(SettingError::new(
                "capacity_bytes",
                format!("is {capacity}; it must hold at least one block ({block} bytes)"),
            )
            .into());
        }
        let (dir, scan) = DirBudget::scan(
            capacity,
            config.policy(),
            self.home.dir()?.rank_dir(),
            BlockLayout::Vllm,
            config.sweep_age(),
        )?;
        if self.changes.is_some() {
            dir.record_changes(true);
        }
        let rescanner = match config.rescan_interval() {
            None => None,
            Some(interval) => {
                let rank_dir = self.home.dir()?.rank_dir();
                Some(
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
                )
            }
        };
        let budget = Budget {
            dir,
            scan,
            stale_temp_age: config.sweep_age(),
            rescanner,
        };
        Ok(&self.budget.insert(budget).scan)
    }

    /// The byte budget's counters and gauges (`None` without one).
    pub fn capacity_stats(&self) -> Option<CapacityStats> {
        self.budget.as_ref().map(|budget| budget.dir.stats())
    }

    /// What the budget's startup scan found (`None` without one).
    pub fn scan_report(&self) -> Option<&ScanReport> {
        self.budget.as_ref().map(|budget| &budget.scan)
    }

    /// Sets the budget to `capacity` and deletes blocks until the files
    /// fit (blocks being read or written stay until those end); returns
    /// how many were deleted. An error without a budget.
    pub fn trim(&self, capacity: u64) -> Result<usize, TierError> {
        Ok(self.budget()?.dir.trim(capacity))
    }

    /// Lists the rank directory and reconciles the budget with it, now, on
    /// this thread: blocks other processes sharing the directory wrote are
    /// counted, those they deleted forgotten, and the least valuable
    /// deleted until the books fit the capacity (see
    /// [`FsTier::reconcile`](crate::FsTier::reconcile)). An error without a
    /// budget, or when the directory cannot be listed.
    pub fn reconcile(&self) -> Result<ReconcileReport, TierError> {
        let budget = self.budget()?;
        budget.dir.reconcile(
            self.home.dir()?.rank_dir(),
            BlockLayout::Vllm,
            budget.stale_temp_age,
        )
    }

    fn budget(&self) -> Result<&Budget, TierError> {
        self.budget.as_ref().ok_or_else(|| {
            TierError::Config("the transfers have no byte budget (set_budget)".into())
        })
    }
}
