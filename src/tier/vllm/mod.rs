//! vLLM's file-system tier, natively: its layout ([`VllmFsLayout`], the
//! lookups over the blocks vLLM wrote) and its transfers
//! ([`VllmTransfers`]: stores and loads of vLLM's raw block files between
//! the primary tier's memory, a [`PrimaryRegion`], and the layout, off the
//! GIL and polled without blocking).
//!
//! `layout` names the files (`bucket` the objects, in an object store);
//! `home` is the directory or the bucket a job's blocks go to; `job` is
//! one job's kind, progress and I/O; `blocks` reads and writes one file; `region`
//! is the memory and the claims that keep two transfers off one block;
//! `transfers` runs the jobs and reports them through the save core;
//! `changes` tells the tier's lookups which blocks came and went;
//! `budgeted` bounds the directory's bytes; `books` holds what those two keep.

mod blocks;
mod books;
#[cfg(object_tier)]
mod bucket;
#[cfg(object_tier)]
mod bucket_budget;
#[cfg(fleet_index)]
mod bucket_fleet;
mod budgeted;
mod changes;
#[cfg(fleet_index)]
mod fleet;
#[cfg(fleet_index)]
mod fleet_lookups;
mod home;
mod job;
mod layout;
mod region;
mod transfers;

#[cfg(object_tier)]
pub use bucket::{VllmObjectLayout, VllmObjectStats};
pub use job::TransferKind;
pub use layout::VllmFsLayout;
pub(crate) use layout::{is_vllm_dir, vllm_entry};
pub use region::PrimaryRegion;
pub use transfers::{
    FinishedTransfer, InFlightTransfer, ShutdownReport, TransferError, VllmTransfers,
};
