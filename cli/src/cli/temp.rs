//! A temporary directory for the commands that make their own tier.

use std::path::PathBuf;

use super::failure::Failure;

/// A temporary directory removed when dropped (std only: no dependency).
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn tempfile_dir() -> Result<TempDir, Failure> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("kvtier-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|error| Failure::run(format!("temporary directory {}: {error}", dir.display())))?;
    Ok(TempDir(dir))
}
