//! A scheduler driving kvtier's two protocols against in-memory stand-ins.
//!
//! `cargo run --release --example demo`
//!
//! Part 1, async lookup: three requests share a prompt prefix; one of them
//! lives on a slow storage path. The scheduler never blocks: every step it
//! asks about each request's blocks, flushes, and sleeps a "forward pass".
//! The printout shows the fast groups resolving while the slow one is still
//! probing, a failed load being turned into a miss, a request finishing
//! mid-probe, and the final counters.
//!
//! Part 2, deferred save completion: two workers save blocks on I/O threads
//! without blocking the forward pass; a finished request's free waits until
//! both workers report its saves done; a preemption waits only for the
//! preempted request's save; a failed save and a refused one still free.

use std::collections::{BTreeMap, HashSet};
use std::thread::sleep;
use std::time::{Duration, Instant};

use kvtier::{
    SaveScheduler, SaveTracker, Ticket, Verdict, lookup::Backend, lookup::ThreadLookup,
    save::CompletionTask, save::ReportAggregator, save::TaskError,
};

/// The secondary tier: a set of block hashes, and a per-request probe latency.
struct InMemoryTier {
    blocks: HashSet<u64>,
    slow_requests: HashSet<String>,
}

impl Backend<u64, String> for InMemoryTier {
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    lookup_part()?;
    println!("\n{}\n", "-".repeat(78));
    save_part()?;
    Ok(())
}

fn lookup_part() -> Result<(), kvtier::LookupError> {
    let tier = InMemoryTier {
        // The shared prefix and some of each request's own blocks were offloaded earlier.
        blocks: [1, 2, 3, 4, 101, 201, 202, 401].into_iter().collect(),
        slow_requests: ["req-slow".to_owned()].into_iter().collect(),
    };
    let mut lookup = ThreadLookup::threaded(tier)?;
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
                .collect();
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
            let changed = lookup.mark_miss(&ticket);
            println!(
                "          load of block {} failed -> mark_miss: {changed}",
                ticket.key()
            );
        }
        if step == 2 {
            // req-fast-b finishes; a new request reusing the prefix arrives.
            lookup.cleanup(&"req-fast-b".to_owned());
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
        lookup.cleanup(request);
    }
    let table = lookup.shutdown()?;
    let stats = table.stats();
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
    println!("  table empty after cleanup: {}", table.is_empty());
    println!(
        "\nWhat to look for: the shared prefix is submitted once for every request (keys\n\
         submitted = 4 + 3 per request); the fast groups resolve while req-slow's is still\n\
         probing; req-new's group waits behind req-slow's, because this thread driver serves\n\
         groups one at a time, in order."
    );
    Ok(())
}

/// Starts a save on an I/O thread that takes `ms` and then succeeds or fails.
/// The requests a report frees; a refused report is a bug in this demo.
fn accepted(
    report: kvtier::save::Report<&'static str>,
) -> Result<Vec<&'static str>, Box<dyn std::error::Error>> {
    match report.refused.first() {
        Some(why) => Err(why.to_string().into()),
        None => Ok(report.free),
    }
}

fn save(ms: u64, fails: bool) -> CompletionTask {
    let (task, completer) = CompletionTask::new(());
    std::thread::spawn(move || {
        sleep(Duration::from_millis(ms)); // writing the blocks out
        if fails {
            completer.fail(TaskError::failed("device error"));
        } else {
            completer.succeed();
        }
    });
    task
}

fn save_part() -> Result<(), Box<dyn std::error::Error>> {
    const WORKERS: usize = 2;
    let mut scheduler = SaveScheduler::new();
    let mut workers: Vec<SaveTracker<&str, CompletionTask>> =
        (0..WORKERS).map(|_| SaveTracker::new()).collect();
    let mut frees = ReportAggregator::new(WORKERS).expect("at least one worker");
    let started = Instant::now();
    let ms = |at: Instant| at.elapsed().as_millis();

    println!("deferred save completion: 2 workers, saves run on I/O threads");
    println!("req-long's save takes 60 ms on worker 0; req-d's fails; worker 1 refuses one\n");
    // Step 1: four requests save (req-c has nothing to save this step).
    let step = scheduler.record_step([("req-long", 4), ("req-b", 2), ("req-c", 0), ("req-d", 1)]);
    for (rank, worker) in workers.iter_mut().enumerate() {
        worker.begin_step(&step).expect("steps in sequence");
        let long = if rank == 0 { 60 } else { 5 };
        worker.submit(save(long, false), &["req-long"]);
        // req-b and req-d share one batched task on worker 0.
        if rank == 0 {
            worker.submit(save(30, false), &["req-b", "req-d"]);
        } else {
            worker.submit_failed(&["req-b", "req-d"], "store queue full");
        }
        worker.submit(save(10, true), &["req-d"]);
    }
    println!(
        "step 1 t={:>3}ms  saving {:?}; wait_for_save returned at once",
        ms(started),
        step.requests()
    );

    let mut finished_at: BTreeMap<&str, Instant> = BTreeMap::new();
    for step in 2..=12 {
        sleep(Duration::from_millis(10)); // the forward pass
        let mut events = Vec::new();
        let finished: Vec<&str> = match step {
            2 => vec!["req-long", "req-c"],
            4 => vec!["req-d"],
            _ => Vec::new(),
        };
        if step == 3 {
            let fence = Instant::now();
            let waited: usize = workers
                .iter_mut()
                .map(|w| w.handle_preemptions(&["req-b"]))
                .sum();
            events.push(format!(
                "req-b preempted: fence waited {waited} task(s) in {} ms, not req-long's",
                fence.elapsed().as_millis()
            ));
        }
        for request in &finished {
            let delay = scheduler.request_finished(request);
            if delay {
                frees.expect(*request);
                finished_at.insert(request, Instant::now());
            }
            events.push(format!("{request} finished (delay free: {delay})"));
        }
        for (rank, worker) in workers.iter_mut().enumerate() {
            for request in accepted(frees.report(rank, worker.get_finished(&finished))?)? {
                events.push(format!(
                    "{request} blocks freed ({} ms after it finished)",
                    finished_at[request].elapsed().as_millis()
                ));
            }
        }
        if !events.is_empty() {
            println!("step {step} t={:>3}ms  {}", ms(started), events.join("; "));
        }
    }
    // req-b resumes and finishes later; shutdown drains what is left.
    if scheduler.request_finished(&"req-b") {
        frees.expect("req-b");
    }
    for (rank, worker) in workers.iter_mut().enumerate() {
        let mut reported = worker.get_finished(&["req-b"]);
        reported.extend(worker.wait_all());
        accepted(frees.report(rank, reported)?)?;
    }
    println!("\ncounters per worker:");
    for (rank, worker) in workers.iter().enumerate() {
        let s = worker.stats();
        println!(
            "  worker {rank}: tasks {} (reaped {}, waited {}), failed {}, refused {}, reported {}, deferred {}",
            s.tasks_submitted,
            s.tasks_reaped,
            s.tasks_waited,
            s.task_failures,
            s.submit_failures,
            s.reported,
            s.deferred
        );
    }
    println!("  requests still waiting for a report: {}", frees.waiting());
    println!(
        "\nWhat to look for: req-long's free waits ~60 ms for worker 0's save while the steps go\n\
         on; the preemption fence waits for req-b's task only; req-d's failed save and\n\
         worker 1's refused submission still free req-d, exactly once per worker."
    );
    Ok(())
}
