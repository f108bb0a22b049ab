//! A scheduler offering a slow tier more lookups than it can answer, with
//! and without [`LookupLimits`]: `cargo run --release --example overload`.
//!
//! The tier answers one request group per `service` on each of its lanes
//! (the thread prober has one lane; the tokio prober runs four groups at
//! once, each taking four times as long), so its capacity is one group per
//! 5 ms scheduler step with either prober. Every step, `load` new requests
//! arrive (1x, 2x, 4x and 10x the capacity), each asking for 16 blocks (two
//! of them from a shared prefix); every live request looks its blocks up
//! with `lookup_all`, and a request leaves (and is cleaned up) once none of
//! its blocks is pending any more. Unbounded, requests wait for their
//! answers as long as it takes; bounded, a key waits at most 100 ms (the
//! budget in time), at most 1,024 keys and 64 groups are outstanding (64
//! groups are 320 ms of the tier's work, so past 2x the budget runs out
//! before admission refuses), and unwanted groups are not probed;
//! **sized** has the same budget with room for what the tier answers within
//! it (20 groups, 320 keys: 100 ms of its work).
//!
//! Reported per run: the groups the tier probed per second (its measured
//! capacity: sleeps overshoot, so it is a little below the nominal 200),
//! the median and 99th percentile of the time from a key's first lookup to
//! its first verdict (hit or miss; a shed key's is immediate; a key still
//! pending when the run ends counts at its age then, a lower bound), how
//! many keys were still pending and the oldest one's age, deadline misses, shed keys, groups given up, the largest
//! table and outstanding count seen, and the largest resident set (each
//! run is its own process, so the figures do not mix).
//!
//! Options: `--seconds S` per run (default 3), `--json` (one JSON object
//! per run instead of the table), `--run DRIVER LOAD MODE` (one run, in
//! this process: `thread|tokio`, `1|2|4|10`, `bounded|unbounded`).

/// The runs need the real threads and runtime: under the model checkers'
/// shims (`--cfg kvtier_loom` / `kvtier_shuttle`) this example only builds.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod overload {
    use std::future::Future;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use kvtier::Verdict;
    use kvtier::lookup::{
        AsyncBackend, Lookup, LookupLimits, LookupStats, LookupTable, Prober, TokioConfig,
    };

    const STEP: Duration = Duration::from_millis(5);
    const BLOCKS: u64 = 16;
    const PREFIXES: u64 = 32;
    const LOADS: [u64; 4] = [1, 2, 4, 10];

    /// What one run measured.
    struct Figures {
        driver: String,
        load: u64,
        mode: String,
        keys_decided: usize,
        groups_per_second: f64,
        pending_at_end: usize,
        oldest_pending_ms: f64,
        p50_ms: f64,
        p99_ms: f64,
        stats: LookupStats,
        peak_table: usize,
        peak_outstanding: usize,
        peak_live_requests: usize,
        peak_rss_mib: f64,
    }

    fn limits(mode: &str) -> LookupLimits {
        match mode {
            "bounded" => LookupLimits::default()
                .pending_time(Some(Duration::from_millis(100)))
                .max_outstanding_keys(1024)
                .max_outstanding_groups(64),
            // Room for what the tier can answer within the budget: 200
            // groups/s for 100 ms.
            "sized" => LookupLimits::default()
                .pending_time(Some(Duration::from_millis(100)))
                .max_outstanding_keys(320)
                .max_outstanding_groups(20),
            _ => LookupLimits::unbounded(),
        }
    }

    /// A request: its id, when it arrived, its keys and when each was decided.
    struct Live {
        id: u64,
        keys: Vec<u64>,
        first_asked: Vec<Option<Instant>>,
        decided: Vec<bool>,
    }

    fn request(id: u64) -> Live {
        let prefix = id % PREFIXES;
        let mut keys = vec![(1 << 40) | prefix, (1 << 40) | ((prefix + 1) % PREFIXES)];
        keys.extend((2..BLOCKS).map(|i| id * BLOCKS + i));
        Live {
            id,
            first_asked: vec![None; keys.len()],
            decided: vec![false; keys.len()],
            keys,
        }
    }

    fn rss_mib() -> f64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: f64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        pages * 4096.0 / (1024.0 * 1024.0)
    }

    /// The scheduler loop over any prober.
    fn drive<P: Prober<u64, u64>>(
        mut lookup: Lookup<u64, u64, P>,
        load: u64,
        seconds: f64,
    ) -> (Histogram, Vec<Duration>, LookupStats, [usize; 3], f64) {
        let started = Instant::now();
        let mut live: Vec<Live> = Vec::new();
        let mut next_id = 0;
        // Allocated up front, so what the run measures does not grow its RSS.
        let mut waits = Histogram::new();
        let mut verdicts = Vec::new();
        let (mut peak_table, mut peak_out, mut peak_live, mut peak_rss) = (0, 0, 0, 0.0f64);
        let mut step_start = started;
        while started.elapsed().as_secs_f64() < seconds {
            for _ in 0..load {
                live.push(request(next_id));
                next_id += 1;
            }
            let now = Instant::now();
            for request in &mut live {
                lookup.lookup_all(&request.keys, &request.id, &mut verdicts);
                for (i, verdict) in verdicts.iter().enumerate() {
                    let first = *request.first_asked[i].get_or_insert(now);
                    if !request.decided[i] && !matches!(verdict, Verdict::Pending) {
                        request.decided[i] = true;
                        waits.record(now - first);
                    }
                }
            }
            live.retain(|request| {
                let done = request.decided.iter().all(|&d| d);
                if done {
                    lookup.cleanup(&request.id);
                }
                !done
            });
            lookup.flush().expect("the prober runs");
            let table: &LookupTable<u64, u64> = lookup.table();
            peak_table = peak_table.max(table.len());
            peak_out = peak_out.max(table.outstanding_keys());
            peak_live = peak_live.max(live.len());
            peak_rss = peak_rss.max(rss_mib());
            step_start += STEP;
            if let Some(rest) = step_start.checked_duration_since(Instant::now()) {
                std::thread::sleep(rest);
            }
        }
        let end = Instant::now();
        let pending: Vec<Duration> = live
            .iter()
            .flat_map(|request| {
                let asked = request.first_asked.iter().zip(&request.decided);
                asked
                    .filter(|(_, decided)| !**decided)
                    .filter_map(|(first, _)| first.map(|first| end - first))
                    .collect::<Vec<_>>()
            })
            .collect();
        let stats = lookup.stats();
        // The unbounded runs leave a long queue: dropping the lookup would wait
        // for it to drain (the thread prober finishes what it took).
        std::mem::forget(lookup);
        (
            waits,
            pending,
            stats,
            [peak_table, peak_out, peak_live],
            peak_rss,
        )
    }

    /// Times to verdict in 1 ms buckets, up to two minutes.
    struct Histogram {
        counts: Vec<u64>,
    }

    impl Histogram {
        fn new() -> Self {
            Self {
                counts: vec![0; 120_000],
            }
        }

        fn record(&mut self, wait: Duration) {
            let bucket = (wait.as_millis() as usize).min(self.counts.len() - 1);
            self.counts[bucket] += 1;
        }

        fn len(&self) -> u64 {
            self.counts.iter().sum()
        }

        /// The `q` quantile, in milliseconds (the bucket's lower edge).
        fn quantile(&self, q: f64) -> f64 {
            let rank = ((self.len().saturating_sub(1)) as f64 * q).round() as u64;
            let mut seen = 0;
            for (ms, &count) in self.counts.iter().enumerate() {
                seen += count;
                if seen > rank {
                    return ms as f64;
                }
            }
            f64::NAN
        }
    }

    struct SlowTier {
        service: Duration,
    }

    impl AsyncBackend<u64, u64> for SlowTier {
        type Error = std::convert::Infallible;

        fn batch_lookup(
            &self,
            keys: &[u64],
            _request: &u64,
        ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send {
            let answers: Vec<bool> = keys.iter().map(|key| key % 3 != 0).collect();
            let service = self.service;
            async move {
                tokio::time::sleep(service).await;
                Ok(answers)
            }
        }
    }

    fn run(driver: &str, load: u64, mode: &str, seconds: f64) -> Figures {
        let (mut waits, pending, stats, peaks, rss) = match driver {
            "thread" => {
                let tier = |keys: &[u64], _request: &u64| {
                    std::thread::sleep(STEP);
                    keys.iter().map(|key| key % 3 != 0).collect()
                };
                let mut lookup = Lookup::threaded(tier).expect("start the worker");
                lookup.set_limits(limits(mode)).expect("valid limits");
                drive(lookup, load, seconds)
            }
            _ => {
                let config = TokioConfig::default()
                    .max_concurrent_groups(4)
                    .group_timeout(None);
                let tier = SlowTier { service: STEP * 4 };
                let mut lookup = Lookup::tokio(tier, config).expect("start the runtime");
                lookup.set_limits(limits(mode)).expect("valid limits");
                drive(lookup, load, seconds)
            }
        };
        let keys_decided = waits.len();
        // Keys still pending at the end count at their age so far (a lower
        // bound on their time to verdict), or an overloaded run would report
        // only the keys it got to.
        for &age in &pending {
            waits.record(age);
        }
        Figures {
            driver: driver.to_owned(),
            load,
            mode: mode.to_owned(),
            keys_decided: keys_decided as usize,
            groups_per_second: (stats.groups_applied - stats.abandoned) as f64 / seconds,
            pending_at_end: pending.len(),
            oldest_pending_ms: pending
                .iter()
                .max()
                .map_or(0.0, |oldest| oldest.as_secs_f64() * 1e3),
            p50_ms: waits.quantile(0.5),
            p99_ms: waits.quantile(0.99),
            stats,
            peak_table: peaks[0],
            peak_outstanding: peaks[1],
            peak_live_requests: peaks[2],
            peak_rss_mib: rss,
        }
    }

    fn json(f: &Figures) -> String {
        format!(
            "{{\"driver\":\"{}\",\"load\":{},\"mode\":\"{}\",\"keys_decided\":{},\"groups_per_second\":{:.0},\"pending_at_end\":{},\
             \"oldest_pending_ms\":{:.0},\"p50_ms\":{:.2},\
             \"p99_ms\":{:.2},\"deadline_misses\":{},\"late_answers\":{},\"shed\":{},\"abandoned\":{},\
             \"groups_submitted\":{},\"peak_table\":{},\"peak_outstanding\":{},\
             \"peak_live_requests\":{},\"peak_rss_mib\":{:.1}}}",
            f.driver,
            f.load,
            f.mode,
            f.keys_decided,
            f.groups_per_second,
            f.pending_at_end,
            f.oldest_pending_ms,
            f.p50_ms,
            f.p99_ms,
            f.stats.deadline_misses,
            f.stats.late_answers,
            f.stats.shed,
            f.stats.abandoned,
            f.stats.groups_submitted,
            f.peak_table,
            f.peak_outstanding,
            f.peak_live_requests,
            f.peak_rss_mib
        )
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let flag = |name: &str| args.iter().position(|a| a == name);
        let seconds: f64 = flag("--seconds")
            .and_then(|i| args.get(i + 1))
            .map_or(3.0, |s| s.parse().expect("--seconds S"));
        if let Some(i) = flag("--run") {
            let driver = &args[i + 1];
            let load: u64 = args[i + 2].parse().expect("--run DRIVER LOAD MODE");
            let figures = run(driver, load, &args[i + 3], seconds);
            println!("{}", json(&figures));
            return;
        }
        let me = std::env::current_exe().expect("this program's path");
        let mut lines = Vec::new();
        for driver in ["thread", "tokio"] {
            for mode in ["unbounded", "bounded", "sized"] {
                for load in LOADS {
                    let out = Command::new(&me)
                        .args(["--seconds", &seconds.to_string(), "--run", driver])
                        .args([&load.to_string(), mode])
                        .output()
                        .expect("run one configuration");
                    assert!(out.status.success(), "{driver} {load}x {mode} failed");
                    let line = String::from_utf8(out.stdout).expect("utf-8");
                    lines.push(line.trim().to_owned());
                }
            }
        }
        if flag("--json").is_some() {
            for line in &lines {
                println!("{line}");
            }
            return;
        }
        println!(
            "| driver | bounds | load | groups probed/s | p50 ms | p99 ms | pending at end (oldest ms) | deadline misses | shed keys | given up | peak table | peak outstanding | peak live requests | peak RSS MiB |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for line in &lines {
            let field = |name: &str| {
                let at = line.find(&format!("\"{name}\":")).expect("field") + name.len() + 3;
                let rest = &line[at..];
                let end = rest.find([',', '}']).unwrap_or(rest.len());
                rest[..end].trim_matches('"').to_owned()
            };
            println!(
                "| {} | {} | {}x | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} |",
                field("driver"),
                field("mode"),
                field("load"),
                field("groups_per_second"),
                field("p50_ms"),
                field("p99_ms"),
                field("pending_at_end"),
                field("oldest_pending_ms"),
                field("deadline_misses"),
                field("shed"),
                field("abandoned"),
                field("peak_table"),
                field("peak_outstanding"),
                field("peak_live_requests"),
                field("peak_rss_mib"),
            );
        }
    }
}

fn main() {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    overload::main();
}
