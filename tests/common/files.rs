//! What a tier left in a directory tree, walked independently of the tier:
//! for the budget tests' checks of the bytes on disk.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// Every file below `dir` whose name ends in `suffix`, with its size
/// (skipping those gone between the listing and their `stat`).
pub fn files(dir: &Path, suffix: &str) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                // A file a live writer renamed or deleted since the listing
                // is not there any more.
                if let Ok(metadata) = entry.metadata() {
                    out.push((path, metadata.len()));
                }
            }
        }
    }
    out
}

/// The bytes of the block files (`.bin`) below `dir`.
pub fn bytes_on_disk(dir: &Path) -> u64 {
    files(dir, ".bin").iter().map(|(_, size)| size).sum()
}
