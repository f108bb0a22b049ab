//! Secondary tiers that store KV blocks: a directory tree ([`FsTier`],
//! feature `fs`) and any `object_store` backend ([`ObjectTier`], feature
//! `object-store`: S3 and S3-compatible servers, local files, memory).
//!
//! [`VllmFsLayout`] (feature `fs`) reads the layout of vLLM's own fs tier,
//! for lookups of the blocks vLLM wrote; [`VllmTransfers`] stores and loads
//! vLLM's raw block files between the primary tier's memory
//! ([`PrimaryRegion`]) and that layout.
//!
//! kvtier's two tiers name a block the same way (`<namespace>/<hex[..3]>/<hex[3..5]>/<hex>.bin`,
//! see [`BlockKey`]) and store it in the same checked format (a header with
//! length and CRC-32), answer lookup groups for the drivers, and hand out
//! save tasks for the [`SaveTracker`](crate::SaveTracker).

#[cfg(fs_tier)]
pub(crate) mod budget;
mod error;
#[cfg(fs_tier)]
mod files;
pub(crate) mod format;
#[cfg(fs_tier)]
mod fs;
#[cfg(fs_tier)]
mod fs_options;
mod key;
#[cfg(tiers)]
mod names;
#[cfg(object_tier)]
mod object;
#[cfg(object_tier)]
mod object_budget;
#[cfg(object_tier)]
mod object_budgeted;
#[cfg(fleet_index)]
mod object_fleet;
#[cfg(fleet_index)]
mod object_indexed;
#[cfg(object_tier)]
mod objects;
#[cfg(fs_tier)]
pub(crate) mod pool;
#[cfg(fs_tier)]
mod rescan;
#[cfg(fs_tier)]
mod tree;

/// Equality and hashing by the `id` field alone: a transfer job as a
/// [`SaveTracker`](crate::SaveTracker) holds it (its other fields describe
/// it, they do not name it).
#[cfg(fs_tier)]
macro_rules! identified_by_id {
    ($job:ty) => {
        impl PartialEq for $job {
            fn eq(&self, other: &Self) -> bool {
                self.id == other.id
            }
        }

        impl Eq for $job {}

        impl std::hash::Hash for $job {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.id.hash(state);
            }
        }
    };
}
#[cfg(fs_tier)]
pub(crate) use identified_by_id;
pub mod fleet;
#[cfg(object_tier)]
mod s3;
mod save;
#[cfg(fs_tier)]
mod vllm;

#[cfg(fs_tier)]
pub use budget::scan_directory;
#[cfg(tiers)]
pub use error::ReconcileReport;
#[cfg(tiers)]
pub use error::ScanReport;
pub use error::TierError;
pub use format::Corruption;
#[cfg(fs_tier)]
pub use fs::{FsOptions, FsSaveTask, FsTier};
pub use key::{BlockKey, check_namespace};
#[cfg(object_tier)]
pub use object::{ObjectSaveTask, ObjectTier, ObjectTierStats};
#[cfg(object_tier)]
pub use s3::S3Options;
#[cfg(object_tier)]
pub use s3::profile::aws_file_section;
#[cfg(object_tier)]
pub use s3::uploads::{StaleUploads, Upload, UploadPage, parse_upload_page};
pub use save::SaveTask;
#[cfg(fs_tier)]
pub use tree::{BlockLayout, KVTIER_TIER_MARK, check_tier_dir};
#[cfg(fs_tier)]
pub use vllm::{
    FinishedTransfer, InFlightTransfer, PrimaryRegion, ShutdownReport, TransferError, TransferKind,
    VllmFsLayout, VllmTransfers,
};
#[cfg(fs_tier)]
#[cfg(object_tier)]
pub use vllm::{VllmObjectLayout, VllmObjectStats};
