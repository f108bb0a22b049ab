//! vLLM's file-system tier layout, read-only: finds the blocks vLLM's own
//! fs tier wrote, so a kvtier prober can answer lookups over them.
//!
//! vLLM names a block by its `OffloadKey`: the block hash followed by the
//! KV-cache group index as 4 bytes, big-endian. Its file is
//! `<base>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin`, where `hex`
//! is the hash (without the group suffix) in lowercase hex and `group` the
//! decimal index. `<base>` is `<root>/<model>_<cfghash>`, the hash taken
//! over the run's settings; the Python package computes it, this module
//! starts from the rank's directory. Existence is the whole check: vLLM's
//! files are its own format, not kvtier's checked blocks.

use std::fmt::Write;
use std::path::{Path, PathBuf};

#[cfg(tokio_driver)]
use super::super::files::stat_blocking;
use super::super::files::{PathWriter, exists};
use super::super::key::push_hex_bytes;
use super::super::names::Entry;
use crate::lookup::Backend;
use crate::tier::error::TierError;

/// Bytes of the group index at the end of a vLLM key.
const GROUP_BYTES: usize = 4;

/// The longest file name a lookup stats: a name past the common 255-byte
/// limit cannot have been written, so its key is a miss without a call.
const MAX_NAME: usize = 255;

/// The blocks vLLM's file-system tier stored for one rank, as a lookup
/// backend: a key is a hit when its file is a regular file (symbolic links
/// followed, as vLLM's own `stat` follows them).
///
/// ```
/// use kvtier::tier::VllmFsLayout;
///
/// let layout = VllmFsLayout::new("/mnt/kv/llama_0123456789ab_r0")?;
/// // Block hash 0xabcdef01, KV-cache group 2.
/// let key = [0xab, 0xcd, 0xef, 0x01, 0, 0, 0, 2];
/// assert_eq!(
///     layout.path_of(&key)?,
///     std::path::Path::new("/mnt/kv/llama_0123456789ab_r0/abc/de_g2/abcdef01.bin"),
/// );
/// # Ok::<(), kvtier::TierError>(())
/// ```
///
/// As a [`Backend`] it answers a group with one `stat` per key on the
/// prober's thread; as an [`AsyncBackend`](crate::lookup::AsyncBackend) (feature
/// `tokio`) on tokio's blocking pool, so a hung mount holds a blocking
/// thread and the prober's group timeout still fires. A key too short to
/// hold a hash and a group index, or whose file name could not exist, is
/// a miss on its own; an I/O error other than "not found" fails the group.
#[derive(Clone, Debug)]
pub struct VllmFsLayout {
    rank_dir: PathBuf,
}

impl VllmFsLayout {
    /// The layout below `rank_dir`, vLLM's `<root>/<model>_<cfghash>_r<rank>`.
    /// The directory need not exist yet (vLLM creates it with its first
    /// block; until then every key is a miss), but the path must not be
    /// empty or hold a NUL byte.
    pub fn new(rank_dir: impl Into<PathBuf>) -> Result<Self, TierError> {
        let rank_dir = rank_dir.into();
        if rank_dir.as_os_str().is_empty() {
            return Err(TierError::Config(
                "the vLLM rank directory is an empty path".into(),
            ));
        }
        // No file system path holds a NUL: every probe of such a layout
        // would fail, and each key would silently miss.
        // guard: H3-nul-in-a-path-refused
        if rank_dir.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(TierError::Config(format!(
                "the vLLM rank directory {rank_dir:?} contains a NUL byte"
            )));
        }
        Ok(Self { rank_dir })
    }

    /// The layout of `rank` below vLLM's base directory `base`
    /// (`<root>/<model>_<cfghash>`, without the rank suffix).
    pub fn for_rank(base: impl AsRef<Path>, rank: u32) -> Result<Self, TierError> {
        let mut dir = base.as_ref().as_os_str().to_owned();
        dir.push(format!("_r{rank}"));
        Self::new(dir)
    }

    /// The rank's directory.
    pub fn rank_dir(&self) -> &Path {
        &self.rank_dir
    }

    /// Where vLLM stores the block named by `key` (whether or not it
    /// exists). A key of fewer than five bytes holds no hash and is refused.
    pub fn path_of(&self, key: &[u8]) -> Result<PathBuf, TierError> {
        let mut name = String::new();
        push_vllm_path(key, &mut name)?;
        Ok(self.rank_dir.join(name))
    }

    /// The key whose block is stored at `path`, the inverse of
    /// [`path_of`](Self::path_of): `None` for a path that is not a block
    /// file of this rank directory (a temporary file, a foreign name).
    ///
    /// ```
    /// use kvtier::tier::VllmFsLayout;
    ///
    /// let layout = VllmFsLayout::new("/mnt/kv/llama_0123456789ab_r0")?;
    /// let key = [0xab, 0xcd, 0xef, 0x01, 0, 0, 0, 2];
    /// assert_eq!(layout.key_of(&layout.path_of(&key)?), Some(key.to_vec()));
    /// assert_eq!(layout.key_of(std::path::Path::new("/mnt/kv/other.bin")), None);
    /// # Ok::<(), kvtier::TierError>(())
    /// ```
    pub fn key_of(&self, path: &Path) -> Option<Vec<u8>> {
        let relative = path.strip_prefix(&self.rank_dir).ok()?;
        let mut parts = relative.iter().map(|part| part.to_str());
        let (fan_out, shard, file) = (parts.next()??, parts.next()??, parts.next()??);
        if parts.next().is_some() {
            return None;
        }
        block_key(fan_out, shard, file)
    }

    /// Whether the block named by `key` is stored: its file is a regular file.
    pub fn contains(&self, key: &[u8]) -> Result<bool, TierError> {
        let mut name = String::new();
        if push_vllm_path(key, &mut name).is_err() || !name_fits(&name) {
            return Ok(false);
        }
        exists(&self.rank_dir.join(name), true)
    }
}

/// The key of the block vLLM stores at `<fan_out>/<shard>/<file>` below a
/// rank directory; `None` for any other path.
pub(crate) fn block_key(fan_out: &str, shard: &str, file: &str) -> Option<Vec<u8>> {
    let hex = file.strip_suffix(".bin")?;
    let (_, group) = shard.rsplit_once("_g")?;
    let group: u32 = group.parse().ok()?;
    let mut key = decode_lower_hex(hex)?;
    key.extend_from_slice(&group.to_be_bytes());
    // Only the one spelling push_vllm_path gives names this key's block.
    let mut path = String::with_capacity(fan_out.len() + shard.len() + file.len() + 2);
    push_vllm_path(&key, &mut path).ok()?;
    // guard: F14-a-key-round-trips-to-its-path
    path.split('/').eq([fan_out, shard, file]).then_some(key)
}

/// The temporary file a store writes before renaming it to `block_name`:
/// `<block_name>_<suffix in decimal>.tmp`, as vLLM's own fs tier names its
/// temporary files.
pub(crate) fn vllm_temp_name(block_name: &str, suffix: u64) -> String {
    format!("{block_name}_{suffix}.tmp")
}

/// The longest decimal suffix of a temporary file: a `u64`'s.
const TEMP_DIGITS: usize = 20;

/// What `<fan_out>/<shard>/<name>` below a rank directory is in vLLM's
/// layout: a block, a block's temporary file (`<block>_<digits>.tmp`, as
/// kvtier's and vLLM's writers name them), or nothing of the layout's.
pub(crate) fn vllm_entry(fan_out: &str, shard: &str, name: &str) -> Entry {
    if block_key(fan_out, shard, name).is_some() {
        return Entry::Block;
    }
    let temp = name
        .strip_suffix(".tmp")
        .and_then(|stem| stem.rsplit_once('_'))
        .filter(|(_, digits)| {
            (1..=TEMP_DIGITS).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
        });
    match temp {
        // guard: V10-only-the-layouts-temporaries-are-swept
        Some((block, _)) if block_key(fan_out, shard, block).is_some() => Entry::Temp,
        _ => Entry::Foreign,
    }
}

/// Whether a directory `depth` levels below a rank directory (1: the
/// fan-out, up to three hex digits; 2: the shard, up to two and `_g<group>`)
/// can be one vLLM's layout made.
pub(crate) fn is_vllm_dir(depth: usize, name: &str) -> bool {
    let hex = |text: &str, most: usize| {
        text.len() <= most && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if depth == 1 {
        return !name.is_empty() && hex(name, 3);
    }
    name.rsplit_once("_g").is_some_and(|(digits, group)| {
        hex(digits, 2) && !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The bytes of an even-length lowercase hex string, `None` for anything
/// else (an empty one included: a key holds a hash).
fn decode_lower_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Appends the path of `key`'s block below the rank directory to `out`:
/// `<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin`, the fan-out sliced as Python
/// slices (a hash shorter than three bytes gives a shorter fan-out, as in
/// vLLM). Writes nothing for a key too short to hold a hash.
pub(crate) fn push_vllm_path(key: &[u8], out: &mut String) -> Result<(), TierError> {
    // guard: F11-vllm-key-holds-a-hash
    let Some(hash_len) = key.len().checked_sub(GROUP_BYTES).filter(|&n| n > 0) else {
        return Err(TierError::KeyFormat {
            length: key.len(),
            reason: "a vLLM key is a block hash followed by a 4-byte group index",
        });
    };
    let (hash, group) = key.split_at(hash_len);
    let group = u32::from_be_bytes([group[0], group[1], group[2], group[3]]);
    // The fan-out: hex digits 0..3 and 3..5 of the hash, sliced as Python
    // slices (fewer digits give a shorter fan-out).
    let digits = 2 * hash.len();
    let nibble = |i: usize| {
        let byte = hash[i / 2];
        let value = if i.is_multiple_of(2) {
            byte >> 4
        } else {
            byte & 0xf
        };
        char::from_digit(u32::from(value), 16).unwrap_or('0')
    };
    out.extend((0..digits.min(3)).map(nibble));
    out.push('/');
    out.extend((3..digits.min(5)).map(nibble));
    // Writing to a String cannot fail.
    let _ = write!(out, "_g{group}/");
    push_hex_bytes(hash, out);
    out.push_str(".bin");
    Ok(())
}

/// Whether the file name of a `/`-separated path fits (see [`MAX_NAME`]).
fn name_fits(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.len() <= MAX_NAME)
}

impl<K: AsRef<[u8]>, R> Backend<K, R> for VllmFsLayout {
    type Answers = Vec<bool>;
    type Error = TierError;

    fn batch_lookup(&mut self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        let mut paths = PathWriter::new(&self.rank_dir);
        let mut name = String::new();
        keys.iter()
            .map(|key| {
                name.clear();
                // guard: F12-vllm-bad-key-fails-alone
                if push_vllm_path(key.as_ref(), &mut name).is_err() || !name_fits(&name) {
                    return Ok(false); // only this key: no such file exists
                }
                exists(paths.below(&name), true)
            })
            .collect()
    }
}

#[cfg(tokio_driver)]
impl<K, R> crate::lookup::AsyncBackend<K, R> for VllmFsLayout
where
    K: AsRef<[u8]> + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        stat_blocking(self.rank_dir.clone(), keys, true, |key, name| {
            // guard: F12-vllm-bad-key-fails-alone
            push_vllm_path(key.as_ref(), name).is_ok() && name_fits(name)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(key: &[u8]) -> String {
        let mut out = String::new();
        push_vllm_path(key, &mut out).expect("a vLLM key");
        out
    }

    #[test]
    fn paths_follow_vllms_layout() {
        let mut key = vec![0x01, 0x23, 0x45, 0x67, 0x89];
        key.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(path(&key), "012/34_g7/0123456789.bin");
        let mut big_group = vec![0xff; 32];
        big_group.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            path(&big_group),
            format!("fff/ff_g4294967295/{}.bin", "ff".repeat(32))
        );
    }

    #[test]
    fn short_hashes_slice_as_python_does() {
        // hex "ab": hex[0:3] is "ab", hex[3:5] is "".
        assert_eq!(path(&[0xab, 0, 0, 0, 1]), "ab/_g1/ab.bin");
        // hex "abcd": "abc" and "d".
        assert_eq!(path(&[0xab, 0xcd, 0, 0, 0, 0]), "abc/d_g0/abcd.bin");
    }

    #[test]
    fn a_key_without_a_hash_is_refused() {
        for len in 0..=GROUP_BYTES {
            let mut out = String::from("kept");
            let error = push_vllm_path(&vec![0; len], &mut out).expect_err("too short");
            assert!(matches!(error, TierError::KeyFormat { length, .. } if length == len));
            assert_eq!(out, "kept", "nothing written for a refused key");
        }
    }

    #[test]
    fn for_rank_appends_the_rank_suffix() {
        let layout = VllmFsLayout::for_rank("/kv/m_0123456789ab", 3).expect("layout");
        assert_eq!(layout.rank_dir(), Path::new("/kv/m_0123456789ab_r3"));
        assert!(VllmFsLayout::new("").is_err());
    }
}
