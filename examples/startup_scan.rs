//! How long a bounded fs tier takes to open against a populated directory:
//! the startup scan (one `stat` per file, a sort by modification time, the
//! oldest beyond the budget deleted) at a block count of your choice.
//!
//!     cargo run --release --example startup_scan -- --blocks 1000000 [--dir DIR] [--cold]
//!
//! After each open it times a reconcile (what `FsOptions::rescan_interval`
//! runs), and at the end the merge a reconcile does under the ledger's lock.
//!
//! Creates `--blocks` block files of 100 bytes in kvtier's layout below
//! DIR (a temporary directory by default; DIR must exist), then opens the
//! tier twice: with a budget that holds every block (the scan counts them),
//! and with one that holds half (the scan deletes the older half). Prints
//! each open's time and what its scan found. `--cold` drops the page,
//! dentry and inode caches before each open (Linux, as root: writes 3 to
//! /proc/sys/vm/drop_caches), so the scan reads the file system from the
//! device. The files are removed at the end.

/// The tier is not built under the model checkers' shims (`--cfg
/// kvtier_loom` / `kvtier_shuttle`): there this example only builds.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod scan {
    use std::fs;
    use std::path::PathBuf;
    use std::time::{Duration, Instant, SystemTime};

    use kvtier::FsTier;
    use kvtier::settings::BudgetConfig;
    use kvtier::tier::FsOptions;

    const PAYLOAD: usize = 84;
    const FILE: u64 = 100;

    pub fn main() -> Result<(), Box<dyn std::error::Error>> {
        let mut blocks = 100_000u64;
        let mut dir: Option<PathBuf> = None;
        let mut cold = false;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--blocks" => blocks = args.next().ok_or("--blocks N")?.parse()?,
                "--dir" => dir = Some(args.next().ok_or("--dir DIR")?.into()),
                "--cold" => cold = true,
                other => return Err(format!("unknown argument {other}").into()),
            }
        }
        let temp = tempfile::tempdir_in(dir.unwrap_or_else(std::env::temp_dir))?;
        let root = temp.path();
        let started = Instant::now();
        {
            let tier = FsTier::open(root, "scan")?;
            let payload = [7u8; PAYLOAD];
            let now = SystemTime::now();
            for key in 0..blocks {
                tier.store(&key, &payload)?;
                // Distinct times, older for lower keys, so the trim has an order.
                let file = fs::File::options().write(true).open(tier.path_of(&key))?;
                file.set_modified(now - Duration::from_millis(blocks - key))?;
            }
        }
        println!(
            "{blocks} block files created in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for (label, capacity) in [
            ("every block fits", blocks * FILE),
            ("half fits", blocks * FILE / 2),
        ] {
            if cold {
                std::process::Command::new("sync").status()?;
                fs::write("/proc/sys/vm/drop_caches", "3")?;
            }
            let started = Instant::now();
            let tier = FsTier::open_with(
                root,
                "scan",
                FsOptions::default().budget(Some(BudgetConfig::new(capacity)?)),
            )?;
            let elapsed = started.elapsed();
            let report = tier.scan_report().expect("a budget").clone();
            println!(
                "open with a budget ({label}): {:.3} s; {} blocks counted, {} trimmed ({:.0} files/s)",
                elapsed.as_secs_f64(),
                report.blocks,
                report.trimmed,
                (report.blocks + report.trimmed) as f64 / elapsed.as_secs_f64()
            );
            // What a rescan costs (FsOptions::rescan_interval): the same
            // listing, merged into books that already hold every block.
            let reconciled = tier.reconcile()?;
            println!(
                "  a reconcile then: {:.3} s ({} adopted, {} forgotten)",
                reconciled.elapsed.as_secs_f64(),
                reconciled.adopted,
                reconciled.forgotten
            );
            drop(tier);
        }
        // The part of a reconcile that holds the ledger's lock: the merge
        // of a listing of every block into books that hold them all.
        let mut ledger = kvtier::capacity::CapacityLedger::new(u64::MAX, Default::default());
        for key in 0..blocks {
            let _ = ledger.seed(key, FILE);
        }
        let listing = ledger.begin_listing();
        let started = Instant::now();
        let merged = ledger.reconcile(listing, (0..blocks).map(|key| (key, FILE)));
        println!(
            "the merge alone (under the lock): {:.3} s ({} adopted)",
            started.elapsed().as_secs_f64(),
            merged.adopted
        );
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    scan::main()?;
    Ok(())
}
