//! The scheduler step workload of `benches/hot_path.rs`, as a standalone
//! program: `cargo run --release --example step_workload`.
//!
//! 200 steps × 32 live requests × 128 keys (64 shared prefix keys), each
//! request living 4 steps, half the keys present (see
//! `benches/workload/mod.rs` for the exact trace). The scheduler thread
//! drives an [`ThreadLookup`] whose worker thread answers from the trace's
//! `present` rule. Every step: look up every live request's keys, flush,
//! wait (untimed) until the worker has published, apply the answers, and
//! clean up the requests that end.
//!
//! Prints `ns_per_lookup=<value>`: time inside `lookup` calls divided by the
//! number of calls, median over the runs, so other implementations can be
//! compared on the same trace. The baseline, measured in the same process
//! between kvtier's runs, probes a `std::collections::HashMap<u64, bool>`
//! holding each step's live keys with the same key sequence.
//!
//! Options: `--runs N` (default 7), `--steps N` (default 200), `--batched`
//! (each request's keys in one `lookup_all` call instead of a `lookup` per
//! key; the timed loops are the functions `step_lookups_single` and
//! `step_lookups_batched`, so an instruction counter can isolate them, e.g.
//! `valgrind --tool=callgrind --toggle-collect='*step_lookups*'`).

use std::collections::HashMap;
use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use kvtier::{Verdict, lookup::ThreadLookup};

#[path = "../benches/workload/mod.rs"]
mod workload;

use workload::{Trace, present};

/// Scheduler-thread time of one kvtier run, split by call.
#[derive(Default, Clone, Copy)]
struct Run {
    lookups: u64,
    lookup: Duration,
    apply: Duration,
    flush: Duration,
    cleanup: Duration,
    hits: u64,
    misses: u64,
    pending: u64,
}

/// One step's lookups, a `lookup` per key.
#[inline(never)]
fn step_lookups_single(lookup: &mut ThreadLookup<u64, u64>, lookups: &[(u64, u64)], run: &mut Run) {
    for (key, request) in lookups {
        match black_box(lookup.lookup(key, request)) {
            Verdict::Hit(_) => run.hits += 1,
            Verdict::Miss => run.misses += 1,
            Verdict::Pending => run.pending += 1,
        }
    }
}

/// One step's lookups, a `lookup_all` per request.
#[inline(never)]
fn step_lookups_batched(
    lookup: &mut ThreadLookup<u64, u64>,
    requests: &[(Vec<u64>, u64)],
    verdicts: &mut Vec<Verdict<u64>>,
    run: &mut Run,
) {
    for (keys, request) in requests {
        black_box(lookup.lookup_all(keys, request, verdicts));
        for verdict in verdicts.iter() {
            match verdict {
                Verdict::Hit(_) => run.hits += 1,
                Verdict::Miss => run.misses += 1,
                Verdict::Pending => run.pending += 1,
            }
        }
    }
}

fn kvtier_run(steps: usize, batched: bool) -> Run {
    let backend = |keys: &[u64], _request: &u64| keys.iter().map(|&k| present(k)).collect();
    let mut lookup = ThreadLookup::threaded(backend).expect("start the lookup worker");
    let mut trace = Trace::new();
    let mut run = Run::default();
    let mut verdicts = Vec::new();
    for _ in 0..steps {
        let step = trace.next_step();
        if batched {
            // Each request's keys, gathered before the clock starts.
            let requests: Vec<(Vec<u64>, u64)> = step
                .lookups
                .chunks(workload::KEYS_PER_REQUEST)
                .map(|chunk| (chunk.iter().map(|&(key, _)| key).collect(), chunk[0].1))
                .collect();
            let start = Instant::now();
            step_lookups_batched(&mut lookup, &requests, &mut verdicts, &mut run);
            run.lookup += start.elapsed();
        } else {
            let start = Instant::now();
            step_lookups_single(&mut lookup, &step.lookups, &mut run);
            run.lookup += start.elapsed();
        }
        run.lookups += step.lookups.len() as u64;

        let start = Instant::now();
        lookup.flush().expect("driver open");
        run.flush += start.elapsed();

        // Wait for the worker (untimed), applying what it publishes (timed).
        loop {
            let start = Instant::now();
            lookup.drain();
            run.apply += start.elapsed();
            let stats = lookup.stats();
            if stats.groups_applied == stats.groups_submitted {
                break;
            }
            thread::yield_now();
        }

        let start = Instant::now();
        for request in &step.finished {
            lookup.cleanup(request);
        }
        run.cleanup += start.elapsed();
    }
    lookup.shutdown().expect("clean shutdown");
    run
}

/// The same key sequence probed in a bare map of each step's live keys;
/// returns (probe time, lookups, hits).
fn baseline_run(steps: usize) -> (Duration, u64, u64) {
    let mut trace = Trace::new();
    let (mut elapsed, mut lookups, mut hits) = (Duration::ZERO, 0, 0);
    for _ in 0..steps {
        let step = trace.next_step();
        let map: HashMap<u64, bool> = step.lookups.iter().map(|&(k, _)| (k, present(k))).collect();
        let start = Instant::now();
        for (key, _request) in &step.lookups {
            if black_box(map.get(key)) == Some(&true) {
                hits += 1;
            }
        }
        elapsed += start.elapsed();
        lookups += step.lookups.len() as u64;
    }
    (elapsed, lookups, hits)
}

fn per(duration: Duration, count: u64) -> f64 {
    duration.as_nanos() as f64 / count as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut runs = 7usize;
    let mut steps = workload::STEPS;
    let mut batched = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--batched" {
            batched = true;
            continue;
        }
        let value = args
            .next()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v > 0);
        match (arg.as_str(), value) {
            ("--runs", Some(v)) => runs = v,
            ("--steps", Some(v)) => steps = v,
            _ => {
                eprintln!("usage: step_workload [--runs N] [--steps N] [--batched]  (N > 0)");
                std::process::exit(2);
            }
        }
    }

    // One untimed warm-up of each, then alternate so both see the same noise.
    kvtier_run(steps.min(20), batched);
    baseline_run(steps.min(20));
    let (mut lookup_ns, mut scheduler_ns, mut baseline_ns) = (vec![], vec![], vec![]);
    let mut last = Run::default();
    for _ in 0..runs {
        let run = kvtier_run(steps, batched);
        lookup_ns.push(per(run.lookup, run.lookups));
        scheduler_ns.push(per(
            run.lookup + run.apply + run.flush + run.cleanup,
            run.lookups,
        ));
        let (elapsed, lookups, hits) = baseline_run(steps);
        baseline_ns.push(per(elapsed, lookups));
        assert_eq!(lookups, run.lookups, "both probe the same trace");
        assert!(hits >= run.hits, "the baseline knows every answer at once");
        last = run;
    }
    let (lookup, scheduler, baseline) = (
        median(&mut lookup_ns),
        median(&mut scheduler_ns),
        median(&mut baseline_ns),
    );
    println!(
        "trace: {steps} steps x {} requests x {} keys ({} shared), lifetime {} steps; {runs} runs, medians{}",
        workload::LIVE,
        workload::KEYS_PER_REQUEST,
        workload::SHARED_PREFIX,
        workload::LIFETIME,
        if batched {
            "; lookups batched per request"
        } else {
            ""
        }
    );
    println!(
        "verdicts per run: {} hits, {} misses, {} pending (of {} lookups)",
        last.hits, last.misses, last.pending, last.lookups
    );
    println!("ns_per_lookup={lookup:.1}");
    println!(
        "baseline_ns_per_lookup={baseline:.1}  (std HashMap<u64, bool> of the step's live keys)"
    );
    println!("ratio={:.2}", lookup / baseline);
    println!(
        "scheduler_ns_per_lookup={scheduler:.1}  (lookup + applying answers + flush + cleanup, per lookup)"
    );
}
