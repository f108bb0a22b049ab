//! `kvtier probe`: existence-lookup latency and throughput against the
//! user's storage, through the real tokio driver.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvtier::{
    FsTier, ObjectTier, TierError, lookup::AsyncBackend, lookup::GroupOutcome, lookup::TokioConfig,
    lookup::TokioLookup, tier::FsOptions,
};

use std::sync::Arc;

use kvtier::capacity::Policy;
use kvtier::settings::{BudgetConfig, IndexConfig};
use kvtier::tier::{BlockLayout, scan_directory};

use super::failure::Failure;
use super::report::{ms, ms_or_dash, quantile};
use super::s3;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("tier").required(true).args(["fs", "s3"])))]
pub(crate) struct ProbeArgs {
    /// Probe a file-system tier rooted at this existing directory.
    #[arg(long, value_name = "DIR")]
    fs: Option<PathBuf>,
    /// Probe an S3 or S3-compatible bucket:
    /// s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]; credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
    #[arg(long, value_name = "URL")]
    s3: Option<String>,
    /// The namespace below --fs DIR (created if missing).
    #[arg(long, default_value = "kvtier", value_name = "NAME")]
    namespace: String,
    /// Keys to look up.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    keys: u64,
    /// Request groups the keys are spread over (one backend call each).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    groups: u64,
    /// Groups probed at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    concurrency: u64,
    /// Per-group timeout in milliseconds; a group that takes longer is
    /// counted as timed out and its keys as misses.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout: u64,
    /// Seed of the key sequence (the same seed probes the same keys).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The tier's byte budget (bytes, or with a unit: K, M, G, T): the
    /// usage is reported against it, and what a reconcile or
    /// `kvtier trim --capacity` would delete. Nothing is deleted here.
    #[arg(long, value_name = "SIZE", value_parser = super::trim::parse_size, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// With --s3: the fleet's books of the namespace, in Valkey or Redis
    /// (redis://HOST:PORT[/DB]): the lookups ask them (one round trip per
    /// group) and their state is reported. They must exist: the probe
    /// makes none.
    #[arg(long, value_name = "URL", requires = "s3")]
    index: Option<String>,
    /// Print one JSON object instead of text (no progress bar).
    #[arg(long)]
    json: bool,
}

/// Either tier, as one backend type for the driver.
#[derive(Clone)]
enum Tier {
    Fs(FsTier),
    S3(ObjectTier),
    /// An S3 tier asking the fleet's books, their connection and upkeep on
    /// the runtime kept here.
    Books(ObjectTier, Arc<tokio::runtime::Runtime>),
}

impl AsyncBackend<u64, String> for Tier {
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[u64], request: &String) -> Result<Vec<bool>, TierError> {
        match self {
            Tier::Fs(tier) => AsyncBackend::batch_lookup(tier, keys, request).await,
            Tier::S3(tier) | Tier::Books(tier, _) => {
                AsyncBackend::batch_lookup(tier, keys, request).await
            }
        }
    }
}

/// A splitmix64 sequence: distinct-looking block hashes from a seed.
fn keys(seed: u64, count: u64) -> Vec<u64> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect()
}

fn open(args: &ProbeArgs) -> Result<(Tier, String), Failure> {
    if args.groups > args.keys {
        return Err(Failure::input(format!(
            "--groups {} exceeds --keys {}: every group needs at least one key",
            args.groups, args.keys
        )));
    }
    if let Some(dir) = &args.fs {
        if !dir.is_dir() {
            return Err(Failure::input(format!(
                "--fs {}: no such directory",
                dir.display()
            )));
        }
        let options = FsOptions::default().io_threads(1);
        let tier =
            FsTier::open_with(dir, &args.namespace, options).map_err(|error| match error {
                TierError::Namespace(_) | TierError::MissingRoot(_) => {
                    Failure::input(error.to_string())
                }
                other => Failure::unreachable(other.to_string()),
            })?;
        let label = format!("fs {} (namespace {})", dir.display(), args.namespace);
        return Ok((Tier::Fs(tier), label));
    }
    let url = args.s3.as_deref().expect("clap requires --fs or --s3");
    let (tier, namespace) = s3::connect(url)?;
    // Reach the endpoint once before measuring, so an unreachable one is an
    // error, not ten thousand misses.
    s3::reach(
        &s3::runtime()?,
        &tier,
        url,
        Duration::from_millis(args.timeout),
    )?;
    let label = format!("s3 {url} (namespace {namespace})");
    match &args.index {
        None => Ok((Tier::S3(tier), label)),
        Some(index) => with_books(tier, index, label),
    }
}

/// The tier asking the fleet's books at `index`, which must be ready.
fn with_books(tier: ObjectTier, index: &str, label: String) -> Result<(Tier, String), Failure> {
    let index = IndexConfig::new(index)
        .map_err(|error| Failure::input(error.spelled("--index").to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|error| Failure::run(error.to_string()))?;
    let shown = index.shown_url();
    let status = runtime
        .block_on(tier.books_status(&index))
        .map_err(|error| Failure::unreachable(error.to_string()))?
        .ok_or_else(|| {
            Failure::input(format!(
                "--index {shown}: no books ready for this namespace (a tier with the index makes them)"
            ))
        })?;
    let budget = BudgetConfig::new(status.capacity.max(1))
        .map_err(|error| Failure::run(error.to_string()))?;
    let tier = runtime
        .block_on(tier.with_index(budget, index))
        .map_err(|error| Failure::unreachable(error.to_string()))?;
    let label = format!("{label}, the books at {shown}");
    Ok((Tier::Books(tier, Arc::new(runtime)), label))
}

pub(crate) fn run(args: &ProbeArgs) -> Result<(), Failure> {
    let (tier, label) = open(args)?;
    let config = TokioConfig::default()
        .max_concurrent_groups(args.concurrency as usize)
        .group_timeout(Some(Duration::from_millis(args.timeout)));
    let mut lookup = TokioLookup::tokio(tier.clone(), config)
        .map_err(|error| Failure::run(error.to_string()))?;
    lookup.record_applied(true);
    let keys = keys(args.seed, args.keys);
    let requests: Vec<String> = (0..args.groups).map(|g| format!("probe-{g}")).collect();

    let progress = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(args.groups)
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} {pos}/{len} groups answered {wide_bar} {elapsed}")
            .expect("a valid template"),
    );
    let failed = |error: kvtier::LookupError| Failure::run(error.to_string());

    let started = Instant::now();
    // Key i belongs to group i mod G, so the groups are submitted (and
    // numbered) in order 0, 1, ..., G-1.
    for (i, key) in keys.iter().enumerate() {
        lookup.lookup(key, &requests[i % requests.len()]);
    }
    let submitted = lookup.flush().map_err(failed)?;
    debug_assert_eq!(submitted as u64, args.keys);
    let flushed = Instant::now();
    let mut latencies = Vec::with_capacity(requests.len());
    let (mut failed_keys, mut timed_out_keys) = (0u64, 0u64);
    while (latencies.len() as u64) < args.groups {
        lookup.drain();
        let applied = lookup.take_applied();
        if applied.is_empty() {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let now = flushed.elapsed();
        latencies.extend(applied.iter().map(|_| now));
        for (seq, outcome) in &applied {
            let keys = group_size(*seq, args.keys, args.groups);
            match outcome {
                GroupOutcome::TimedOut => timed_out_keys += keys,
                GroupOutcome::BackendError | GroupOutcome::Cancelled => failed_keys += keys,
                GroupOutcome::BackendPanic { answered } | GroupOutcome::Short { answered } => {
                    failed_keys += keys - (*answered as u64).min(keys)
                }
                GroupOutcome::Answered | GroupOutcome::Surplus => {}
                // An outcome this command does not know yet: not an answer.
                _ => failed_keys += keys,
            }
        }
        progress.inc(applied.len() as u64);
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();

    let (mut hits, mut misses) = (0u64, 0u64);
    for (i, key) in keys.iter().enumerate() {
        match lookup.lookup(key, &requests[i % requests.len()]) {
            verdict if verdict.is_hit() => hits += 1,
            _ => misses += 1,
        }
    }
    let stats = lookup.stats();
    lookup.shutdown().map_err(|error| failed(error.into()))?;
    // The tier's usage: its blocks and their bytes (read only).
    let usage = match &tier {
        Tier::Fs(fs) => {
            let dir = fs.root().join(fs.namespace());
            scan_directory(&dir, BlockLayout::Kvtier, None, Policy::Lru, None)
        }
        Tier::S3(object) | Tier::Books(object, _) => s3::runtime()?.block_on(object.usage()),
    }
    .map_err(|error| Failure::run(format!("the tier's usage: {error}")))?;
    // Keys, not groups; a failed head fails its whole group on either tier.
    let errors = failed_keys;
    let p50 = quantile(&mut latencies, 0.50);
    let p99 = quantile(&mut latencies, 0.99);
    let max = quantile(&mut latencies, 1.0);
    let keys_per_s = args.keys as f64 / elapsed.as_secs_f64();
    let books = match (&tier, &args.index) {
        (Tier::Books(object, runtime), Some(index)) => {
            let index =
                IndexConfig::new(index).map_err(|error| Failure::input(error.to_string()))?;
            runtime.block_on(object.books_status(&index)).ok().flatten()
        }
        _ => None,
    };

    if args.json {
        let report = serde_json::json!({
            "tier": label,
            "keys": args.keys,
            "groups": args.groups,
            "concurrency": args.concurrency,
            "timeout_ms": args.timeout,
            "hits": hits,
            "misses": misses,
            "timed_out_groups": stats.timeouts,
            "timed_out_keys": timed_out_keys,
            "errors": errors,
            "elapsed_s": elapsed.as_secs_f64(),
            "keys_per_s": keys_per_s,
            "group_verdict_ms": {
                "p50": p50.map(ms),
                "p99": p99.map(ms),
                "max": max.map(ms),
            },
            "usage": {
                "blocks": usage.blocks,
                "bytes": usage.bytes,
                "scan_s": usage.elapsed.as_secs_f64(),
                "capacity_bytes": args.capacity,
                "used_percent": args.capacity.map(|c| 100.0 * usage.bytes as f64 / c as f64),
                "over_bytes": args.capacity.map(|c| usage.bytes.saturating_sub(c)),
            },
            "books": books.as_ref().map(|status| serde_json::json!({
                "capacity_bytes": status.capacity,
                "committed_bytes": status.committed,
                "held_bytes": status.held,
                "blocks": status.blocks,
                "held_entries": status.held_entries,
            })),
        });
        say!("{report}");
    } else {
        say!(
            "probe {label}: {} keys in {} groups, {} at once, timeout {} ms",
            args.keys,
            args.groups,
            args.concurrency,
            args.timeout
        );
        say!(
            "  verdicts      {hits} hits, {misses} misses ({} groups timed out, {errors} keys failed)",
            stats.timeouts
        );
        say!(
            "  group verdict p50 {}, p99 {}, max {} (from flush until the group's answers reached the table)",
            ms_or_dash(p50),
            ms_or_dash(p99),
            ms_or_dash(max)
        );
        say!(
            "  throughput    {keys_per_s:.0} keys/s ({:.3} s for all keys)",
            elapsed.as_secs_f64()
        );
        say!(
            "  usage         {} blocks, {} bytes (scanned in {:.3} s; `kvtier trim` bounds it)",
            usage.blocks,
            usage.bytes,
            usage.elapsed.as_secs_f64()
        );
        if let Some(status) = &books {
            say!(
                "  books         {} of {} bytes committed in {} blocks, {} bytes held in {} entries",
                status.committed,
                status.capacity,
                status.blocks,
                status.held,
                status.held_entries
            );
        }
        if let Some(capacity) = args.capacity {
            let over = usage.bytes.saturating_sub(capacity);
            let verdict = if over == 0 {
                "within it".to_owned()
            } else {
                format!(
                    "over by {over} bytes: a reconcile (or `kvtier trim --capacity`) deletes the oldest"
                )
            };
            say!(
                "  budget        {capacity} bytes, {:.1} % used, {verdict}",
                100.0 * usage.bytes as f64 / capacity as f64
            );
        }
    }
    outcome(args.keys, errors, stats.timeouts, timed_out_keys)
}

/// Keys of group `seq`: key `i` belongs to group `i mod groups`.
fn group_size(seq: u64, keys: u64, groups: u64) -> u64 {
    keys / groups + u64::from(seq < keys % groups)
}

/// The exit status of a finished run: storage that failed lookups is a
/// failure during the run (1), and storage that failed every lookup is
/// unreachable (3), even though the report was printed.
fn outcome(keys: u64, failed: u64, timed_out_groups: u64, timed_out: u64) -> Result<(), Failure> {
    let unanswered = failed + timed_out;
    if unanswered == 0 {
        return Ok(());
    }
    let message = format!(
        "{unanswered} of {keys} lookups failed ({failed} with an error, {timed_out} in \
         {timed_out_groups} groups that timed out); they were counted as misses"
    );
    if unanswered >= keys {
        Err(Failure::unreachable(format!(
            "storage unreachable during the run: {message}"
        )))
    } else {
        Err(Failure::run(message))
    }
}
