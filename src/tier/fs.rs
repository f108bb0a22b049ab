//! A block tier on a directory tree (local disk, NFS, any mounted file system).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::ScanReport;
use super::TierError;
use super::budget::{BlockLayout, DirBudget};
#[cfg(tokio_driver)]
use super::files::stat_blocking;
use super::files::{
    PathWriter, create_shards, create_temp, exists, is_absent, is_link_refused, is_temp_name,
    kind_of, name_fits, open_for_read, read_block, refuse_link, refuse_linked_shards,
    relative_name_fits,
};
use super::format::{self, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use super::pool::IoPool;
use super::save::{SaveTask, finish};
use crate::capacity::{CapacityStats, Policy};
use crate::lookup::Backend;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The most I/O threads a tier starts.
use super::MAX_IO_THREADS;

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
    io_threads: usize,
    sync_data: bool,
    max_block_bytes: u64,
    follow_symlinks: bool,
    capacity_bytes: Option<u64>,
    policy: Policy,
    stale_temp_age: Duration,
}

impl Default for FsOptions {
    /// Two I/O threads, no data sync, blocks up to 256 MiB, symbolic links
    /// below the root not followed, no byte budget (LRU when one is set),
    /// temporary files older than 10 minutes swept when a budget's scan
    /// runs.
    fn default() -> Self {
        Self {
            io_threads: 2,
            sync_data: false,
            max_block_bytes: 256 << 20,
            follow_symlinks: false,
            capacity_bytes: None,
            policy: Policy::Lru,
            stale_temp_age: Duration::from_secs(600),
        }
    }
}

impl FsOptions {
    /// Threads that run [`FsTier::save`]s (1 to 1024).
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
    /// (the newest blocks that fit are counted, older ones deleted, stale
    /// temporary files swept), a store first gets room (evicting blocks by
    /// the [`policy`](Self::policy); a store that cannot is
    /// [`TierError::NoRoom`], nothing lost), a load pins its block, and the
    /// files' bytes stay at or under the budget (see
    /// [`FsTier::capacity_stats`]).
    ///
    /// ```
    /// use kvtier::FsTier;
    /// use kvtier::tier::FsOptions;
    ///
    /// let root = tempfile::tempdir()?;
    /// // Room for two 16-byte payloads (each file adds a 16-byte header).
    /// let tier = FsTier::open_with(root.path(), "ns", FsOptions::default().capacity_bytes(Some(64)))?;
    /// for key in 0u64..3 {
    ///     tier.store(&key, &[7; 16])?;
    /// }
    /// assert!(!tier.contains(&0u64)?, "the least recently used block made room");
    /// let stats = tier.capacity_stats().expect("a budget");
    /// assert_eq!((stats.resident_bytes, stats.evictions), (64, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity_bytes(mut self, capacity: Option<u64>) -> Self {
        self.capacity_bytes = capacity;
        self
    }

    /// Which blocks a full budget evicts first (LRU by default).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How old a temporary file must be for the budget's startup scan to
    /// delete it as a dead writer's (10 minutes by default; longer than
    /// the slowest store on the mount, since a younger file may be a live
    /// writer's in another process).
    pub fn stale_temp_age(mut self, age: Duration) -> Self {
        self.stale_temp_age = age;
        self
    }

    /// The configured byte budget.
    pub fn get_capacity_bytes(&self) -> Option<u64> {
        self.capacity_bytes
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
        if !(1..=MAX_IO_THREADS).contains(&self.io_threads) {
            return Err(TierError::Config(format!(
                "io_threads is {}; it must be 1 to {MAX_IO_THREADS}",
                self.io_threads
            )));
        }
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

/// What a temporary name adds to a block's name: `.<16 hex digits>.tmp`.
const TEMP_SUFFIX: usize = 1 + 16 + 4;

/// The longest block file name a tier reads or writes: its temporary name
/// must still fit the 255-byte name limit of common file systems. Keys of
/// up to 115 bytes (230 hex digits, `.bin`) fit.
pub(crate) const MAX_NAME: usize = 255 - TEMP_SUFFIX;

struct Inner {
    budget: Option<DirBudget>,
    scan: Option<ScanReport>,
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
        let (budget, scan) = match options.capacity_bytes {
            None => (None, None),
            Some(capacity) => {
                let naming = BlockLayout::Kvtier.naming();
                let (budget, report) = DirBudget::scan(
                    capacity,
                    options.policy,
                    &dir,
                    &naming,
                    options.stale_temp_age,
                )?;
                (Some(budget), Some(report))
            }
        };
        let pool = IoPool::start(options.io_threads, "kvtier-fs-io")
            .map_err(|source| TierError::io("start I/O threads for", &dir, source))?;
        Ok(Self {
            inner: Arc::new(Inner {
                budget,
                scan,
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
        let metadata = file
            .metadata()
            .map_err(|error| TierError::io("stat", path, error))?;
        if !metadata.is_file() {
            return Err(TierError::NotABlock {
                path: path.display().to_string(),
                what: kind_of(&metadata.file_type()),
            });
        }
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
        let mut dirs = vec![(self.inner.dir.clone(), 0)];
        while let Some((dir, depth)) = dirs.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if is_absent(&error) => continue,
                Err(error) => return Err(TierError::io("list", &dir, error)),
            };
            for entry in entries {
                let entry = entry.map_err(|error| TierError::io("list", &dir, error))?;
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = entry.path();
                if kind.is_dir() && depth < 2 {
                    dirs.push((path, depth + 1));
                    continue;
                }
                let name = entry.file_name();
                if depth != 2 || !kind.is_file() || !is_temp_name(&name.to_string_lossy()) {
                    continue;
                }
                let old = match (entry.metadata().and_then(|m| m.modified()), cutoff) {
                    (Ok(modified), Some(cutoff)) => modified < cutoff,
                    _ => false,
                };
                if old {
                    match fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(error) if is_absent(&error) => {} // renamed meanwhile
                        Err(error) => return Err(TierError::io("remove", &path, error)),
                    }
                }
            }
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
    create_shards(path, inner.follow_symlinks)?;
    // guard: F1-atomic-publish
    let (mut file, tmp) = create_temp(path, |suffix| format!("{name}.{suffix:016x}.tmp"))?;
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
