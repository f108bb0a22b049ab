//! A directory tier's byte budget: the glue between a tier's files and a
//! [`SharedLedger`] (the sans-IO protocol lives in [`crate::capacity`]).
//!
//! The ledger is keyed by a block's path. A store asks for room before its
//! temporary file is created ([`DirBudget::admit`]) and commits it once the
//! file is renamed into place; victims are deleted here, outside the
//! ledger's lock. A load pins its block ([`DirBudget::pin`]); a block found
//! missing or damaged is dropped from the books ([`DirBudget::lose`]). At
//! open, [`DirBudget::scan`] counts what a previous run left: the blocks,
//! newest first by modification time, up to the capacity (older ones are
//! deleted: startup trims), and the temporary files of writers that died
//! mid-store (deleted when older than the tier's stale age).
//!
//! The budget counts file bytes (a block's length), not what the file
//! system allocates for them (rounding to its block size, directories).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::error::{ReconcileReport, ScanReport, TierError};
use super::names::Entry;
use super::tree::{BlockLayout, remove_block, walk};
use crate::capacity::{Admitted, CapacityStats, PinGuard, Policy, SharedLedger};
use crate::capacity::{Rejection, WriteGuard};

/// Counts the block files below `dir` and, with a `capacity`, deletes the
/// oldest (by modification time) until the rest fit it; with a
/// `stale_temp_age`, deletes temporary files older than that. Without
/// either it only reads: the usage of a tier. What `kvtier trim` and the
/// usage line of `kvtier probe --fs` run; a tier with a budget runs the
/// same scan when it opens.
///
/// Only the names `layout` writes are counted or deleted (its blocks, where
/// it puts them, and its stores' temporary files), and a deletion takes the
/// directories it empties with it. Deletions that fail are counted and
/// named in the report ([`ScanReport::failed`]); the scan goes on.
///
/// Another process storing into the directory meanwhile is not counted
/// until its next scan; see docs/design.md ("Capacity across processes").
///
/// ```
/// use kvtier::FsTier;
/// use kvtier::tier::{BlockLayout, scan_directory};
///
/// let root = tempfile::tempdir()?;
/// let tier = FsTier::open(root.path(), "ns")?;
/// for key in 0u64..4 {
///     tier.store(&key, &[0; 84])?; // 100 bytes with the header
/// }
/// let dir = root.path().join("ns");
/// let usage = scan_directory(&dir, BlockLayout::Kvtier, None, Default::default(), None)?;
/// assert_eq!((usage.blocks, usage.bytes), (4, 400));
/// let trimmed = scan_directory(&dir, BlockLayout::Kvtier, Some(250), Default::default(), None)?;
/// assert_eq!((trimmed.blocks, trimmed.trimmed, trimmed.failed), (2, 2, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scan_directory(
    dir: &Path,
    layout: BlockLayout,
    capacity: Option<u64>,
    policy: Policy,
    stale_temp_age: Option<Duration>,
) -> Result<ScanReport, TierError> {
    let deletes = capacity.is_some() || stale_temp_age.is_some();
    let capacity = capacity.unwrap_or(u64::MAX);
    let stale = stale_temp_age.unwrap_or(Duration::MAX);
    DirBudget::scan_with(capacity, policy, dir, layout, stale, deletes).map(|(_, report)| report)
}

/// A tier's byte budget over the block files below one directory.
#[derive(Clone)]
pub(crate) struct DirBudget {
    ledger: SharedLedger<PathBuf>,
}

impl DirBudget {
    /// Counts the blocks below `dir` that a previous run left (newest
    /// first, as many as fit; the rest deleted) and deletes temporary files
    /// older than `stale_temp_age`. Files that vanish or cannot be read
    /// while it runs are skipped; a directory that cannot be listed is an
    /// error. One `stat` per file and a sort: linear in the files, plus
    /// the sort's log factor.
    pub(crate) fn scan(
        capacity: u64,
        policy: Policy,
        dir: &Path,
        layout: BlockLayout,
        stale_temp_age: Duration,
    ) -> Result<(Self, ScanReport), TierError> {
        Self::scan_with(capacity, policy, dir, layout, stale_temp_age, true)
    }

    /// [`scan`](Self::scan); without `deletes` nothing is deleted (a
    /// capacity of `u64::MAX` and no stale age deletes no file, and the
    /// empty directories stay too).
    fn scan_with(
        capacity: u64,
        policy: Policy,
        dir: &Path,
        layout: BlockLayout,
        stale_temp_age: Duration,
        deletes: bool,
    ) -> Result<(Self, ScanReport), TierError> {
        let started = Instant::now();
        let mut report = ScanReport::default();
        let mut found = Self::list(dir, layout, deletes, stale_temp_age, &mut report)?;
        // Newest first: the ledger counts what fits and names the rest.
        // guard: E15-the-scan-keeps-the-newest-blocks
        found.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
        let found = found.into_iter().map(|(_, bytes, path)| (path, bytes));
        let (ledger, victims) = SharedLedger::seeded(capacity, policy, found);
        let seeded = ledger.stats();
        (report.blocks, report.bytes) = (seeded.entries, seeded.resident_bytes);
        report.trimmed =
            ledger.delete_victims(victims, |path| delete(path, Some(&mut report))) as u64;
        report.elapsed = started.elapsed();
        if report.trimmed + report.swept > 0 {
            tracing::info!(
                blocks = report.blocks,
                trimmed = report.trimmed,
                swept = report.swept,
                dir = %dir.display(),
                "startup scan trimmed the tier to its capacity"
            );
        }
        Ok((Self { ledger }, report))
    }

    /// The block files below `dir` (modification time, bytes, path), read
    /// entry by entry; temporary files older than `stale_temp_age` are
    /// deleted on the way and counted in the report's `swept` (or
    /// `failed`). Only the names `layout` writes are looked at; with
    /// `prune`, its directories found empty are removed.
    fn list(
        dir: &Path,
        layout: BlockLayout,
        prune: bool,
        stale_temp_age: Duration,
        report: &mut ScanReport,
    ) -> Result<Vec<(SystemTime, u64, PathBuf)>, TierError> {
        let now = SystemTime::now();
        let mut found: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        walk(dir, layout, prune, |file| {
            let modified = file.metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            match file.entry {
                Entry::Temp => {
                    let age = now.duration_since(modified).unwrap_or_default();
                    // guard: E14-only-stale-temporaries-are-swept-at-open
                    if age >= stale_temp_age && delete(&file.path, Some(report)) {
                        report.swept += 1;
                    }
                }
                Entry::Block => found.push((modified, file.metadata.len(), file.path)),
                Entry::Foreign => {}
            }
        })?;
        Ok(found)
    }

    /// Lists `dir` and reconciles the books with it (see
    /// [`CapacityLedger::reconcile`](crate::capacity::CapacityLedger::reconcile)):
    /// the blocks other processes wrote are counted, those they deleted
    /// forgotten, and the least valuable deleted until the books fit the
    /// capacity; temporary files older than `stale_temp_age` are swept. The
    /// ledger's lock is held while the listing is merged (linear in the
    /// blocks), not while the directory is read.
    pub(crate) fn reconcile(
        &self,
        dir: &Path,
        layout: BlockLayout,
        stale_temp_age: Duration,
    ) -> Result<ReconcileReport, TierError> {
        let started = Instant::now();
        let mut report = ReconcileReport::default();
        let listing = self.ledger.with(|ledger| ledger.begin_listing());
        let mut scanned = ScanReport::default();
        let listed = Self::list(dir, layout, true, stale_temp_age, &mut scanned);
        report.swept = scanned.swept;
        let found = match listed {
            Ok(found) => found,
            Err(error) => {
                self.ledger.with(|ledger| ledger.abandon(listing));
                return Err(error);
            }
        };
        let done = self.ledger.with(|ledger| {
            ledger.reconcile(
                listing,
                found.into_iter().map(|(_, bytes, path)| (path, bytes)),
            )
        });
        (report.adopted, report.forgotten) = (done.adopted, done.forgotten);
        report.evicted =
            self.ledger
                .delete_victims(done.victims, |path| delete(path, None)) as u64;
        report.elapsed = started.elapsed();
        if report.adopted + report.forgotten + report.evicted + report.swept > 0 {
            tracing::debug!(
                adopted = report.adopted,
                forgotten = report.forgotten,
                evicted = report.evicted,
                swept = report.swept,
                dir = %dir.display(),
                "reconciled the budget with the directory"
            );
        }
        Ok(report)
    }

    /// The counters and gauges.
    pub(crate) fn stats(&self) -> CapacityStats {
        self.ledger.stats()
    }

    /// Room for the block at `path` of `bytes`: `Ok(None)` when the block is
    /// resident already and its file is still there (nothing to write).
    fn admit(&self, path: &Path, bytes: u64) -> Result<Option<WriteGuard<PathBuf>>, TierError> {
        // Twice at most: a resident block whose file has gone is dropped
        // from the books, then admitted like a new one.
        for _ in 0..2 {
            let admitted = self
                .ledger
                .admit(path.to_path_buf(), bytes, |victim| delete(victim, None));
            match admitted {
                Ok(Admitted::Write(guard)) => return Ok(Some(guard)),
                Ok(Admitted::Present) => {
                    // guard: E16-a-resident-block-whose-file-went-is-written-again
                    if fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
                        return Ok(None);
                    }
                    self.ledger.lose(&path.to_path_buf());
                }
                Err(reason) => return Err(self.refused(path, bytes, reason)),
            }
        }
        Err(self.refused(path, bytes, Rejection::Busy))
    }

    /// Stores the block at `path` of `bytes` under the budget: room first
    /// (nothing to do when the block is resident and its file in place),
    /// then `write`; a write that fails for want of space on the device
    /// (ENOSPC) makes room on it by evicting, and is tried once more. The
    /// room is committed when the write succeeds and given back when it
    /// fails.
    pub(crate) fn store(
        &self,
        path: &Path,
        bytes: u64,
        mut write: impl FnMut() -> Result<(), TierError>,
    ) -> Result<(), TierError> {
        let Some(room) = self.admit(path, bytes)? else {
            return Ok(());
        };
        let mut written = write();
        if let Err(TierError::Io { source, .. }) = &written {
            // guard: E19-enospc-evicts-then-retries-once
            if is_enospc(source) && self.make_room_after_enospc(bytes) {
                written = write();
            }
        }
        if written.is_ok() {
            room.commit();
        }
        // Dropped uncommitted, the room is given back.
        written
    }

    fn refused(&self, path: &Path, bytes: u64, reason: Rejection) -> TierError {
        TierError::NoRoom {
            path: path.display().to_string(),
            bytes,
            capacity: self.ledger.with(|ledger| ledger.capacity()),
            reason,
        }
    }

    /// A write failed for want of space on the device: counted, and the
    /// least valuable blocks worth `bytes` deleted so that a retry finds
    /// room on the device too (the capacity unchanged: the device was full,
    /// not the budget). Returns whether any were.
    fn make_room_after_enospc(&self, bytes: u64) -> bool {
        let victims = self.ledger.with(|ledger| ledger.note_enospc(bytes));
        self.ledger
            .delete_victims(victims, |path| delete(path, None))
            > 0
    }

    /// Lowers (or raises) the capacity and deletes blocks until resident
    /// plus reserved bytes fit it (pinned and reserved blocks stay until
    /// their reads and writes end). Returns the blocks deleted.
    pub(crate) fn trim(&self, capacity: u64) -> usize {
        let victims = self.ledger.with(|ledger| ledger.set_capacity(capacity));
        self.ledger
            .delete_victims(victims, |path| delete(path, None))
    }

    /// Pins the block at `path` for a read; `None` when the budget does not
    /// hold it (another process wrote it: read unpinned).
    pub(crate) fn pin(&self, path: &Path) -> Option<PinGuard<PathBuf>> {
        self.ledger.pin(&path.to_path_buf())
    }

    /// The block at `path` was found missing or damaged.
    pub(crate) fn lose(&self, path: &Path) {
        self.ledger.lose(&path.to_path_buf());
    }

    /// Starts (or stops) logging which block files came and went (see
    /// [`CapacityLedger::record_changes`](crate::capacity::CapacityLedger::record_changes)).
    pub(crate) fn record_changes(&self, on: bool) {
        self.ledger.with(|ledger| ledger.record_changes(on));
    }

    /// Moves the changes logged since the last call into `into`, in order.
    pub(crate) fn take_changes(&self, into: &mut Vec<(PathBuf, bool)>) {
        self.ledger.with(|ledger| ledger.take_changes(into));
    }
}

/// Deletes a block or temporary file, and the directories that left
/// empty; `true` when the file is gone (also when it was already). A
/// failure is logged, and counted and named in `report` when given.
fn delete(path: &Path, report: Option<&mut ScanReport>) -> bool {
    match remove_block(path) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot delete a file of the tier");
            if let Some(report) = report {
                report.failed_to_delete(path.display(), &error);
            }
            false
        }
    }
}

/// Whether an I/O error is the device running out of space (or quota).
fn is_enospc(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(capacity: u64) -> (tempfile::TempDir, DirBudget) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (budget, _) = DirBudget::scan(
            capacity,
            Policy::Lru,
            dir.path(),
            BlockLayout::Kvtier,
            Duration::ZERO,
        )
        .expect("scan");
        (dir, budget)
    }

    fn write(path: &Path) -> Result<(), TierError> {
        fs::write(path, [0; 100]).map_err(|error| TierError::io("write", path, error))
    }

    fn full() -> TierError {
        TierError::io(
            "write",
            Path::new("x"),
            io::Error::from_raw_os_error(libc::ENOSPC),
        )
    }

    #[test]
    fn enospc_evicts_the_least_recently_used_and_retries_once() {
        let (dir, budget) = empty(1000);
        let (a, b, c) = (
            dir.path().join("aaa/aa/aaaaaa.bin"),
            dir.path().join("bbb/bb/bbbbbb.bin"),
            dir.path().join("ccc/cc/cccccc.bin"),
        );
        for path in [&a, &b, &c] {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
        }
        for path in [&a, &b] {
            budget.store(path, 100, || write(path)).unwrap();
        }
        // The device is full below the budget: the first write of c fails.
        let mut attempts = 0;
        budget
            .store(&c, 100, || {
                attempts += 1;
                if attempts == 1 { Err(full()) } else { Ok(()) }
            })
            .expect("stored after the retry");
        assert_eq!(attempts, 2);
        assert!(
            !a.exists() && b.exists(),
            "the least recently used made room"
        );
        assert!(
            !dir.path().join("aaa").exists(),
            "its directories went with it"
        );
        let stats = budget.stats();
        assert_eq!((stats.enospc, stats.evictions, stats.committed), (1, 1, 3));
        assert_eq!(
            (
                stats.resident_bytes,
                stats.reserved_bytes,
                stats.capacity_bytes
            ),
            (200, 0, 1000)
        );
    }

    #[test]
    fn a_write_that_fails_again_gives_its_room_back_and_nothing_else_is_lost() {
        let (dir, budget) = empty(1000);
        let a = dir.path().join("a.bin");
        budget.store(&a, 100, || write(&a)).unwrap();
        let mut attempts = 0;
        let error = budget
            .store(&dir.path().join("b.bin"), 100, || {
                attempts += 1;
                Err(full())
            })
            .expect_err("full twice");
        assert!(matches!(error, TierError::Io { .. }));
        assert_eq!(attempts, 2);
        let stats = budget.stats();
        assert_eq!(
            (stats.reserved_bytes, stats.aborted, stats.enospc),
            (0, 1, 1)
        );
        // A write failing for another reason is not retried.
        let mut other = 0;
        let _ = budget.store(&dir.path().join("c.bin"), 100, || {
            other += 1;
            Err(TierError::io(
                "write",
                Path::new("c"),
                io::Error::from_raw_os_error(libc::EIO),
            ))
        });
        assert_eq!((other, budget.stats().enospc), (1, 1));
    }
}
