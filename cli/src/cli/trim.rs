//! `kvtier trim`: brings a tier's block files under a byte budget (the
//! newest kept, the oldest deleted) and sweeps dead writers' temporary
//! files, as a tier with that budget does when it opens.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kvtier::capacity::Policy;
use kvtier::tier::{BlockLayout, ScanReport, check_namespace, scan_directory};

use super::Failure;

#[derive(Debug, Args)]
pub(crate) struct TrimArgs {
    /// The tier's directory: for --layout kvtier the root (the namespace
    /// below it is trimmed), for --layout vllm a rank directory
    /// (`<root>/<model dirs>/..._r<rank>`).
    #[arg(long, value_name = "DIR")]
    fs: PathBuf,
    /// The namespace below DIR (kvtier's layout only).
    #[arg(long, default_value = "kvtier", value_name = "NAME")]
    namespace: String,
    /// Whose file layout DIR holds: `kvtier` (FsTier) or `vllm` (vLLM's fs
    /// tier, kvtier.vllm.FsTier, kvtier's connector).
    #[arg(long, default_value = "kvtier", value_parser = ["kvtier", "vllm"])]
    layout: String,
    /// The budget: bytes, or with a unit (K, M, G, T: powers of 1024),
    /// e.g. 50G. Without it nothing is deleted: the usage is printed.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    capacity: Option<u64>,
    /// Temporary files older than this many seconds are deleted (a live
    /// writer's is younger: keep it above your slowest store).
    #[arg(long, default_value_t = 600, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    stale_temp_age: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of
/// 1024, an optional trailing `B` or `iB`).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size: digits, then K, M, G or T"))?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use K, M, G or T"
            ));
        }
    };
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is more bytes than fit 64 bits"))?;
    if bytes == 0 {
        return Err("a capacity of 0 bytes would delete every block; give at least 1".into());
    }
    Ok(bytes)
}

pub(crate) fn run(args: &TrimArgs) -> Result<(), Failure> {
    if !args.fs.is_dir() {
        return Err(Failure::input(format!(
            "--fs {}: no such directory",
            args.fs.display()
        )));
    }
    let (dir, layout) = match args.layout.as_str() {
        "vllm" => (args.fs.clone(), BlockLayout::Vllm),
        _ => {
            check_namespace(&args.namespace)
                .map_err(|why| Failure::input(format!("--namespace: {why}")))?;
            (args.fs.join(&args.namespace), BlockLayout::Kvtier)
        }
    };
    // Without a budget nothing is deleted, temporary files included.
    let stale = args
        .capacity
        .map(|_| Duration::from_secs(args.stale_temp_age));
    let report = scan_directory(&dir, layout, args.capacity, Policy::Lru, stale)
        .map_err(|error| Failure::run(error.to_string()))?;
    print(args, &dir, &report)
}

fn print(args: &TrimArgs, dir: &std::path::Path, report: &ScanReport) -> Result<(), Failure> {
    if args.json {
        let json = serde_json::json!({
            "dir": dir.display().to_string(),
            "layout": args.layout,
            "capacity_bytes": args.capacity,
            "blocks": report.blocks,
            "bytes": report.bytes,
            "trimmed": report.trimmed,
            "swept": report.swept,
            "seconds": report.elapsed.as_secs_f64(),
        });
        say!("{json}");
    } else {
        let budget = args
            .capacity
            .map_or("no budget (usage only)".to_owned(), |c| {
                format!("budget {c} bytes")
            });
        say!("trim {} ({} layout), {budget}", dir.display(), args.layout);
        say!(
            "  kept          {} blocks, {} bytes",
            report.blocks,
            report.bytes
        );
        say!(
            "  deleted       {} oldest blocks, {} stale temporary files, in {:.3} s",
            report.trimmed,
            report.swept,
            report.elapsed.as_secs_f64()
        );
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
