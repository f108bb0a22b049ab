//! The simulated scheduler: requests that arrive, save, get preempted and
//! finish, every free checked against the files on disk.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::Duration;

use kvtier::save::{ReportAggregator, SaveLatency};
use kvtier::{FsTier, SaveScheduler};

use super::args::{SavesArgs, Tally};
use super::blocks::{Rng, block_key};
use super::workers::{Incoming, Worker, receive, send};
use crate::cli::failure::Failure;

/// A simulated request.
struct Request {
    id: String,
    /// Preempted until this step.
    preempted_until: Option<u64>,
}
/// The run: steps until the workload is over and every delayed request is
/// freed (or can never be, a worker being lost).
pub(super) fn drive(
    args: &SavesArgs,
    tiers: &[FsTier],
    workers: &mut [Worker],
    incoming: &mpsc::Receiver<Incoming>,
) -> Result<(Tally, SaveLatency, usize), Failure> {
    let mut rng = Rng(args.seed);
    let mut scheduler = SaveScheduler::<String>::new();
    let mut frees =
        ReportAggregator::new(workers.len()).map_err(|e| Failure::run(e.to_string()))?;
    let mut tally = Tally::default();
    let mut live: Vec<Request> = Vec::new();
    // Per request, the steps in which it saved a block.
    let mut saved_in: HashMap<String, Vec<u64>> = HashMap::new();
    let mut freed: HashSet<String> = HashSet::new();
    let mut delayed: HashSet<String> = HashSet::new();
    let timeout = Duration::from_millis(args.report_timeout_ms);
    let mut quiet_steps = 0u64;
    let drain_limit = args.steps + 5_000;
    let mut step_bytes = Vec::new();

    for step in 0.. {
        let working = step < args.steps;
        if !working && live.is_empty() && frees.waiting() == 0 {
            break;
        }
        let any_lost = workers.iter().any(|w| w.lost.is_some());
        if step >= drain_limit || (any_lost && quiet_steps > 200) {
            break;
        }
        if working {
            // Arrivals, resumptions and preemptions, decided before the step.
            if live.len() < 32 && rng.chance(50) {
                live.push(Request {
                    id: format!("req-{}", tally.requests),
                    preempted_until: None,
                });
                tally.requests += 1;
            }
            let mut preempted = Vec::new();
            for request in &mut live {
                match request.preempted_until {
                    Some(until) if until <= step => request.preempted_until = None,
                    Some(_) => {}
                    None if rng.chance(3) => {
                        request.preempted_until = Some(step + 1 + rng.below(3));
                        preempted.push(request.id.clone());
                    }
                    None => {}
                }
            }
            tally.preemptions += preempted.len() as u64;
            scheduler.preempt(&preempted);
        }
        let saves: Vec<(String, usize)> = live
            .iter()
            .filter(|r| working && r.preempted_until.is_none() && rng.chance(70))
            .map(|r| (r.id.clone(), 1))
            .collect();
        let metadata = scheduler.record_step(saves);
        for request in metadata.requests() {
            saved_in.entry(request.clone()).or_default().push(step);
            tally.saves += 1;
        }
        step_bytes.clear();
        metadata
            .encode_into(&mut step_bytes)
            .map_err(|error| Failure::run(format!("step {step}: {error}")))?;
        let expecting = send(args, workers, step, &step_bytes);
        let mut freed_now = Vec::new();
        receive(
            workers,
            step,
            expecting,
            incoming,
            timeout,
            |rank, report| {
                // S5 across processes: the step's preempted requests' saves are
                // on this rank's disk once it took the step.
                for request in metadata.preempted() {
                    check_published(
                        &tiers[rank as usize],
                        rank,
                        request,
                        &saved_in,
                        step,
                        "S5",
                        &mut tally.violations,
                    );
                }
                match frees.accept(report) {
                    Ok(report) => {
                        for refusal in report.refused {
                            tally
                                .violations
                                .push(format!("step {step}: report refused: {refusal}"));
                        }
                        freed_now.extend(report.free);
                    }
                    Err(error) => tally.violations.push(format!("step {step}: {error}")),
                }
            },
        )?;
        quiet_steps = if freed_now.is_empty() {
            quiet_steps + 1
        } else {
            0
        };
        for request in freed_now {
            // S1: every rank published every block the request saved.
            for (rank, tier) in tiers.iter().enumerate() {
                check_published(
                    tier,
                    rank as u32,
                    &request,
                    &saved_in,
                    u64::MAX,
                    "S1",
                    &mut tally.violations,
                );
            }
            // S2: once, and only what was delayed.
            if !delayed.contains(&request) || !freed.insert(request.clone()) {
                tally
                    .violations
                    .push(format!("S2: {request} freed twice or never delayed"));
            }
            tally.freed += 1;
        }
        tally.max_waiting = tally.max_waiting.max(frees.waiting());
        // Finishes, after the step's output: carried by the next step.
        let finish_all = !working;
        let mut still = Vec::new();
        for request in live.drain(..) {
            if finish_all || rng.chance(8) {
                if scheduler.request_finished(&request.id) {
                    frees.expect(request.id.clone());
                    delayed.insert(request.id.clone());
                    tally.delayed += 1;
                }
            } else {
                still.push(request);
            }
        }
        live = still;
        tally.steps = step + 1;
        if !working {
            // Draining: give the saves still running a moment.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for rank in 0..workers.len() {
        if let Some((stats, _)) = frees.worker_stats(rank) {
            tally.deferred += stats.deferred;
            tally.waited += stats.tasks_waited;
        }
    }
    let held = frees.waiting();
    if held > 0 && workers.iter().all(|w| w.lost.is_none()) {
        tally.violations.push(format!(
            "S2: {held} delayed request(s) never freed, no worker lost"
        ));
    }
    Ok((tally, frees.latency(), held))
}
/// Checks that `rank` published every block `request` saved before step
/// `before`; records a violation of `rule` for each one missing.
fn check_published(
    tier: &FsTier,
    rank: u32,
    request: &str,
    saved_in: &HashMap<String, Vec<u64>>,
    before: u64,
    rule: &str,
    violations: &mut Vec<String>,
) {
    for &step in saved_in.get(request).into_iter().flatten() {
        if step >= before {
            continue;
        }
        let key = block_key(request, step);
        match tier.contains(&key) {
            Ok(true) => {}
            Ok(false) => violations.push(format!(
                "{rule}: {request} released while rank {rank}'s save of step {step} (block {key:#x}) is not published"
            )),
            Err(error) => violations.push(format!("{rule}: checking {key:#x} on rank {rank}: {error}")),
        }
    }
}
