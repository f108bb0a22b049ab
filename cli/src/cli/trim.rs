//! `kvtier trim`: brings a tier's blocks under a byte budget (the newest
//! kept, the oldest deleted) and sweeps dead writers' temporary files, as a
//! tier with that budget does when it opens: block files in a directory
//! (`--fs`) or block objects below a bucket prefix (`--s3`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use kvtier::TierError;
use kvtier::capacity::Policy;
use kvtier::settings::{BudgetConfig, parse_bytes};
use kvtier::tier::{
    BlockLayout, S3Options, ScanReport, StaleUploads, VllmObjectLayout, check_namespace,
    check_tier_dir, scan_directory,
};

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
    /// An object tier in an S3 or S3-compatible bucket:
    /// s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]; credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. With --layout kvtier
    /// (ObjectTier) NAMESPACE is the tier's; with --layout vllm
    /// (kvtier.vllm.ObjectTier, the connector on a bucket) it is a rank
    /// prefix, `<prefix>/<model>_<digest>_r<rank>`. The layout's block
    /// objects are counted, and with --capacity the oldest (by last
    /// modified) deleted and the layout's unfinished multipart uploads
    /// older than --stale-temp-age aborted.
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
    /// Whose layout DIR (or the bucket prefix) holds: `kvtier` (FsTier,
    /// ObjectTier) or `vllm` (vLLM's fs and obj tiers, kvtier.vllm.FsTier
    /// and ObjectTier, kvtier's connector).
    #[arg(long, default_value = "kvtier", value_parser = ["kvtier", "vllm"])]
    layout: String,
    /// The budget: bytes, or with a unit (K, M, G, T: powers of 1024),
    /// e.g. 50G. Without it nothing is deleted: the usage is printed.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// Temporary files (in a bucket: unfinished multipart uploads) older
    /// than this many seconds are deleted (a live writer's is younger: keep
    /// it above your slowest store).
    #[arg(long, default_value_t = 600, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    stale_temp_age: u64,
    /// How long to wait for the S3 endpoint's first answer, in
    /// milliseconds (each later request has the client's own timeout).
    #[arg(long, default_value_t = 10_000, value_name = "MS", conflicts_with = "fs",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout: u64,
    /// The fleet's books of the rank prefix (with --s3 and --layout vllm),
    /// in Valkey or Redis: redis://HOST:PORT[/DB]. Prints them beside a
    /// listing; with --capacity sets the fleet-wide capacity through them
    /// (what no longer fits is evicted), and with --rebuild rebuilds them
    /// from the listing; either deletes the orphans (objects no books
    /// count) older than --stale-temp-age.
    #[arg(long, value_name = "URL", requires = "s3")]
    index: Option<String>,
    /// With --index: drop the books and rebuild them from a listing of the
    /// prefix (the hosts see a new epoch and answer from the new books).
    #[arg(long, requires = "index")]
    rebuild: bool,
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
    if let (Some(index), Some(url)) = (&args.index, &args.s3) {
        if args.layout != "vllm" {
            return Err(Failure::input(
                "--index needs --layout vllm: the fleet's books are vLLM's transfers' (a rank prefix)",
            ));
        }
        let repair = super::books::Repair {
            capacity: args.capacity,
            rebuild: args.rebuild,
            stale_temp_age: Duration::from_secs(args.stale_temp_age),
            timeout: Duration::from_millis(args.timeout),
            json: args.json,
        };
        return super::books::run(url, index, &repair);
    }
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
    print(args, place, &label, &report, None)
}

/// The namespace (a rank prefix with `--layout vllm`) listed once; with a
/// budget, the newest objects that fit kept and the rest deleted, as a
/// tier's budget does when it opens, and the layout's stale multipart
/// uploads aborted. Without one, nothing deleted: the usage, and the
/// uploads found.
fn run_s3(args: &TrimArgs, url: &str) -> Result<(), Failure> {
    let (tier, namespace) = s3::connect(url)?;
    let runtime = s3::runtime()?;
    s3::reach(&runtime, &tier, url, Duration::from_millis(args.timeout))?;
    let stale = Duration::from_secs(args.stale_temp_age);
    let vllm = match args.layout.as_str() {
        "vllm" => {
            let (options, _) =
                S3Options::from_url(url).map_err(|error| Failure::input(error.to_string()))?;
            Some(
                VllmObjectLayout::s3(&options, &namespace)
                    .map_err(|error| Failure::input(error.to_string()))?,
            )
        }
        _ => None,
    };
    let (report, uploads) = runtime
        .block_on(async {
            // Without a budget nothing is aborted: only counted (an age
            // no upload reaches).
            let age = if args.capacity.is_some() {
                stale
            } else {
                Duration::MAX
            };
            let uploads = match &vllm {
                Some(layout) => layout.abort_stale_uploads(age).await?,
                None => tier.abort_stale_uploads(age).await?,
            };
            let report = match (&vllm, args.capacity) {
                (Some(layout), Some(capacity)) => layout.trim_to(capacity, Policy::Lru).await?,
                (Some(layout), None) => layout.usage().await?,
                (None, Some(capacity)) => tier
                    .with_budget(BudgetConfig::new(capacity)?.with_stale_temp_age(None)?)
                    .await
                    .map(|tier| tier.scan_report().unwrap_or_default())?,
                (None, None) => tier.usage().await?,
            };
            Ok::<_, TierError>((report, uploads))
        })
        .map_err(|error| Failure::run(error.to_string()))?;
    let place = serde_json::json!({"s3": url, "namespace": namespace, "layout": args.layout});
    let label = format!("s3 {url} (namespace {namespace}, {} layout)", args.layout);
    print(args, place, &label, &report, Some(uploads))
}

fn print(
    args: &TrimArgs,
    place: serde_json::Value,
    label: &str,
    report: &ScanReport,
    uploads: Option<StaleUploads>,
) -> Result<(), Failure> {
    // How full the budget is after the trim (without one: the usage only).
    let used = args
        .capacity
        .map(|capacity| 100.0 * report.bytes as f64 / capacity as f64);
    if args.json {
        let mut json = serde_json::json!({
            "capacity_bytes": args.capacity,
            "used_percent": used,
            "uploads": uploads.map(|u| serde_json::json!({
                "found": u.found, "aborted": u.aborted, "failed": u.failed,
            })),
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
        let share = used.map_or(String::new(), |used| {
            format!(" ({used:.1} % of the budget)")
        });
        say!(
            "  kept          {} blocks, {} bytes{share}",
            report.blocks,
            report.bytes
        );
        let swept = match uploads {
            Some(uploads) => format!(
                ", {} stale multipart uploads ({} unfinished found, {} not aborted)",
                uploads.aborted, uploads.found, uploads.failed
            ),
            None => format!(", {} stale temporary files", report.swept),
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
