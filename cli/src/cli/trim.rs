//! `kvtier trim`: brings a tier's blocks under a byte budget (the newest
//! kept, the oldest deleted) and sweeps dead writers' temporary files, as a
//! tier with that budget does when it opens: block files in a directory
//! (`--fs`) or block objects below a bucket prefix (`--s3`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use kvtier::capacity::Policy;
use kvtier::settings::{BudgetConfig, parse_bytes};
use kvtier::tier::{BlockLayout, ScanReport, check_namespace, check_tier_dir, scan_directory};

use super::failure::Failure;
use super::s3;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("tier").required(true).args(["fs", "s3"])))]
pub(crate) struct TrimArgs {
    /// The tier's directory: for --layout kvtier the root (the namespace
    /// below it is trimmed), for --layout vllm a rank directory
    /// (`<root>/<model dirs>/..._r<rank>`).
    #[arg(long, value_name = "DIR")]
    fs: Option<PathBuf>,
    /// An object tier (ObjectTier) in an S3 or S3-compatible bucket:
    /// s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]; credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Its namespace's `.bin`
    /// objects are counted, and with --capacity the oldest (by last
    /// modified) deleted.
    #[arg(long, value_name = "URL")]
    s3: Option<String>,
    /// The namespace below DIR (kvtier's layout only).
    #[arg(
        long,
        default_value = "kvtier",
        value_name = "NAME",
        conflicts_with = "s3"
    )]
    namespace: String,
    /// Whose file layout DIR holds: `kvtier` (FsTier) or `vllm` (vLLM's fs
    /// tier, kvtier.vllm.FsTier, kvtier's connector).
    #[arg(long, default_value = "kvtier", value_parser = ["kvtier", "vllm"], conflicts_with = "s3")]
    layout: String,
    /// The budget: bytes, or with a unit (K, M, G, T: powers of 1024),
    /// e.g. 50G. Without it nothing is deleted: the usage is printed.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// Temporary files older than this many seconds are deleted (a live
    /// writer's is younger: keep it above your slowest store).
    #[arg(long, default_value_t = 600, value_name = "SECONDS", conflicts_with = "s3",
          value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    stale_temp_age: u64,
    /// How long to wait for the S3 endpoint's first answer, in
    /// milliseconds (each later request has the client's own timeout).
    #[arg(long, default_value_t = 10_000, value_name = "MS", conflicts_with = "fs",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `--capacity`: a byte size by `kvtier::settings::parse_bytes`' one
/// grammar, at least 1 byte (0 would delete every block).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes("--capacity", text).map_err(|error| error.to_string())?;
    BudgetConfig::new(bytes)
        .map(|budget| budget.capacity().get())
        .map_err(|error| {
            format!(
                "{}: a capacity of 0 bytes would delete every block; give at least 1",
                error.spelled("--capacity")
            )
        })
}

pub(crate) fn run(args: &TrimArgs) -> Result<(), Failure> {
    match (&args.fs, &args.s3) {
        (Some(dir), _) => run_fs(args, dir),
        (None, Some(url)) => run_s3(args, url),
        (None, None) => Err(Failure::input("give --fs DIR or --s3 URL")),
    }
}

fn run_fs(args: &TrimArgs, root: &Path) -> Result<(), Failure> {
    if !root.is_dir() {
        return Err(Failure::input(format!(
            "--fs {}: no such directory",
            root.display()
        )));
    }
    let (dir, layout) = match args.layout.as_str() {
        "vllm" => (root.to_owned(), BlockLayout::Vllm),
        _ => {
            check_namespace(&args.namespace)
                .map_err(|why| Failure::input(format!("--namespace: {why}")))?;
            (root.join(&args.namespace), BlockLayout::Kvtier)
        }
    };
    // Nothing below a directory that is not a tier's is counted or deleted.
    check_tier_dir(&dir, layout).map_err(|error| Failure::input(format!("--fs: {error}")))?;
    // Without a budget nothing is deleted, temporary files included.
    let stale = args
        .capacity
        .map(|_| Duration::from_secs(args.stale_temp_age));
    let report = scan_directory(&dir, layout, args.capacity, Policy::Lru, stale)
        .map_err(|error| Failure::run(error.to_string()))?;
    let place = serde_json::json!({"dir": dir.display().to_string(), "layout": args.layout});
    let label = format!("{} ({} layout)", dir.display(), args.layout);
    print(args, place, &label, &report)
}

/// The object tier's namespace listed once; with a budget, the newest
/// objects that fit kept and the rest deleted, as `ObjectTier::with_budget`
/// does when a tier opens.
fn run_s3(args: &TrimArgs, url: &str) -> Result<(), Failure> {
    let (tier, namespace) = s3::connect(url)?;
    let runtime = s3::runtime()?;
    s3::reach(&runtime, &tier, url, Duration::from_millis(args.timeout))?;
    let report = runtime
        .block_on(async {
            match args.capacity {
                Some(capacity) => tier
                    .with_budget(BudgetConfig::new(capacity)?)
                    .await
                    .map(|tier| tier.scan_report().unwrap_or_default()),
                None => tier.usage().await,
            }
        })
        .map_err(|error| Failure::run(error.to_string()))?;
    let place = serde_json::json!({"s3": url, "namespace": namespace});
    let label = format!("s3 {url} (namespace {namespace})");
    print(args, place, &label, &report)
}

fn print(
    args: &TrimArgs,
    place: serde_json::Value,
    label: &str,
    report: &ScanReport,
) -> Result<(), Failure> {
    if args.json {
        let mut json = serde_json::json!({
            "capacity_bytes": args.capacity,
            "blocks": report.blocks,
            "bytes": report.bytes,
            "trimmed": report.trimmed,
            "swept": report.swept,
            "failed": report.failed,
            "failures": report.failures,
            "seconds": report.elapsed.as_secs_f64(),
        });
        if let (Some(json), Some(place)) = (json.as_object_mut(), place.as_object()) {
            json.extend(place.clone());
        }
        say!("{json}");
    } else {
        let budget = args
            .capacity
            .map_or("no budget (usage only)".to_owned(), |c| {
                format!("budget {c} bytes")
            });
        say!("trim {label}, {budget}");
        say!(
            "  kept          {} blocks, {} bytes",
            report.blocks,
            report.bytes
        );
        let swept = if args.s3.is_some() {
            String::new() // an object store has no temporary files
        } else {
            format!(", {} stale temporary files", report.swept)
        };
        say!(
            "  deleted       {} oldest blocks{swept}, in {:.3} s",
            report.trimmed,
            report.elapsed.as_secs_f64()
        );
        if report.failed > 0 {
            say!("  not deleted   {} files:", report.failed);
            for failure in &report.failures {
                say!("    {failure}");
            }
        }
    }
    // guard: F20-trim-fails-when-it-could-not-delete
    if report.failed > 0 {
        let named = report.failures.len();
        return Err(Failure::run(format!(
            "{} files could not be deleted{}: they are still on disk",
            report.failed,
            if (named as u64) < report.failed {
                format!(" (the first {named} are listed above)")
            } else {
                " (listed above)".to_owned()
            }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units_and_refuse_the_rest() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("50G"), Ok(50 << 30));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2kb"), Ok(2048));
        assert_eq!(parse_size("16T"), Ok(16 << 40));
        for bad in ["", "G", "-1", "1.5G", "10X", "0", "99999999999T", "1 0"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
