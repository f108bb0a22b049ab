//! A block tier on a directory tree (local disk, NFS, any mounted file system).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::budget::DirBudget;
use super::error::TierError;
use super::error::{ReconcileReport, ScanReport};
#[cfg(tokio_driver)]
use super::files::stat_blocking;
use super::files::{
    PathWriter, create_shards, exists, is_absent, is_link_refused, name_fits, open_for_read,
    read_block, refuse_link, refuse_linked_shards, regular_file, relative_name_fits,
};
use super::format::{self, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use super::names::{Entry, kvtier_temp_name};
use super::pool::IoPool;
use super::rescan::Rescanner;
use super::save::{SaveTask, finish};
use super::tree::{BlockLayout, create_temp_in_shard, mark_kvtier_tier, remove_block, walk};
use crate::capacity::CapacityStats;
use crate::lookup::Backend;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

use super::files::MAX_NAME;
pub use super::fs_options::FsOptions;

struct Inner {
    budget: Option<DirBudget>,
    scan: Option<ScanReport>,
    /// Stale age of temporary files, for reconciles.
    stale_temp_age: Duration,
    /// The thread reconciling the budget, with `rescan_interval` (stopped
    /// when the last clone of the tier is dropped).
    _rescanner: Option<Rescanner>,
    root: PathBuf,
    namespace: String,
    dir: PathBuf,
    sync_data: bool,
    max_block_bytes: u64,
    follow_symlinks: bool,
    /// Save ids.
    next_save: AtomicU64,
}

/// A block tier on a directory tree:
/// `<root>/<namespace>/<hex[..3]>/<hex[3..5]>/<hex>.bin`.
///
/// - **Lookup** is "the final file exists" (one `stat`); as a
///   blocking [`Backend`] (and, with the `tokio` feature, an
///   [`AsyncBackend`](crate::lookup::AsyncBackend)) it answers groups
///   for the lookup probers.
/// - **Save** writes `<hex>.bin.<random>.tmp` (created exclusively, so two
///   tiers, processes or hosts never share one) and renames it over the
///   final name, so a reader sees either no block or a whole one, never a
///   part; a crash leaves at most a stray `.tmp` file, never a partial
///   block, and [`sweep_temp`](Self::sweep_temp) removes those.
///   [`save`](Self::save) runs on the tier's I/O threads and returns an
///   [`FsSaveTask`] for the [`SaveTracker`](crate::SaveTracker);
///   [`store`](Self::store) is the same, synchronously.
/// - **Load** reads the block and checks its header, length and checksum: a
///   truncated, foreign or damaged file is an error, not data; what it reads
///   is bounded by [`FsOptions::max_block_bytes`], and a FIFO, a device or
///   a symbolic link at a block's path is refused, never waited on or read.
/// - **Keys** name files: a key whose name does not fit a file name (over
///   115 bytes) is a miss for lookups and [`TierError::KeyTooLong`] for
///   saves, and affects no other key of its group.
///
/// The namespace separates models, configurations and ranks that must not
/// share blocks (vLLM uses model + config hash + rank), e.g.
/// `"llama-3-8b/9f2c1e/rank0"`.
///
/// ```
/// use kvtier::{FsTier, StoreTask};
///
/// let root = tempfile::tempdir()?;
/// let tier = FsTier::open(root.path(), "model-a/rank0")?;
/// assert!(!tier.contains(&42u64)?);
///
/// let task = tier.save(&42u64, b"kv block bytes".to_vec());
/// task.wait()?; // the save tracker does this for you
/// assert!(tier.contains(&42u64)?);
/// assert_eq!(tier.load(&42u64)?.as_deref(), Some(&b"kv block bytes"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct FsTier {
    inner: Arc<Inner>,
    pool: Arc<IoPool>,
}

impl std::fmt::Debug for FsTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsTier")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl FsTier {
    /// Opens the tier under `root` (which must exist and be a directory)
    /// with default options, creating the namespace directory.
    pub fn open(root: impl AsRef<Path>, namespace: &str) -> Result<Self, TierError> {
        Self::open_with(root, namespace, FsOptions::default())
    }

    /// Opens the tier with the given options.
    pub fn open_with(
        root: impl AsRef<Path>,
        namespace: &str,
        options: FsOptions,
    ) -> Result<Self, TierError> {
        let root = root.as_ref().to_path_buf();
        check_namespace(namespace).map_err(TierError::Namespace)?;
        options.validate()?;
        if !root.is_dir() {
            return Err(TierError::MissingRoot(root));
        }
        let dir = root.join(namespace);
        fs::create_dir_all(&dir).map_err(|source| TierError::io("create", &dir, source))?;
        if !options.follow_symlinks {
            let mut below = root.clone();
            for component in namespace.split('/') {
                below.push(component);
                refuse_link(&below)?;
            }
        }
        // What tells `kvtier trim` that the directory is a tier's.
        mark_kvtier_tier(&dir)?;
        let stale_temp_age = options
            .budget
            .map_or(Duration::MAX, |config| config.sweep_age());
        let (budget, scan) = match options.budget {
            None => (None, None),
            Some(config) => {
                let (budget, report) = DirBudget::scan(
                    config.capacity().get(),
                    config.policy(),
                    &dir,
                    BlockLayout::Kvtier,
                    config.sweep_age(),
                )?;
                (Some(budget), Some(report))
            }
        };
        let pool = IoPool::start(options.io_threads, "kvtier-fs-io")
            .map_err(|source| TierError::io("start I/O threads for", &dir, source))?;
        // guard: E34-a-rescan-interval-starts-the-thread
        let rescanner = match (&budget, options.budget.and_then(|c| c.rescan_interval())) {
            (Some(budget), Some(interval)) => Some(
                Rescanner::start(
                    budget.clone(),
                    dir.clone(),
                    BlockLayout::Kvtier,
                    stale_temp_age,
                    interval,
                )
                .map_err(|source| TierError::io("start the rescan thread for", &dir, source))?,
            ),
            _ => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                budget,
                scan,
                stale_temp_age,
                _rescanner: rescanner,
                root,
                namespace: namespace.to_owned(),
                dir,
                sync_data: options.sync_data,
                max_block_bytes: options.max_block_bytes,
                follow_symlinks: options.follow_symlinks,
                next_save: AtomicU64::new(0),
            }),
            pool: Arc::new(pool),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// Where the block for `key` lives (whether or not it exists).
    pub fn path_of(&self, key: &(impl BlockKey + ?Sized)) -> PathBuf {
        let mut name = String::with_capacity(48);
        push_block_path(key, &mut name);
        self.inner.dir.join(name)
    }

    /// Whether the tier holds a block for `key`: a regular file at its path
    /// (a symlink there is not followed unless the options say so).
    pub fn contains(&self, key: &(impl BlockKey + ?Sized)) -> Result<bool, TierError> {
        let path = self.path_of(key);
        if !name_fits(&path) {
            return Ok(false); // never stored: no such name can be written
        }
        exists(&path, self.inner.follow_symlinks)
    }

    /// The block for `key`: `None` if there is none; an error if the file
    /// cannot be read or is not a whole, intact kvtier block.
    ///
    /// Bounded whatever is on disk: the open never blocks (a FIFO at the
    /// path is refused, not waited on), only a regular file is read, a
    /// header promising more than `max_block_bytes` is refused before
    /// anything is read for it, a size that disagrees with the header is
    /// refused before the payload is read, and at most the promised length
    /// is read.
    ///
    /// With a byte budget the block is pinned while it is read (not
    /// evicted meanwhile), and a block found missing or damaged leaves the
    /// budget's books (a damaged file is deleted: the next store of the key
    /// writes it whole).
    pub fn load(&self, key: &(impl BlockKey + ?Sized)) -> Result<Option<Vec<u8>>, TierError> {
        let path = self.path_of(key);
        if !name_fits(&path) {
            return Ok(None);
        }
        let Some(budget) = &self.inner.budget else {
            return self.load_from(&path);
        };
        // guard: E17-a-load-pins-its-block
        let pin = budget.pin(&path);
        let loaded = self.load_from(&path);
        match &loaded {
            Ok(None) => budget.lose(&path),
            Err(TierError::Corrupt { .. }) => {
                let _ = fs::remove_file(&path);
                budget.lose(&path);
            }
            _ => {}
        }
        drop(pin);
        loaded
    }

    fn load_from(&self, path: &Path) -> Result<Option<Vec<u8>>, TierError> {
        let follow = self.inner.follow_symlinks;
        let file = match open_for_read(path, follow) {
            Ok(file) => file,
            Err(error) if is_absent(&error) => return Ok(None),
            Err(error) if is_link_refused(&error) => {
                return Err(TierError::NotABlock {
                    path: path.display().to_string(),
                    what: "a symbolic link",
                });
            }
            Err(error) => return Err(TierError::io("open", path, error)),
        };
        let metadata = regular_file(&file, path)?;
        if !follow {
            refuse_linked_shards(path)?;
        }
        read_block(file, metadata.len(), self.inner.max_block_bytes, path).map(Some)
    }

    /// The byte budget's counters and gauges (`None` without a budget):
    /// resident and reserved bytes, evictions, refusals by reason, ENOSPC,
    /// startup trims. Reading them costs the same at any size.
    pub fn capacity_stats(&self) -> Option<CapacityStats> {
        self.inner.budget.as_ref().map(DirBudget::stats)
    }

    /// What the budget's startup scan found and did (`None` without a
    /// budget).
    pub fn scan_report(&self) -> Option<&ScanReport> {
        self.inner.scan.as_ref()
    }

    /// Sets the byte budget to `capacity` and deletes blocks (by the
    /// policy) until the tier's files fit it; blocks being read or written
    /// stay until those end. Returns how many were deleted. An error when
    /// the tier was opened without a budget.
    pub fn trim(&self, capacity: u64) -> Result<usize, TierError> {
        match &self.inner.budget {
            Some(budget) => Ok(budget.trim(capacity)),
            None => Err(TierError::Config(
                "the tier has no byte budget to trim to (FsOptions::capacity_bytes)".into(),
            )),
        }
    }

    /// Lists the namespace and reconciles the byte budget with it, now, on
    /// this thread: blocks that other processes sharing the namespace wrote
    /// are counted, blocks they deleted are forgotten, and the least
    /// valuable are deleted until the books fit the capacity (temporary
    /// files of dead writers are swept too). What
    /// a budget's `rescan_interval` runs on a thread. An error without a
    /// budget, or when the namespace cannot be listed.
    ///
    /// ```
    /// use kvtier::FsTier;
    /// use kvtier::settings::BudgetConfig;
    /// use kvtier::tier::FsOptions;
    ///
    /// let root = tempfile::tempdir()?;
    /// let budget = || FsOptions::default().budget(Some(BudgetConfig::new(300).unwrap()));
    /// let (a, b) = (
    ///     FsTier::open_with(root.path(), "ns", budget())?,
    ///     FsTier::open_with(root.path(), "ns", budget())?,
    /// );
    /// for key in 0u64..3 {
    ///     a.store(&key, &[0; 84])?; // 100 bytes with the header
    ///     b.store(&(key + 10), &[0; 84])?;
    /// }
    /// // Each counts its own 300 bytes: 600 in the namespace.
    /// let report = a.reconcile()?;
    /// assert_eq!((report.adopted, report.evicted), (3, 3));
    /// assert_eq!(a.capacity_stats().unwrap().resident_bytes, 300);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconcile(&self) -> Result<ReconcileReport, TierError> {
        match &self.inner.budget {
            Some(budget) => budget.reconcile(
                &self.inner.dir,
                BlockLayout::Kvtier,
                self.inner.stale_temp_age,
            ),
            None => Err(TierError::Config(
                "the tier has no byte budget to reconcile (FsOptions::budget)".into(),
            )),
        }
    }

    /// Stores `payload` as the block for `key`, now, on this thread:
    /// written to a temporary file, then renamed into place. With a byte
    /// budget, room is made first ([`TierError::NoRoom`] when it cannot
    /// be), and a block the budget holds whose file is in place is not
    /// written again.
    pub fn store(&self, key: &(impl BlockKey + ?Sized), payload: &[u8]) -> Result<(), TierError> {
        write_block(&self.inner, &self.path_of(key), payload)
    }

    /// Stores `payload` as the block for `key` on the tier's I/O threads;
    /// the returned task completes when the block is published (or the write
    /// failed). Save ids count up from 0 per tier.
    pub fn save(&self, key: &(impl BlockKey + ?Sized), payload: Vec<u8>) -> FsSaveTask {
        let path = self.path_of(key);
        let id = self.inner.next_save.fetch_add(1, Ordering::Relaxed);
        let inner = self.inner.clone();
        let job_path = path.clone();
        let (task, completer) = SaveTask::start(id, path);
        self.pool.submit(Box::new(move || {
            finish(completer, write_block(&inner, &job_path, &payload));
        }));
        task
    }

    /// Removes the temporary files of saves that never finished (a process
    /// killed mid-save leaves one behind) last modified more than
    /// `older_than` ago; returns how many it removed.
    ///
    /// A live save writes its temporary file and renames it within one
    /// write, so its file is younger than any sensible `older_than` (an
    /// hour, say; longer than the slowest save on a slow mount): a file that
    /// old belongs to no live writer. If one did, its rename fails and its
    /// save reports an error; no block is ever damaged. Only names of the
    /// form `<block>.bin.<suffix>.tmp` in the shard directories are
    /// touched, and links are not followed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kvtier::FsTier;
    ///
    /// let root = tempfile::tempdir()?;
    /// let tier = FsTier::open(root.path(), "ns")?;
    /// assert_eq!(tier.sweep_temp(Duration::from_secs(3600))?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep_temp(&self, older_than: Duration) -> Result<usize, TierError> {
        let cutoff = SystemTime::now().checked_sub(older_than);
        let mut removed = 0;
        let mut failed = None;
        walk(&self.inner.dir, BlockLayout::Kvtier, false, |file| {
            let old = match (file.metadata.modified(), cutoff) {
                (Ok(modified), Some(cutoff)) => modified < cutoff,
                _ => false,
            };
            if file.entry != Entry::Temp || !old || failed.is_some() {
                return;
            }
            match remove_block(&file.path) {
                Ok(()) => removed += 1,
                Err(error) => failed = Some(TierError::io("remove", &file.path, error)),
            }
        })?;
        if let Some(error) = failed {
            return Err(error);
        }
        if removed > 0 {
            tracing::info!(removed, dir = %self.inner.dir.display(), "removed stray temporary files");
        }
        Ok(removed)
    }
}

fn write_block(inner: &Inner, path: &Path, payload: &[u8]) -> Result<(), TierError> {
    let name = path
        .file_name()
        .expect("block paths have a name")
        .to_string_lossy();
    if name.len() > MAX_NAME {
        return Err(TierError::KeyTooLong {
            name: name.chars().take(16).collect(),
            length: name.len(),
            limit: MAX_NAME,
        });
    }
    if payload.len() as u64 > inner.max_block_bytes {
        return Err(TierError::Config(format!(
            "a {}-byte block is above the tier's {}-byte limit (FsOptions::max_block_bytes)",
            payload.len(),
            inner.max_block_bytes
        )));
    }
    // guard: E18-a-store-gets-room-before-it-writes
    let Some(budget) = &inner.budget else {
        return write_file(inner, path, &name, payload);
    };
    let bytes = HEADER_LEN as u64 + payload.len() as u64;
    budget.store(path, bytes, || write_file(inner, path, &name, payload))
}

/// Writes the block's temporary file and renames it into place.
fn write_file(inner: &Inner, path: &Path, name: &str, payload: &[u8]) -> Result<(), TierError> {
    // guard: F1-atomic-publish
    let (mut file, tmp) = create_temp_in_shard(
        path,
        || create_shards(path, inner.follow_symlinks),
        |suffix| kvtier_temp_name(name, suffix),
    )?;
    let written = (|| {
        // Header and payload written separately: the payload is not copied.
        file.write_all(&format::header(payload))?;
        file.write_all(payload)?;
        if inner.sync_data {
            file.sync_data()?;
        }
        drop(file);
        // guard: F1-atomic-publish
        fs::rename(&tmp, path)
    })();
    written.map_err(|source| {
        // guard: F3-failed-write-cleans-up
        let _ = fs::remove_file(&tmp);
        TierError::io("write", path, source)
    })
}

/// A save running on an [`FsTier`]'s I/O threads; its location is the
/// block's final path. `wait` returns once the block is published, or with
/// the write's error (the temporary file removed, no block visible).
pub type FsSaveTask = SaveTask<PathBuf>;

/// Answers a group with one `stat` per key. An I/O error other than "not
/// found" fails the whole group (its keys become misses, and the error is
/// logged and counted by the prober).
impl<K: BlockKey, R> Backend<K, R> for FsTier {
    type Answers = Vec<bool>;
    type Error = TierError;

    fn batch_lookup(&mut self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        let mut paths = PathWriter::new(&self.inner.dir);
        let mut name = String::new();
        let follow = self.inner.follow_symlinks;
        keys.iter()
            .map(|key| {
                name.clear();
                push_block_path(key, &mut name);
                // guard: F7-a-long-key-fails-alone
                if !relative_name_fits(&name) {
                    return Ok(false); // only this key: no such block can exist
                }
                exists(paths.below(&name), follow)
            })
            .collect()
    }
}

/// Answers a group on tokio's blocking pool, so a hung mount holds a
/// blocking thread, not a runtime worker, and the prober's timeout still
/// fires.
#[cfg(tokio_driver)]
impl<K, R> crate::lookup::AsyncBackend<K, R> for FsTier
where
    K: BlockKey + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        let follow = self.inner.follow_symlinks;
        stat_blocking(self.inner.dir.clone(), keys, follow, |key, name| {
            push_block_path(key, name);
            relative_name_fits(name)
        })
        .await
    }
}
