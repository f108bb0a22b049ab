//! A directory tier's tree as its layout names it: the one walk that every
//! scan, sweep and trim goes through (it sees only the layout's own blocks
//! and temporary files, and descends only into directories the layout can
//! have made), the deletion of a block that takes the directories it
//! empties with it, and the check that a directory is a tier's at all.
//!
//! Both layouts put a block exactly two directories below the tier's
//! directory (a fan-out and a shard), so a deletion removes at most those
//! two, never the tier's directory itself. A store into a shard directory
//! that a deletion removes at the same moment creates it again: the
//! writers retry when their directory vanishes under them
//! ([`create_temp_in_shard`]).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::error::TierError;
use super::files::{create_temp, is_absent};
use super::names::{Entry, is_kvtier_dir, kvtier_entry};
use super::vllm::{is_vllm_dir, vllm_entry};

/// Which layout a directory's block files follow, for
/// [`scan_directory`](super::scan_directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockLayout {
    /// kvtier's [`FsTier`](super::FsTier): the directory is a namespace
    /// (`<root>/<namespace>`), blocks `<xxx>/<yy>/<hex>.bin`, temporary
    /// files `<hex>.bin.<16 hex digits>.tmp`.
    Kvtier,
    /// vLLM's fs layout: the directory is a rank's (`..._r<rank>`), blocks
    /// `<xxx>/<yy>_g<group>/<hex>.bin`, temporary files
    /// `<hex>.bin_<digits>.tmp`.
    Vllm,
}

/// The file an [`FsTier`](super::FsTier) writes in its namespace directory
/// when it opens it: what tells a tool that the directory is a tier's.
pub const KVTIER_TIER_MARK: &str = "kvtier-tier.json";

impl BlockLayout {
    /// What the file `<fan_out>/<shard>/<name>` below a tier's directory is.
    pub(crate) fn entry(self, fan_out: &str, shard: &str, name: &str) -> Entry {
        match self {
            Self::Kvtier => kvtier_entry(fan_out, shard, name),
            Self::Vllm => vllm_entry(fan_out, shard, name),
        }
    }

    /// Whether a directory `depth` (1 or 2) levels below the tier's
    /// directory can be one the layout made.
    fn is_dir(self, depth: usize, name: &str) -> bool {
        match self {
            Self::Kvtier => is_kvtier_dir(depth, name),
            Self::Vllm => is_vllm_dir(depth, name),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Kvtier => "kvtier",
            Self::Vllm => "vllm",
        }
    }
}

/// Checks that `dir` is a tier's directory of `layout` before a tool
/// deletes anything below it: kvtier's layout marks its namespace
/// directory with [`KVTIER_TIER_MARK`]; vLLM's rank directory is named
/// `<base>_r<rank>`, with vLLM's run config at `<base>/config.json`. The
/// error names what is missing.
///
/// ```
/// use kvtier::FsTier;
/// use kvtier::tier::{BlockLayout, check_tier_dir};
///
/// let root = tempfile::tempdir()?;
/// FsTier::open(root.path(), "ns")?;
/// check_tier_dir(&root.path().join("ns"), BlockLayout::Kvtier)?;
/// assert!(check_tier_dir(root.path(), BlockLayout::Kvtier).is_err());
/// assert!(check_tier_dir(root.path(), BlockLayout::Vllm).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_tier_dir(dir: &Path, layout: BlockLayout) -> Result<(), TierError> {
    let refuse = |missing: String| TierError::NotATier {
        dir: dir.display().to_string(),
        layout: layout.name(),
        missing,
    };
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(refuse("no such directory".into()));
    }
    let mark = match layout {
        BlockLayout::Kvtier => dir.join(KVTIER_TIER_MARK),
        BlockLayout::Vllm => {
            let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or("");
            let base = name
                .rsplit_once("_r")
                .filter(|(base, rank)| {
                    !base.is_empty() && !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit())
                })
                .map(|(base, _)| base);
            let Some(base) = base else {
                return Err(refuse(format!(
                    "a rank directory's name, `<base>_r<rank>` (this one is {name:?})"
                )));
            };
            dir.with_file_name(base).join("config.json")
        }
    };
    // guard: F17-a-tool-refuses-a-directory-that-is-no-tier
    if fs::symlink_metadata(&mark).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    Err(refuse(format!(
        "{} is missing ({})",
        mark.display(),
        match layout {
            BlockLayout::Kvtier => "FsTier::open writes it in the tier's namespace directory",
            BlockLayout::Vllm => "vLLM's run config, written beside the rank directories",
        }
    )))
}

/// Writes [`KVTIER_TIER_MARK`] in `dir` unless it is there.
pub(crate) fn mark_kvtier_tier(dir: &Path) -> Result<(), TierError> {
    let mark = dir.join(KVTIER_TIER_MARK);
    match File::options().write(true).create_new(true).open(&mark) {
        Ok(mut file) => {
            use std::io::Write;
            file.write_all(b"{\"layout\": \"kvtier\", \"version\": 1}\n")
                .map_err(|error| TierError::io("write", &mark, error))
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(TierError::io("create", &mark, error)),
    }
}

/// A file of the layout a walk found.
pub(crate) struct Found {
    pub(crate) path: PathBuf,
    /// [`Entry::Block`] or [`Entry::Temp`].
    pub(crate) entry: Entry,
    pub(crate) metadata: fs::Metadata,
}

/// Calls `visit` with each regular file below `dir` that `layout` names a
/// block or a temporary file, two levels down; nothing else is visited or
/// entered. With `prune`, the layout's directories found empty are
/// removed. A directory that vanishes meanwhile is skipped; one that
/// cannot be listed is an error (the tier cannot know its usage). Entries
/// that vanish or cannot be read are skipped.
pub(crate) fn walk(
    dir: &Path,
    layout: BlockLayout,
    prune: bool,
    mut visit: impl FnMut(Found),
) -> Result<(), TierError> {
    for fan_out in children(dir)? {
        let Some(fan_name) = layout_dir(&fan_out, layout, 1) else {
            continue;
        };
        let fan_path = fan_out.path();
        let shards = children(&fan_path)?;
        let mut pruned = 0;
        let listed = shards.len();
        for shard in shards {
            let Some(shard_name) = layout_dir(&shard, layout, 2) else {
                continue;
            };
            let shard_path = shard.path();
            let files = children(&shard_path)?;
            if files.is_empty() {
                // guard: F21-a-scan-prunes-empty-layout-directories
                pruned += usize::from(prune && fs::remove_dir(&shard_path).is_ok());
                continue;
            }
            for file in files {
                let name = file.file_name();
                let Some(name) = name.to_str() else { continue };
                let entry = layout.entry(&fan_name, &shard_name, name);
                if entry == Entry::Foreign || !file.file_type().is_ok_and(|t| t.is_file()) {
                    continue;
                }
                let Ok(metadata) = file.metadata() else {
                    continue;
                };
                visit(Found {
                    path: file.path(),
                    entry,
                    metadata,
                });
            }
        }
        if prune && pruned == listed {
            let _ = fs::remove_dir(&fan_path);
        }
    }
    Ok(())
}

/// The entries of `dir`; none when it is gone (removed meanwhile, or a
/// file where a directory was).
fn children(dir: &Path) -> Result<Vec<fs::DirEntry>, TierError> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(Result::ok).collect()),
        Err(error) if is_absent(&error) => Ok(Vec::new()),
        Err(error) => Err(TierError::io("list", dir, error)),
    }
}

/// The name of `entry` when it is a directory (not a link) `layout` can
/// have made at `depth`.
fn layout_dir(entry: &fs::DirEntry, layout: BlockLayout, depth: usize) -> Option<String> {
    let name = entry.file_name().into_string().ok()?;
    let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
    (is_dir && layout.is_dir(depth, &name)).then_some(name)
}

/// Deletes the block or temporary file at `path` (two levels below its
/// tier's directory), then its shard and fan-out directories if that left
/// them empty. A file already gone is deleted; a directory that is not
/// empty (a store wrote into it meanwhile) stays.
pub(crate) fn remove_block(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    // guard: F18-emptied-directories-are-removed
    let shard = path.parent().filter(|shard| fs::remove_dir(shard).is_ok());
    if let Some(fan_out) = shard.and_then(Path::parent) {
        let _ = fs::remove_dir(fan_out);
    }
    Ok(())
}

/// Deletes the temporary files below `dir` that `layout`'s stores name,
/// last modified `older_than` ago or longer (younger ones may be a live
/// writer's, in another engine sharing the directory), with the
/// directories that leaves empty. Files that cannot be deleted, and a
/// directory that cannot be listed, are skipped and logged. Returns how
/// many it deleted.
pub(crate) fn sweep_temps(
    dir: &Path,
    layout: BlockLayout,
    older_than: std::time::Duration,
) -> usize {
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    let walked = walk(dir, layout, true, |file| {
        let stale = file
            .metadata
            .modified()
            .is_ok_and(|modified| now.duration_since(modified).unwrap_or_default() >= older_than);
        // guard: V8-only-stale-temporaries-are-swept
        if file.entry != Entry::Temp || !stale {
            return;
        }
        match remove_block(&file.path) {
            Ok(()) => removed += 1,
            Err(error) => {
                tracing::warn!(path = %file.path.display(), %error, "cannot delete a stale temporary file");
            }
        }
    });
    if let Err(error) = walked {
        tracing::warn!(%error, "cannot sweep the tier's temporary files");
    }
    removed
}

/// How many times a store makes its directories again when a deletion
/// removes them under it: each retry needs another deletion to empty the
/// very directory between two system calls of the store.
const SHARD_RETRIES: usize = 32;

/// Creates the directories of the block at `path` with `make_dirs` and a
/// new temporary file beside it named `temp_name(suffix)`; when a deletion
/// removed a directory between the two (it was empty), both are done
/// again.
pub(crate) fn create_temp_in_shard(
    path: &Path,
    mut make_dirs: impl FnMut() -> Result<(), TierError>,
    temp_name: impl Fn(u64) -> String,
) -> Result<(File, PathBuf), TierError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let made = make_dirs().and_then(|()| create_temp(path, &temp_name));
        match made {
            // guard: F19-a-store-whose-directory-was-removed-tries-again
            Err(TierError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound && attempt < SHARD_RETRIES => {}
            made => return made,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_the_last_block_removes_its_directories_and_no_more() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ns");
        let (a, b) = (dir.join("abc/de/abcdef.bin"), dir.join("abc/df/abcdff.bin"));
        for path in [&a, &b] {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"x").unwrap();
        }
        remove_block(&a).unwrap();
        assert!(!dir.join("abc/de").exists(), "the emptied shard went");
        assert!(dir.join("abc/df").exists() && dir.join("abc").exists());
        remove_block(&b).unwrap();
        assert!(!dir.join("abc").exists(), "the emptied fan-out went");
        assert!(dir.is_dir(), "the tier's directory stays");
        remove_block(&b).expect("a block already gone is deleted");
    }

    #[test]
    fn a_walk_sees_only_the_layouts_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let files = [
            "abc/de/abcdef.bin",
            "abc/de/abcdef.bin.00000000000000aa.tmp",
            "abc/de/abcdef.bin.old.tmp",
            "abc/de/notes.txt",
            "photos/2024/holiday.bin",
            "firmware/images/boot.bin",
            "abc/dx/abcdef.bin",
            "top.bin",
        ];
        for file in files {
            let path = dir.join(file);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"x").unwrap();
        }
        fs::create_dir_all(dir.join("fed/cb")).unwrap();
        let mut seen = Vec::new();
        walk(dir, BlockLayout::Kvtier, true, |found| {
            seen.push((
                found.path.strip_prefix(dir).unwrap().to_owned(),
                found.entry,
            ));
        })
        .unwrap();
        seen.sort();
        assert_eq!(
            seen,
            [
                (PathBuf::from("abc/de/abcdef.bin"), Entry::Block),
                (
                    PathBuf::from("abc/de/abcdef.bin.00000000000000aa.tmp"),
                    Entry::Temp
                ),
            ]
        );
        assert!(
            !dir.join("fed").exists(),
            "an empty layout directory is pruned"
        );
        assert!(dir.join("photos/2024").exists() && dir.join("firmware").exists());
    }
}
