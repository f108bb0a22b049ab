//! A block tier on a directory tree (local disk, NFS, any mounted file system).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::TierError;
use super::format::{self, Corruption, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use super::pool::IoPool;
use super::save::{SaveTask, finish};
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
}

impl Default for FsOptions {
    /// Two I/O threads, no data sync, blocks up to 256 MiB, symbolic links
    /// below the root not followed.
    fn default() -> Self {
        Self {
            io_threads: 2,
            sync_data: false,
            max_block_bytes: 256 << 20,
            follow_symlinks: false,
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
        let pool = IoPool::start(options.io_threads, "kvtier-fs-io")
            .map_err(|source| TierError::io("start I/O threads for", &dir, source))?;
        Ok(Self {
            inner: Arc::new(Inner {
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
    pub fn load(&self, key: &(impl BlockKey + ?Sized)) -> Result<Option<Vec<u8>>, TierError> {
        let path = self.path_of(key);
        if !name_fits(&path) {
            return Ok(None);
        }
        let follow = self.inner.follow_symlinks;
        let file = match open_for_read(&path, follow) {
            Ok(file) => file,
            Err(error) if is_absent(&error) => return Ok(None),
            Err(error) if is_link_refused(&error) => {
                return Err(TierError::NotABlock {
                    path: path.display().to_string(),
                    what: "a symbolic link",
                });
            }
            Err(error) => return Err(TierError::io("open", &path, error)),
        };
        let metadata = file
            .metadata()
            .map_err(|error| TierError::io("stat", &path, error))?;
        if !metadata.is_file() {
            return Err(TierError::NotABlock {
                path: path.display().to_string(),
                what: kind_of(&metadata.file_type()),
            });
        }
        if !follow {
            refuse_linked_shards(&path)?;
        }
        read_block(file, metadata.len(), self.inner.max_block_bytes, &path).map(Some)
    }

    /// Stores `payload` as the block for `key`, now, on this thread:
    /// written to a temporary file, then renamed into place.
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

/// Joins block names to the tier's directory in one reused buffer.
pub(super) struct PathWriter<'a> {
    dir: &'a Path,
    path: PathBuf,
}

impl<'a> PathWriter<'a> {
    pub(super) fn new(dir: &'a Path) -> Self {
        Self {
            dir,
            path: dir.to_path_buf(),
        }
    }

    /// `dir/name`.
    pub(super) fn below(&mut self, name: &str) -> &Path {
        let path = self.path.as_mut_os_string();
        path.clear();
        path.push(self.dir.as_os_str());
        self.path.push(name);
        &self.path
    }
}

/// `stat` the final file: present and a regular file. A symlink there is a
/// miss unless links are followed.
pub(super) fn exists(path: &Path, follow: bool) -> Result<bool, TierError> {
    let metadata = if follow {
        fs::metadata(path)
    } else {
        fs::symlink_metadata(path)
    };
    match metadata {
        Ok(metadata) => Ok(metadata.is_file()),
        Err(error) if is_absent(&error) => Ok(false),
        Err(error) => Err(TierError::io("stat", path, error)),
    }
}

/// Nothing there: not found, or a shard "directory" that is a file, below
/// which nothing can be stored.
pub(super) fn is_absent(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Whether the file name of a `/`-separated block path fits (see [`MAX_NAME`]).
fn relative_name_fits(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.len() <= MAX_NAME)
}

/// Whether the block's file name fits (see [`MAX_NAME`]).
fn name_fits(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name.len() <= MAX_NAME)
}

/// A temporary file of a save: `<hex>.bin.<suffix>.tmp`.
fn is_temp_name(name: &str) -> bool {
    name.ends_with(".tmp") && name.contains(".bin.")
}

/// Opens a block for reading without blocking (a FIFO opened for reading
/// waits for a writer, unless opened non-blocking) and, unless links are
/// followed, without following a link at the block's name.
pub(super) fn open_for_read(path: &Path, follow: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
        options.custom_flags(libc::O_NONBLOCK | nofollow);
    }
    #[cfg(not(unix))]
    let _ = follow;
    options.open(path)
}

/// Whether an open failed because `O_NOFOLLOW` met a link.
fn is_link_refused(error: &io::Error) -> bool {
    #[cfg(unix)]
    return error.raw_os_error() == Some(libc::ELOOP);
    #[cfg(not(unix))]
    return false;
}

/// What a non-regular file is, for errors.
pub(super) fn kind_of(kind: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Refuses `path` if it is a symbolic link.
fn refuse_link(path: &Path) -> Result<(), TierError> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_symlink() => Err(TierError::NotABlock {
            path: path.display().to_string(),
            what: "a symbolic link",
        }),
        Ok(_) => Ok(()),
        Err(error) => Err(TierError::io("stat", path, error)),
    }
}

/// Refuses a block path whose two shard directories are symbolic links:
/// the block would be read or written outside the root.
fn refuse_linked_shards(path: &Path) -> Result<(), TierError> {
    let shard = path.parent().expect("block paths have a shard directory");
    let top = shard.parent().expect("shard directories have a parent");
    refuse_link(top)?;
    refuse_link(shard)
}

/// Creates a block's two shard directories where missing (and the
/// namespace directory, should it have been removed since `open`). Unless
/// links are followed, each shard is refused if it is a link before anything
/// is created below it, so not even a directory is made outside the root.
fn create_shards(path: &Path, follow: bool) -> Result<(), TierError> {
    let shard = path.parent().expect("block paths have a shard directory");
    let top = shard.parent().expect("shard directories have a parent");
    let namespace = top.parent().expect("shards live in a namespace directory");
    fs::create_dir_all(namespace).map_err(|source| TierError::io("create", namespace, source))?;
    for dir in [top, shard] {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(TierError::io("create", dir, error)),
        }
        // guard: F6-store-refuses-linked-shards
        if !follow {
            refuse_link(dir)?;
        }
    }
    Ok(())
}

/// Reads the block in `file` (of `size` bytes): the header first, then at
/// most the payload it promises, and only once the promise is within
/// `limit` and agrees with the size.
fn read_block(file: File, size: u64, limit: u64, path: &Path) -> Result<Vec<u8>, TierError> {
    let corrupt = |kind| TierError::Corrupt {
        location: path.display().to_string(),
        kind,
    };
    let read_error = |error| TierError::io("read", path, error);
    let mut file = file;
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(read_error(error)),
        }
    }
    if got < HEADER_LEN {
        return Err(corrupt(match format::decode(&header[..got]) {
            Err(kind) => kind,
            Ok(_) => Corruption::Truncated {
                expected: HEADER_LEN as u64,
                found: got as u64,
            },
        }));
    }
    let length = format::payload_length(&header).map_err(corrupt)?;
    // guard: F5-load-checks-the-promised-length
    if length > limit {
        return Err(corrupt(Corruption::TooLarge { length, limit }));
    }
    let expected = HEADER_LEN as u64 + length;
    if size < expected {
        return Err(corrupt(Corruption::Truncated {
            expected,
            found: size,
        }));
    }
    if size > expected {
        return Err(corrupt(Corruption::Trailing {
            extra: size - expected,
        }));
    }
    let mut block = Vec::with_capacity(expected as usize);
    block.extend_from_slice(&header);
    // One byte more than promised: a file that grew since its size was
    // read shows as trailing bytes instead of being read to its end.
    file.take(length + 1)
        .read_to_end(&mut block)
        .map_err(read_error)?;
    match format::decode(&block) {
        Ok(_) => {
            block.drain(..HEADER_LEN);
            Ok(block)
        }
        Err(kind) => Err(corrupt(kind)),
    }
}

/// A suffix no other temporary name of this or another process (in this or
/// another PID namespace, on this or another host of a shared mount) is
/// likely to have: 64 bits from std's randomly keyed hasher over a
/// process-unique counter. Creation is exclusive too, so a collision is
/// retried, never shared.
fn temp_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(crate::sync::unique_id());
    hasher.finish()
}

/// Creates a new temporary file next to `path`, exclusively, named
/// `temp_name(suffix)` for a fresh random suffix (retried on a collision).
pub(super) fn create_temp(
    path: &Path,
    temp_name: impl Fn(u64) -> String,
) -> Result<(File, PathBuf), TierError> {
    let mut last_error = None;
    for _ in 0..8 {
        let tmp = path.with_file_name(temp_name(temp_suffix()));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NOFOLLOW);
        }
        match options.open(&tmp) {
            Ok(file) => return Ok((file, tmp)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(error) => return Err(TierError::io("create", &tmp, error)),
        }
    }
    let error = last_error.expect("eight attempts failed");
    Err(TierError::io("create a temporary file for", path, error))
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

/// Stats the block file of each of `keys` below `dir` on tokio's blocking
/// pool. `name` writes a key's path below `dir` into an empty string and
/// says whether such a file can exist at all; a key it says no to is a miss
/// without a call. Shared by the async lookups of the fs tier and of vLLM's
/// layout.
#[cfg(tokio_driver)]
pub(super) async fn stat_blocking<K>(
    dir: PathBuf,
    keys: &[K],
    follow: bool,
    mut name: impl FnMut(&K, &mut String) -> bool,
) -> Result<Vec<bool>, TierError> {
    // The blocking task needs owned names: all of them in one string, an
    // empty one for a key that names no file.
    let mut names = String::new();
    let mut ends = Vec::with_capacity(keys.len());
    let mut scratch = String::new();
    for key in keys {
        scratch.clear();
        if name(key, &mut scratch) {
            names.push_str(&scratch);
        }
        ends.push(names.len());
    }
    tokio::task::spawn_blocking(move || {
        let mut paths = PathWriter::new(&dir);
        let mut start = 0;
        ends.iter()
            .map(|&end| {
                let name = &names[start..end];
                start = end;
                if name.is_empty() {
                    return Ok(false);
                }
                exists(paths.below(name), follow)
            })
            .collect()
    })
    .await
    .unwrap_or_else(|join| match join.try_into_panic() {
        // The prober catches and counts it like any backend panic.
        Ok(payload) => std::panic::resume_unwind(payload),
        Err(join) => Err(TierError::io(
            "stat",
            Path::new("<group>"),
            io::Error::other(join),
        )),
    })
}
