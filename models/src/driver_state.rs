//! A lookup driver as the checked models hold it: running, or shut down
//! and reduced to its final table. `checked` (the threaded driver) and
//! `checked_tasks` (the tokio driver) share it.

use kvtier::lookup::{GroupOutcome, Lookup, LookupTable, Prober};

use crate::reference::{Key, Req};

/// The driver while it runs; its final table once shut down.
pub(crate) enum DriverState<P: Prober<Key, Req>> {
    Open(Lookup<Key, Req, P>),
    Closed(LookupTable<Key, Req>),
}

impl<P: Prober<Key, Req>> DriverState<P> {
    /// Whether the driver still runs.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self, Self::Open(_))
    }

    /// The driver, while it runs.
    pub(crate) fn driver(&mut self) -> &mut Lookup<Key, Req, P> {
        match self {
            Self::Open(driver) => driver,
            Self::Closed(_) => panic!("the model called the driver after shutting it down"),
        }
    }

    /// The driver's table (its final table once shut down).
    pub(crate) fn table(&self) -> &LookupTable<Key, Req> {
        match self {
            Self::Open(driver) => driver.table(),
            Self::Closed(table) => table,
        }
    }

    /// The groups the driver (or its final table) applied since the last
    /// call, in the order it applied them.
    pub(crate) fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        match self {
            Self::Open(driver) => driver.take_applied(),
            Self::Closed(table) => table.take_applied(),
        }
    }

    /// Shuts the driver down and keeps its final table.
    pub(crate) fn shut_down(&mut self) {
        let Self::Open(driver) = std::mem::replace(self, Self::Closed(LookupTable::new())) else {
            panic!("the model shut the driver down twice");
        };
        *self = Self::Closed(driver.shutdown().expect("shutdown"));
    }
}
