//! vLLM's raw block files: a block's file holds exactly the block's bytes,
//! as the primary tier lays them out (no header, no checksum), so vLLM's
//! own fs tier and kvtier read each other's files.
//!
//! A store writes a temporary file next to the block (`<path>_<suffix>.tmp`,
//! created exclusively) and renames it over the block's name, so a reader
//! sees no file or a whole one; a block already there (a regular file of
//! exactly one block) is not written again, and anything else at its name (a
//! file of another size, a FIFO, a dangling link) is replaced, atomically.
//! A load reads exactly one block: a file shorter or longer than a block can
//! only be a damaged one (stores are atomic, and the rank directory's name
//! carries the layout's hash, so every block in it has one size) and is
//! removed, so the next lookup misses instead of failing the same load
//! again; any other failure (a missing file, a link loop, a file that is
//! not regular) leaves the path alone.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

use super::super::files::{create_shards, is_absent, open_for_read, regular_file};
use super::super::format::Corruption;
use super::super::tree::create_temp_in_shard;
use super::layout::vllm_temp_name;
use crate::tier::error::TierError;

/// What a store did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The block was written.
    Written,
    /// A block was there already; nothing was written.
    Present,
}

/// Stores `bytes` as the block at `path`, unless a whole block is there
/// already; whatever else is there is replaced.
pub(crate) fn store_block(path: &Path, bytes: &[u8]) -> Result<Stored, TierError> {
    match fs::metadata(path) {
        // guard: V3-a-present-block-is-not-rewritten
        // guard: V9-a-wrong-sized-block-is-replaced
        Ok(metadata) if metadata.is_file() && metadata.len() == bytes.len() as u64 => {
            return Ok(Stored::Present);
        }
        Ok(_) => {}
        Err(error) if is_absent(&error) => {}
        Err(error) => return Err(TierError::io("stat", path, error)),
    }
    let shards = path.parent().and_then(Path::parent).and_then(Path::parent);
    let (Some(_), Some(name)) = (shards, path.file_name()) else {
        return Err(TierError::Config(format!(
            "{} cannot name a block file",
            path.display()
        )));
    };
    let name = name.to_string_lossy();
    // Not `create_dir_all`: it fails (AlreadyExists) when an eviction
    // removes the directory between its mkdir and its check that the
    // directory is there.
    // guard: V3-stores-publish-whole-blocks
    // guard: V12-a-store-makes-directories-an-eviction-removes
    let (file, tmp) = create_temp_in_shard(
        path,
        || create_shards(path, true),
        |suffix| vllm_temp_name(&name, suffix),
    )?;
    let written = write_all_then_rename(file, bytes, &tmp, path);
    written.map_err(|source| {
        let _ = fs::remove_file(&tmp);
        TierError::io("write", path, source)
    })?;
    Ok(Stored::Written)
}

fn write_all_then_rename(mut file: File, bytes: &[u8], tmp: &Path, path: &Path) -> io::Result<()> {
    file.write_all(bytes)?;
    drop(file);
    // guard: V3-stores-publish-whole-blocks
    fs::rename(tmp, path)
}

/// Loads the block at `path` into `into`, which is exactly one block long.
/// The open never blocks (a FIFO is refused, not waited on) and follows
/// links, as vLLM's does.
pub(crate) fn load_block(path: &Path, into: &mut [u8]) -> Result<(), TierError> {
    let file = open_for_read(path, true).map_err(|error| TierError::io("open", path, error))?;
    let metadata = regular_file(&file, path)?;
    let expected = into.len() as u64;
    let corrupt = |found| TierError::Corrupt {
        location: path.display().to_string(),
        kind: Corruption::BlockSize { expected, found },
    };
    // A longer file is damaged too: refused, and removed like a short one.
    // guard: V4-a-longer-file-is-refused
    if metadata.len() > expected {
        // guard: V9-a-longer-block-is-removed
        remove_if_same_file(path, &metadata);
        return Err(corrupt(metadata.len()));
    }
    let got = read_full(&file, into).map_err(|error| TierError::io("read", path, error))?;
    if (got as u64) < expected {
        // guard: V4-a-short-block-is-removed
        remove_if_same_file(path, &metadata);
        return Err(corrupt(got as u64));
    }
    Ok(())
}

/// Reads into `into` until it is full or the file ends; returns how much.
fn read_full(mut file: &File, into: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < into.len() {
        match file.read(&mut into[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(got)
}

/// Removes the damaged file read through `read` from `path`, unless a store
/// has renamed a new block over it since (then `path` is another file).
fn remove_if_same_file(path: &Path, read: &fs::Metadata) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match fs::metadata(path) {
            Ok(now) if now.dev() == read.dev() && now.ino() == read.ino() => {}
            _ => return,
        }
    }
    #[cfg(not(unix))]
    let _ = read;
    if let Err(error) = fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "cannot remove a damaged block file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_is_written_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("abc/de_g0/abcdef.bin");
        assert_eq!(
            store_block(&path, b"12345678").expect("store"),
            Stored::Written
        );
        assert_eq!(
            fs::read(&path).expect("read"),
            b"12345678",
            "raw bytes, no header"
        );
        assert_eq!(
            store_block(&path, b"xxxxxxxx").expect("store"),
            Stored::Present
        );
        let mut block = [0u8; 8];
        load_block(&path, &mut block).expect("load");
        assert_eq!(&block, b"12345678", "the first block is kept");
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    }

    #[test]
    fn a_short_file_and_a_long_one_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let short = dir.path().join("short.bin");
        fs::write(&short, b"1234").unwrap();
        let mut block = [0u8; 8];
        let error = load_block(&short, &mut block).expect_err("short");
        assert!(matches!(
            error,
            TierError::Corrupt {
                kind: Corruption::BlockSize {
                    expected: 8,
                    found: 4
                },
                ..
            }
        ));
        assert!(!short.exists(), "a short block is removed");

        let long = dir.path().join("long.bin");
        fs::write(&long, b"123456789").unwrap();
        assert!(load_block(&long, &mut block).is_err());
        assert!(!long.exists(), "a long block is damaged too: removed");

        let missing = dir.path().join("missing.bin");
        assert!(matches!(
            load_block(&missing, &mut block),
            Err(TierError::Io { .. })
        ));
    }

    #[test]
    fn a_load_racing_a_store_sees_no_block_or_the_whole_block() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a/b_g0/ab.bin");
        let bytes: Vec<u8> = (0..1 << 20).map(|i: u32| i as u8).collect();
        for _ in 0..20 {
            let _ = fs::remove_file(&path);
            std::thread::scope(|scope| {
                scope.spawn(|| store_block(&path, &bytes).expect("store"));
                let mut block = vec![0u8; bytes.len()];
                loop {
                    match load_block(&path, &mut block) {
                        Ok(()) => break assert!(block == bytes, "a whole block"),
                        Err(TierError::Io { .. }) => {} // not there yet
                        Err(error) => panic!("a load saw part of a block: {error}"),
                    }
                }
            });
        }
    }

    /// Each store's block is evicted at once, on another thread, which
    /// removes the emptied directories while the next store makes them
    /// again. `create_dir_all` failed such a store (AlreadyExists: its
    /// mkdir found the directory, its check a moment later did not); CI
    /// saw it once.
    #[test]
    fn stores_succeed_while_evictions_remove_their_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shard = dir.path().join("ab/cd_g0");
        // std's channel and threads, not the sync shim's: the race is with
        // the kernel's directory calls, which loom and shuttle cannot run.
        let (evict, evictions) = std::sync::mpsc::channel::<std::path::PathBuf>();
        let failed = std::thread::scope(|scope| {
            scope.spawn(move || {
                for path in evictions {
                    crate::tier::tree::remove_block(&path).expect("evict");
                }
            });
            let mut failed = Vec::new();
            for i in 0..STORES {
                let path = shard.join(format!("abcd{i}.bin"));
                match store_block(&path, b"12345678") {
                    Ok(stored) => assert_eq!(stored, Stored::Written),
                    Err(error) => failed.push(error.to_string()),
                }
                evict.send(path).unwrap();
            }
            drop(evict);
            failed
        });
        assert!(
            failed.is_empty(),
            "{} of {STORES} stores failed, e.g. {:?}",
            failed.len(),
            failed.first()
        );
    }

    const STORES: usize = 20_000;

    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_link_loop_fails_the_load_at_once_and_stays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo.bin");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(status.success());
        let mut block = [0u8; 8];
        assert!(matches!(
            load_block(&fifo, &mut block),
            Err(TierError::NotABlock { .. })
        ));
        assert!(fifo.exists());

        let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(load_block(&a, &mut block).is_err());
        assert!(
            fs::symlink_metadata(&a).is_ok(),
            "a failed open removes nothing"
        );
    }
}
