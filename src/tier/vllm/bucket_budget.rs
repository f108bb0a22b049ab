//! The budget a bucket's stores and loads go through: this host's ledger
//! (listing reconciles), or (feature `fleet`) the fleet's books in Valkey
//! (`bucket_fleet.rs`).

#[cfg(fleet_index)]
use crate::tier::fleet::FleetBudget;
use crate::tier::object_budget::ObjectBudget;

/// A bucket's budget, as a store or load takes it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BucketBudget<'a> {
    /// This host's ledger.
    Ledger(&'a ObjectBudget),
    /// The fleet's books.
    #[cfg(fleet_index)]
    Fleet(&'a FleetBudget),
}
