//! What vLLM's transfers keep besides their jobs: the byte budget (see
//! `budgeted.rs`) and the changes recorded for the lookups (see
//! `changes.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use super::home::BucketBudget;
use crate::tier::budget::DirBudget;
use crate::tier::error::ScanReport;
use crate::tier::rescan::Rescanner;
#[cfg(object_tier)]
use crate::{sync::Arc, tier::object_budget::ObjectBudget};

/// The ledger of a budget: a directory's, or a bucket prefix's.
#[derive(Clone)]
pub(crate) enum Books {
    Dir(DirBudget),
    #[cfg(object_tier)]
    Objects(Arc<ObjectBudget>),
    /// The fleet's books in Valkey (a bucket's, shared by every host).
    #[cfg(fleet_index)]
    Fleet(crate::tier::fleet::FleetBudget),
}

impl Books {
    pub(crate) fn stats(&self) -> crate::capacity::CapacityStats {
        match self {
            Self::Dir(dir) => dir.stats(),
            #[cfg(object_tier)]
            Self::Objects(objects) => objects.stats(),
            // The fleet's figures are the books' (`VllmTransfers::capacity_stats`).
            #[cfg(fleet_index)]
            Self::Fleet(_) => crate::capacity::CapacityStats::default(),
        }
    }

    pub(crate) fn record_changes(&self, on: bool) {
        match self {
            Self::Dir(dir) => dir.record_changes(on),
            #[cfg(object_tier)]
            Self::Objects(objects) => objects.record_changes(on),
            #[cfg(fleet_index)]
            Self::Fleet(fleet) => fleet.record_changes(on),
        }
    }

    /// The directory's budget (`None` on a bucket).
    pub(crate) fn dir(&self) -> Option<&DirBudget> {
        match self {
            Self::Dir(dir) => Some(dir),
            #[cfg(object_tier)]
            Self::Objects(_) => None,
            #[cfg(fleet_index)]
            Self::Fleet(_) => None,
        }
    }

    /// The bucket's budget (`None` on a directory).
    pub(crate) fn bucket(&self) -> Option<BucketBudget<'_>> {
        match self {
            Self::Dir(_) => None,
            #[cfg(object_tier)]
            Self::Objects(objects) => Some(BucketBudget::Ledger(objects)),
            #[cfg(fleet_index)]
            Self::Fleet(fleet) => Some(BucketBudget::Fleet(fleet)),
        }
    }
}

/// A budget and what goes with it.
pub(crate) struct Budget {
    pub(crate) books: Books,
    pub(super) scan: ScanReport,
    pub(super) stale_temp_age: Duration,
    /// The rescan thread of a directory's budget with a rescan interval
    /// (stopped at shutdown).
    pub(super) rescanner: Option<Rescanner>,
    /// The reconcile task of a bucket's budget with a rescan interval
    /// (aborted at shutdown).
    #[cfg(object_tier)]
    pub(super) reconciler: Option<tokio::task::AbortHandle>,
}

impl Budget {
    /// Stops the reconciles (a directory's thread is joined).
    pub(super) fn stop_reconciling(&mut self) {
        self.rescanner = None;
        #[cfg(object_tier)]
        if let Some(task) = self.reconciler.take() {
            task.abort();
        }
    }
}

/// Changes recorded without a budget: the keys of finished stores.
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) stored: VecDeque<Vec<u8>>,
}
