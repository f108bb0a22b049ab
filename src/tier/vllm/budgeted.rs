//! The byte budget of vLLM's transfers: the rank directory's block files
//! bounded, the startup scan's report, trims, and reconciles with the
//! directory when other processes share it (once, or on a thread every
//! interval).

use std::time::Duration;

use super::books::Budget;
use super::transfers::VllmTransfers;
use crate::capacity::{CapacityStats, Policy};
use crate::tier::budget::DirBudget;
use crate::tier::error::{ReconcileReport, ScanReport, TierError};
use crate::tier::rescan::{Rescanner, check_interval};
use crate::tier::tree::BlockLayout;

impl VllmTransfers {
    /// Bounds the rank directory's block files to `capacity` bytes: scans
    /// it now (the newest blocks that fit are counted, older ones deleted,
    /// temporary files older than `stale_temp_age` deleted), then every
    /// store gets room first (evicting by `policy`; a store that cannot is
    /// a failed job, nothing lost) and every load pins its blocks. Call it
    /// once, before the first job.
    pub fn set_budget(
        &mut self,
        capacity: u64,
        policy: Policy,
        stale_temp_age: Duration,
    ) -> Result<&ScanReport, TierError> {
        if self.budget.is_some() {
            return Err(TierError::Config(
                "the transfers have a byte budget already".into(),
            ));
        }
        let (dir, scan) = DirBudget::scan(
            capacity,
            policy,
            self.layout.rank_dir(),
            BlockLayout::Vllm,
            stale_temp_age,
        )?;
        if self.changes.is_some() {
            dir.record_changes(true);
        }
        let budget = Budget {
            dir,
            scan,
            stale_temp_age,
            rescanner: None,
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
            self.layout.rank_dir(),
            BlockLayout::Vllm,
            budget.stale_temp_age,
        )
    }

    /// Reconciles the budget with the rank directory every `interval` on a
    /// thread of its own, until [`shutdown`](Self::shutdown) (see
    /// [`FsOptions::rescan_interval`](crate::tier::FsOptions::rescan_interval)
    /// for when to). Needs a budget; once only.
    pub fn rescan_every(&mut self, interval: Duration) -> Result<(), TierError> {
        check_interval(interval)?;
        let rank_dir = self.layout.rank_dir().to_path_buf();
        let running = self.region().is_some();
        let budget = match &mut self.budget {
            Some(budget) => budget,
            None => {
                return Err(TierError::Config(
                    "the transfers have no byte budget to reconcile (set_budget)".into(),
                ));
            }
        };
        if budget.rescanner.is_some() || !running {
            return Err(TierError::Config(
                "the transfers rescan already, or are shut down".into(),
            ));
        }
        let rescanner = Rescanner::start(
            budget.dir.clone(),
            rank_dir.clone(),
            BlockLayout::Vllm,
            budget.stale_temp_age,
            interval,
        )
        .map_err(|source| TierError::io("start the rescan thread for", &rank_dir, source))?;
        budget.rescanner = Some(rescanner);
        Ok(())
    }

    fn budget(&self) -> Result<&Budget, TierError> {
        self.budget.as_ref().ok_or_else(|| {
            TierError::Config("the transfers have no byte budget (set_budget)".into())
        })
    }
}
