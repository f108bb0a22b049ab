//! A scheduler driving kvtier's async lookup against an in-memory tier.
//!
//! `cargo run --release --example demo`
//!
//! Three requests share a prompt prefix; one of them lives on a slow storage
//! path. The scheduler never blocks: every step it asks about each request's
//! blocks, flushes, and sleeps a "forward pass". The printout shows the fast
//! groups resolving while the slow one is still probing, a failed load being
//! turned into a miss, a request finishing mid-probe, and the final counters.

use std::collections::{BTreeMap, HashSet};
use std::thread::sleep;
use std::time::{Duration, Instant};

use kvtier::{AsyncLookup, LookupBackend, Ticket, Verdict};

/// The secondary tier: a set of block hashes, and a per-request probe latency.
struct InMemoryTier {
    blocks: HashSet<u64>,
    slow_requests: HashSet<String>,
}

impl LookupBackend<u64, String> for InMemoryTier {
    type Answers = Vec<bool>;
    type Error = std::convert::Infallible;

    fn batch_lookup(&mut self, keys: &[u64], request: &String) -> Result<Vec<bool>, Self::Error> {
        // Stand-in for NFS / object-store latency.
        let latency = if self.slow_requests.contains(request) {
            45
        } else {
            4
        };
        sleep(Duration::from_millis(latency));
        Ok(keys.iter().map(|key| self.blocks.contains(key)).collect())
    }
}

/// Block hashes of a request: a shared 4-block prompt prefix, then 3 of its own.
fn blocks_of(request: &str) -> Vec<u64> {
    let own = match request {
        "req-fast-a" => 100,
        "req-slow" => 200,
        "req-fast-b" => 300,
        _ => 400,
    };
    (1..=4).chain((1..=3).map(|i| own + i)).collect()
}

fn render(verdict: &Verdict<u64>) -> char {
    match verdict {
        Verdict::Hit(_) => 'H',
        Verdict::Miss => '.',
        Verdict::Pending => '?',
    }
}

fn main() -> Result<(), kvtier::LookupError> {
    let tier = InMemoryTier {
        // The shared prefix and some of each request's own blocks were offloaded earlier.
        blocks: [1, 2, 3, 4, 101, 201, 202, 401].into_iter().collect(),
        slow_requests: ["req-slow".to_owned()].into_iter().collect(),
    };
    let mut lookup = AsyncLookup::new(tier)?;
    let started = Instant::now();
    let mut requests: Vec<String> = ["req-fast-a", "req-slow", "req-fast-b"]
        .map(str::to_owned)
        .to_vec();
    let mut first_verdict_at: BTreeMap<String, Duration> = BTreeMap::new();
    let mut failed_load: Option<Ticket<u64>> = None;

    println!("H = hit, . = miss, ? = pending (ask again next step)");
    println!("blocks 1-4 are a prefix shared by every request; req-slow's probes take 45 ms\n");
    for step in 1..=8 {
        let mut line = format!("step {step} t={:>3}ms ", started.elapsed().as_millis());
        for request in &requests {
            let verdicts: Vec<Verdict<u64>> = blocks_of(request)
                .iter()
                .map(|key| lookup.lookup(key, request))
                .collect::<Result<_, _>>()?;
            if verdicts.iter().all(|v| !v.is_pending()) {
                first_verdict_at
                    .entry(request.clone())
                    .or_insert_with(|| started.elapsed());
            }
            // Loading req-fast-a's own block 101 from the tier will fail.
            if request == "req-fast-a"
                && failed_load.is_none()
                && let Some(Verdict::Hit(ticket)) = verdicts.get(4)
            {
                failed_load = Some(ticket.clone());
            }
            let shown: String = verdicts.iter().map(render).collect();
            line.push_str(&format!(" {request}:{shown}"));
        }
        println!("{line}");

        if let Some(ticket) = failed_load.take_if(|_| step == 3) {
            let changed = lookup.mark_miss(&ticket)?;
            println!(
                "          load of block {} failed -> mark_miss: {changed}",
                ticket.key()
            );
        }
        if step == 2 {
            // req-fast-b finishes; a new request reusing the prefix arrives.
            lookup.cleanup(&"req-fast-b".to_owned())?;
            requests.retain(|r| r != "req-fast-b");
            requests.push("req-new".to_owned());
            println!(
                "          req-fast-b finished while its own blocks were still probing (cleanup); req-new arrives"
            );
        }
        lookup.flush()?;
        sleep(Duration::from_millis(10)); // the forward pass
    }

    for request in &requests {
        lookup.cleanup(request)?;
    }
    lookup.shutdown()?;
    let stats = lookup.stats();
    println!("\nfirst full verdict per request:");
    for (request, at) in &first_verdict_at {
        println!("  {request:<11} {:>4} ms", at.as_millis());
    }
    println!("\ncounters after cleanup and shutdown:");
    println!(
        "  lookups {:>5}   hits {:>4}   misses {:>4}   pending answers {:>4}",
        stats.lookups, stats.hits, stats.misses, stats.pending
    );
    println!(
        "  keys submitted {:>4} in {} groups; results applied {}",
        stats.keys_submitted, stats.groups_submitted, stats.groups_applied
    );
    println!(
        "  stale results dropped {}   orphans dropped {}   marked miss {}   anomalies {}",
        stats.stale_results, stats.orphans_dropped, stats.marked_miss, stats.anomalies
    );
    println!("  table empty after cleanup: {}", lookup.table().is_empty());
    println!(
        "\nWhat to look for: the shared prefix is submitted once for every request (keys\n\
         submitted = 4 + 3 per request); the fast groups resolve while req-slow's is still\n\
         probing; req-new's group waits behind req-slow's, because this thread driver serves\n\
         groups one at a time, in order."
    );
    Ok(())
}
