//! A block tier on a directory tree (local disk, NFS, any mounted file system).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::TierError;
use super::format::{self, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use super::pool::IoPool;
use crate::lookup::LookupBackend;
use crate::save::{CompletionTask, StoreTask, TaskError};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

/// Settings of an [`FsTier`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsOptions {
    /// Threads that run [`FsTier::save`]s (at least 1). Default 2.
    pub io_threads: usize,
    /// Whether a save flushes the block's data to stable storage before
    /// publishing it. Default `false`: the tier is a cache, a block lost in
    /// a power cut is recomputed, and a block damaged by one is recognised
    /// on load by its length and checksum.
    pub sync_data: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            io_threads: 2,
            sync_data: false,
        }
    }
}

struct Inner {
    root: PathBuf,
    namespace: String,
    dir: PathBuf,
    sync_data: bool,
    /// Save ids, and unique names for temporary files.
    next_save: AtomicU64,
}

/// A block tier on a directory tree:
/// `<root>/<namespace>/<hex[..3]>/<hex[3..5]>/<hex>.bin`.
///
/// - **Lookup** is "the final file exists" (one `stat`); as a
///   [`LookupBackend`] (and, with the `tokio` feature, an
///   [`AsyncLookupBackend`](crate::AsyncLookupBackend)) it answers groups
///   for the lookup drivers.
/// - **Save** writes `<hex>.bin.<unique>.tmp` and renames it over the final
///   name, so a reader sees either no block or a whole one, never a part;
///   a crash leaves at most a stray `.tmp` file, never a partial block.
///   [`save`](Self::save) runs on the tier's I/O threads and returns an
///   [`FsSaveTask`] for the [`SaveTracker`](crate::SaveTracker);
///   [`store`](Self::store) is the same, synchronously.
/// - **Load** reads the block and checks its header, length and checksum: a
///   truncated, foreign or damaged file is an error, not data.
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
        if options.io_threads == 0 {
            return Err(TierError::Config("io_threads must be at least 1".into()));
        }
        if !root.is_dir() {
            return Err(TierError::MissingRoot(root));
        }
        let dir = root.join(namespace);
        fs::create_dir_all(&dir).map_err(|source| TierError::io("create", &dir, source))?;
        let pool = IoPool::start(options.io_threads, "kvtier-fs-io")
            .map_err(|source| TierError::io("start I/O threads for", &dir, source))?;
        Ok(Self {
            inner: Arc::new(Inner {
                root,
                namespace: namespace.to_owned(),
                dir,
                sync_data: options.sync_data,
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

    /// Whether the tier holds a block for `key`.
    pub fn contains(&self, key: &(impl BlockKey + ?Sized)) -> Result<bool, TierError> {
        exists(&self.path_of(key))
    }

    /// The block for `key`: `None` if there is none; an error if the file
    /// cannot be read or is not a whole, intact kvtier block.
    pub fn load(&self, key: &(impl BlockKey + ?Sized)) -> Result<Option<Vec<u8>>, TierError> {
        let path = self.path_of(key);
        let mut bytes = Vec::new();
        match File::open(&path).and_then(|mut file| file.read_to_end(&mut bytes)) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(TierError::io("read", &path, error)),
        }
        match format::decode(&bytes) {
            Ok(_) => {
                bytes.drain(..HEADER_LEN);
                Ok(Some(bytes))
            }
            Err(kind) => Err(TierError::Corrupt {
                location: path.display().to_string(),
                kind,
            }),
        }
    }

    /// Stores `payload` as the block for `key`, now, on this thread:
    /// written to a temporary file, then renamed into place.
    pub fn store(&self, key: &(impl BlockKey + ?Sized), payload: &[u8]) -> Result<(), TierError> {
        let path = self.path_of(key);
        let unique = self.inner.next_save.fetch_add(1, Ordering::Relaxed);
        write_block(&path, unique, payload, self.inner.sync_data)
    }

    /// Stores `payload` as the block for `key` on the tier's I/O threads;
    /// the returned task completes when the block is published (or the write
    /// failed). Save ids count up from 0 per tier.
    pub fn save(&self, key: &(impl BlockKey + ?Sized), payload: Vec<u8>) -> FsSaveTask {
        let path = self.path_of(key);
        let id = self.inner.next_save.fetch_add(1, Ordering::Relaxed);
        let (task, completer) = CompletionTask::new(());
        let sync_data = self.inner.sync_data;
        let job_path = path.clone();
        self.pool.submit(Box::new(move || {
            match write_block(&job_path, id, &payload, sync_data) {
                Ok(()) => completer.succeed(),
                Err(error) => completer.fail(TaskError::Failed(Box::new(error))),
            }
        }));
        FsSaveTask { id, path, task }
    }
}

/// Joins block names to the tier's directory in one reused buffer.
struct PathWriter<'a> {
    dir: &'a Path,
    path: PathBuf,
}

impl<'a> PathWriter<'a> {
    fn new(dir: &'a Path) -> Self {
        Self {
            dir,
            path: dir.to_path_buf(),
        }
    }

    /// `dir/name`.
    fn below(&mut self, name: &str) -> &Path {
        let path = self.path.as_mut_os_string();
        path.clear();
        path.push(self.dir.as_os_str());
        self.path.push(name);
        &self.path
    }
}

/// `stat` the final file: present and a regular file.
fn exists(path: &Path) -> Result<bool, TierError> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(metadata.is_file()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        // A shard "directory" that is a file: nothing can be stored below it.
        Err(error) if error.kind() == io::ErrorKind::NotADirectory => Ok(false),
        Err(error) => Err(TierError::io("stat", path, error)),
    }
}

fn write_block(path: &Path, unique: u64, payload: &[u8], sync_data: bool) -> Result<(), TierError> {
    let parent = path.parent().expect("block paths have a parent");
    fs::create_dir_all(parent).map_err(|source| TierError::io("create", parent, source))?;
    let name = path
        .file_name()
        .expect("block paths have a name")
        .to_string_lossy();
    let tmp = path.with_file_name(format!("{name}.{}-{unique}.tmp", std::process::id()));
    let written = (|| {
        let mut file = File::create(&tmp)?;
        // Header and payload written separately: the payload is not copied.
        file.write_all(&format::header(payload))?;
        file.write_all(payload)?;
        if sync_data {
            file.sync_data()?;
        }
        drop(file);
        fs::rename(&tmp, path)
    })();
    written.map_err(|source| {
        let _ = fs::remove_file(&tmp);
        TierError::io("write", path, source)
    })
}

/// A save running on an [`FsTier`]'s I/O threads: a [`StoreTask`] for the
/// [`SaveTracker`](crate::SaveTracker). `check` never blocks; `wait` returns
/// once the block is published, or with the write's error (the temporary
/// file removed, no block visible).
#[derive(Debug)]
pub struct FsSaveTask {
    id: u64,
    path: PathBuf,
    task: CompletionTask<()>,
}

impl FsSaveTask {
    /// This save's id: saves of one tier are numbered 0, 1, 2, ...
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The block's final path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl StoreTask for FsSaveTask {
    fn check(&self) -> bool {
        self.task.check()
    }

    fn wait(self) -> Result<(), TaskError> {
        self.task.wait()
    }
}

/// Answers a group with one `stat` per key. An I/O error other than "not
/// found" fails the whole group (its keys become misses, and the error is
/// logged and counted by the driver).
impl<K: BlockKey, R> LookupBackend<K, R> for FsTier {
    type Answers = Vec<bool>;
    type Error = TierError;

    fn batch_lookup(&mut self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        let mut paths = PathWriter::new(&self.inner.dir);
        let mut name = String::new();
        keys.iter()
            .map(|key| {
                name.clear();
                push_block_path(key, &mut name);
                exists(paths.below(&name))
            })
            .collect()
    }
}

/// Answers a group on tokio's blocking pool, so a hung mount holds a
/// blocking thread, not a runtime worker, and the driver's timeout still
/// fires.
#[cfg(feature = "tokio")]
impl<K, R> crate::AsyncLookupBackend<K, R> for FsTier
where
    K: BlockKey + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        // The blocking task needs owned names: all of them in one string.
        let mut names = String::new();
        let mut ends = Vec::with_capacity(keys.len());
        for key in keys {
            push_block_path(key, &mut names);
            ends.push(names.len());
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut paths = PathWriter::new(&inner.dir);
            let mut start = 0;
            ends.iter()
                .map(|&end| {
                    let name = &names[start..end];
                    start = end;
                    exists(paths.below(name))
                })
                .collect()
        })
        .await
        .unwrap_or_else(|join| match join.try_into_panic() {
            // The driver catches and counts it like any backend panic.
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(join) => Err(TierError::io(
                "stat",
                Path::new("<group>"),
                io::Error::other(join),
            )),
        })
    }
}
