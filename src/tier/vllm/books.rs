//! What vLLM's transfers keep besides their jobs: the byte budget (see
//! `budgeted.rs`) and the changes recorded for the lookups (see
//! `changes.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use crate::tier::budget::DirBudget;
use crate::tier::error::ScanReport;
use crate::tier::rescan::Rescanner;

/// A budget and what goes with it.
pub(crate) struct Budget {
    pub(crate) dir: DirBudget,
    pub(super) scan: ScanReport,
    pub(super) stale_temp_age: Duration,
    /// The rescan thread, when the budget has a rescan interval (stopped
    /// at shutdown).
    pub(super) rescanner: Option<Rescanner>,
}

/// Changes recorded without a budget: the keys of finished stores.
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) stored: VecDeque<Vec<u8>>,
}
