//! The file operations the directory tiers share (kvtier's `FsTier` and
//! vLLM's layout): stat a block, open one for reading without blocking or
//! following links, read and check a block file, create a temporary file
//! exclusively, refuse links below the root, stat a group's blocks on
//! tokio's blocking pool.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::error::TierError;
use super::format::{self, Corruption, HEADER_LEN};

/// What a temporary name adds to a block's name: `.<16 hex digits>.tmp`.
const TEMP_SUFFIX: usize = 1 + 16 + 4;

/// The longest block file name a tier reads or writes: its temporary name
/// must still fit the 255-byte name limit of common file systems. Keys of
/// up to 115 bytes (230 hex digits, `.bin`) fit.
pub(crate) const MAX_NAME: usize = 255 - TEMP_SUFFIX;

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
pub(super) fn relative_name_fits(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.len() <= MAX_NAME)
}

/// Whether the block's file name fits (see [`MAX_NAME`]).
pub(super) fn name_fits(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name.len() <= MAX_NAME)
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
pub(super) fn is_link_refused(error: &io::Error) -> bool {
    #[cfg(unix)]
    return error.raw_os_error() == Some(libc::ELOOP);
    #[cfg(not(unix))]
    return false;
}

/// The metadata of an open `file` (at `path`), which must be a regular
/// file: anything else (a directory, a FIFO, a device) is
/// [`TierError::NotABlock`].
pub(super) fn regular_file(file: &File, path: &Path) -> Result<fs::Metadata, TierError> {
    let metadata = file
        .metadata()
        .map_err(|error| TierError::io("stat", path, error))?;
    if !metadata.is_file() {
        return Err(TierError::NotABlock {
            path: path.display().to_string(),
            what: kind_of(&metadata.file_type()),
        });
    }
    Ok(metadata)
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
pub(super) fn refuse_link(path: &Path) -> Result<(), TierError> {
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
pub(super) fn refuse_linked_shards(path: &Path) -> Result<(), TierError> {
    let shard = path.parent().expect("block paths have a shard directory");
    let top = shard.parent().expect("shard directories have a parent");
    refuse_link(top)?;
    refuse_link(shard)
}

/// Creates a block's two shard directories where missing (and the
/// namespace directory, should it have been removed since `open`); vLLM's
/// layout has the same two levels below its rank directory. Unless links
/// are followed, each shard is refused if it is a link before anything is
/// created below it, so not even a directory is made outside the root. A
/// shard that exists is taken as made even if an eviction removes it a
/// moment later (`create_dir_all` fails then): the store's create finds
/// it gone and makes it again (see `tree::create_temp_in_shard`).
pub(super) fn create_shards(path: &Path, follow: bool) -> Result<(), TierError> {
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
pub(super) fn read_block(
    file: File,
    size: u64,
    limit: u64,
    path: &Path,
) -> Result<Vec<u8>, TierError> {
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
pub(super) fn temp_suffix() -> u64 {
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
