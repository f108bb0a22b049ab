//! The settings of an [`FsTier`](super::FsTier), checked when it opens.

use super::error::TierError;
#[cfg(doc)]
use super::fs::FsTier;
use crate::settings::{BudgetConfig, thread_count};

/// Settings of an [`FsTier`]. Start from `FsOptions::default()` and change
/// what you need; [`FsTier::open_with`] checks them (as
/// [`validate`](Self::validate) does):
///
/// ```
/// use kvtier::tier::FsOptions;
///
/// let options = FsOptions::default().io_threads(4).sync_data(true);
/// assert_eq!(options.get_io_threads(), 4);
/// assert!(options.validate().is_ok());
/// assert!(FsOptions::default().io_threads(0).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsOptions {
    pub(super) io_threads: usize,
    pub(super) sync_data: bool,
    pub(super) max_block_bytes: u64,
    pub(super) follow_symlinks: bool,
    pub(super) budget: Option<BudgetConfig>,
}

impl Default for FsOptions {
    /// Two I/O threads, no data sync, blocks up to 256 MiB, symbolic links
    /// below the root not followed, no byte budget.
    fn default() -> Self {
        Self {
            io_threads: 2,
            sync_data: false,
            max_block_bytes: 256 << 20,
            follow_symlinks: false,
            budget: None,
        }
    }
}

impl FsOptions {
    /// Threads that run [`FsTier::save`]s (1 to
    /// [`MAX_IO_THREADS`](crate::settings::MAX_IO_THREADS)).
    pub fn io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }

    /// Whether a save flushes the block's data to stable storage before
    /// publishing it. Off by default: the tier is a cache, a block lost in
    /// a power cut is recomputed, and a block damaged by one is recognised
    /// on load by its length and checksum.
    pub fn sync_data(mut self, sync: bool) -> Self {
        self.sync_data = sync;
        self
    }

    /// The largest payload a block may have (1 byte to 1 TiB). A save of a
    /// larger one is refused; a stored header promising more is refused on
    /// load before anything is read or allocated for it.
    pub fn max_block_bytes(mut self, bytes: u64) -> Self {
        self.max_block_bytes = bytes;
        self
    }

    /// Whether symbolic links below the root (in the namespace, the shard
    /// directories, at a block's name) are followed. Off by default: a
    /// lookup of a symlinked block is a miss, and loading or storing through
    /// one is refused ([`TierError::NotABlock`]), so nothing below the root
    /// can make the tier read or write outside it. The root itself may be a
    /// link.
    pub fn follow_symlinks(mut self, follow: bool) -> Self {
        self.follow_symlinks = follow;
        self
    }

    /// A byte budget for the namespace's block files (`None`: unbounded,
    /// the default). With one, the tier opens by scanning the namespace
    /// (the newest blocks that fit are counted, older ones deleted,
    /// temporary files older than the budget's `stale_temp_age` swept), a
    /// store first gets room (evicting blocks by the budget's policy; a
    /// store that cannot is [`TierError::NoRoom`], nothing lost), a load
    /// pins its block, and the files' bytes stay at or under the capacity
    /// (see [`FsTier::capacity_stats`]).
    ///
    /// With a `rescan_interval`, the budget is reconciled with the
    /// directory that often on a thread of the tier's own. Set one when
    /// several processes (engines, hosts on one mount, the CLI) share the
    /// namespace with the same budget: each reconcile counts the blocks the
    /// others wrote and forgets those they deleted, then evicts down to the
    /// capacity, so their total stays within the capacity plus what they
    /// write in about one interval (see [`FsTier::reconcile`]). Each
    /// reconcile lists the namespace: pick an interval well above the
    /// listing's time (docs/performance.md has it at 10^6 files).
    ///
    /// ```
    /// use kvtier::FsTier;
    /// use kvtier::settings::BudgetConfig;
    /// use kvtier::tier::FsOptions;
    ///
    /// let root = tempfile::tempdir()?;
    /// // Room for two 16-byte payloads (each file adds a 16-byte header).
    /// let options = FsOptions::default().budget(Some(BudgetConfig::new(64)?));
    /// let tier = FsTier::open_with(root.path(), "ns", options)?;
    /// for key in 0u64..3 {
    ///     tier.store(&key, &[7; 16])?;
    /// }
    /// assert!(!tier.contains(&0u64)?, "the least recently used block made room");
    /// let stats = tier.capacity_stats().expect("a budget");
    /// assert_eq!((stats.resident_bytes, stats.evictions), (64, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn budget(mut self, budget: Option<BudgetConfig>) -> Self {
        self.budget = budget;
        self
    }

    /// The configured byte budget.
    pub fn get_budget(&self) -> Option<&BudgetConfig> {
        self.budget.as_ref()
    }

    /// The configured I/O threads.
    pub fn get_io_threads(&self) -> usize {
        self.io_threads
    }

    /// Whether saves sync their data.
    pub fn get_sync_data(&self) -> bool {
        self.sync_data
    }

    /// The configured largest payload.
    pub fn get_max_block_bytes(&self) -> u64 {
        self.max_block_bytes
    }

    /// Whether symbolic links below the root are followed.
    pub fn get_follow_symlinks(&self) -> bool {
        self.follow_symlinks
    }

    /// Checks every setting; the error says which is out of range and why.
    pub fn validate(&self) -> Result<(), TierError> {
        thread_count("io_threads", self.io_threads as u64)?;
        if !(1..=MAX_BLOCK_LIMIT).contains(&self.max_block_bytes) {
            return Err(TierError::Config(format!(
                "max_block_bytes is {}; it must be 1 to {MAX_BLOCK_LIMIT}",
                self.max_block_bytes
            )));
        }
        Ok(())
    }
}

/// The largest `max_block_bytes`.
const MAX_BLOCK_LIMIT: u64 = 1 << 40;
