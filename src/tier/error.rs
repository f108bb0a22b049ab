//! What tier operations report: their error, and what a budgeted tier's
//! scans and reconciles found.

use std::path::{Path, PathBuf};

use super::format::Corruption;

/// What a budgeted tier's startup scan found and did (a directory's, or an
/// object tier's prefix).
#[cfg(tiers)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScanReport {
    /// Blocks counted as resident.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Older blocks deleted because the newer ones fill the capacity.
    pub trimmed: u64,
    /// Temporary files of dead writers deleted (directories only).
    pub swept: u64,
    /// Files the scan meant to delete (blocks over the capacity, stale
    /// temporary files) and could not: they stay on disk, and their blocks
    /// in the books.
    pub failed: u64,
    /// The first of those (at most [`ScanReport::FAILURES_KEPT`]), each as
    /// `<path>: <why>`.
    pub failures: Vec<String>,
    /// How long the scan took.
    pub elapsed: std::time::Duration,
}

#[cfg(tiers)]
impl ScanReport {
    /// How many failed deletions a report names (it counts them all).
    pub const FAILURES_KEPT: usize = 16;

    /// Counts a deletion of `what` that failed, and names it while there
    /// is room.
    pub(crate) fn failed_to_delete(
        &mut self,
        what: impl std::fmt::Display,
        error: impl std::fmt::Display,
    ) {
        self.failed += 1;
        if self.failures.len() < Self::FAILURES_KEPT {
            self.failures.push(format!("{what}: {error}"));
        }
    }
}

/// What one reconcile of a tier's budget with its directory did (see
/// [`FsTier::reconcile`](crate::tier::FsTier::reconcile)): the books brought in line with the blocks other
/// processes wrote and deleted.
#[cfg(tiers)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Blocks found that the budget did not count: another process wrote
    /// them.
    pub adopted: u64,
    /// Blocks the budget counted that were gone: another process deleted
    /// them.
    pub forgotten: u64,
    /// Blocks deleted to bring the books back within the capacity.
    pub evicted: u64,
    /// Temporary files of dead writers deleted.
    pub swept: u64,
    /// How long it took.
    pub elapsed: std::time::Duration,
}

/// Why a tier operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The root directory given to a file-system tier is missing or is not
    /// a directory.
    #[error("tier root {} does not exist or is not a directory", .0.display())]
    MissingRoot(PathBuf),
    /// The namespace could climb out of the tier or is malformed.
    #[error("invalid namespace: {0}")]
    Namespace(String),
    /// A setting is out of range, or a location cannot be used.
    #[error("invalid tier configuration: {0}")]
    Config(String),
    /// A file-system operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// To which path.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The object store refused or failed an operation.
    #[error("object store cannot {op} {location}: {source}")]
    Store {
        /// What was being done.
        op: &'static str,
        /// The object's location.
        location: String,
        /// The store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// What is at a block's path is not a regular file (a FIFO, a device, a
    /// directory) or is a symbolic link the tier does not follow.
    #[error("{path} is {what}, not a block file")]
    NotABlock {
        /// The path.
        path: String,
        /// What is there instead.
        what: &'static str,
    },
    /// A key whose block name would not fit a file name.
    #[error("key {name:.16}... names a {length}-character block file; at most {limit} fit")]
    KeyTooLong {
        /// The start of the block's name.
        name: String,
        /// Characters of the name.
        length: usize,
        /// The longest name the tier writes.
        limit: usize,
    },
    /// A key that cannot name a block in the tier's layout (a vLLM key
    /// shorter than a hash and its group index).
    #[error("a {length}-byte key names no block: {reason}")]
    KeyFormat {
        /// Bytes in the key.
        length: usize,
        /// What the layout expects.
        reason: &'static str,
    },
    /// A store found no room in the tier's byte budget
    /// ([`FsOptions::budget`](crate::tier::FsOptions::budget)): nothing was written, and every
    /// block already stored stays.
    #[error("no room for {bytes} bytes of {path} in a {capacity}-byte tier: {reason}")]
    NoRoom {
        /// The block's path.
        path: String,
        /// The block's bytes.
        bytes: u64,
        /// The tier's capacity.
        capacity: u64,
        /// Why.
        reason: crate::capacity::Rejection,
    },
    /// A directory a tool was pointed at is not a tier's directory of the
    /// layout named: it refuses to count or delete anything below it.
    #[error("{dir} is not a tier directory of the {layout} layout: {missing}")]
    NotATier {
        /// The directory.
        dir: String,
        /// The layout it was taken for.
        layout: &'static str,
        /// What a tier's directory has and this one lacks.
        missing: String,
    },
    /// The fleet's books (Valkey or Redis, [`tier::fleet`](crate::tier::fleet))
    /// did not answer, are being rebuilt, or refused the step: nothing was
    /// written or loaded through them.
    #[error("fleet index: {op}: {detail}")]
    Index {
        /// The step.
        op: &'static str,
        /// What happened.
        detail: String,
    },
    /// Stored bytes are not a whole, intact block.
    #[error("block {location} is damaged: {kind}")]
    Corrupt {
        /// The file or object.
        location: String,
        /// What is wrong with it.
        kind: Corruption,
    },
}

impl TierError {
    #[cfg_attr(not(fs_tier), allow(dead_code))]
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }
}

impl From<crate::settings::SettingError> for TierError {
    fn from(error: crate::settings::SettingError) -> Self {
        TierError::Config(error.to_string())
    }
}
