//! `kvtier saves`: deferred saves across processes. This process is the
//! scheduler; it starts `--workers` worker processes (`kvtier save-worker`,
//! this same binary), sends each step's encoded [`SaveStep`] down every
//! worker's stdin and reads one encoded [`WorkerReport`] per worker and step
//! from its stdout. The workers save real blocks on an [`FsTier`], one
//! namespace per rank, under one root.
//!
//! The scheduler simulates requests that arrive, save a block in most
//! steps, get preempted and resume, and finish; a finished request that
//! saved is freed only when every worker reported it. It checks, against
//! the files on disk, that no request is freed before every worker's saves
//! for it are published (S1), that no request is freed twice and every one
//! is freed or held (S2), and that after a step carrying a preemption every
//! save of the preempted request is on disk (S5). Faults on demand: kill -9
//! a worker after it received a step, drop a step on the way to one
//! worker, or send one twice.

use std::sync::mpsc;

use kvtier::FsTier;
use kvtier::save::SaveLatency;
use serde_json::json;

use super::failure::Failure;
use super::report::ms_or_dash;
use super::temp::{TempDir, tempfile_dir};

mod args;
mod blocks;
mod drive;
mod workers;

pub(crate) use args::SavesArgs;
use args::Tally;
pub(crate) use blocks::{block_key, block_payload, rank_namespace};
use workers::{Worker, spawn_worker};

pub(crate) fn run(args: &SavesArgs) -> Result<(), Failure> {
    for fault in [args.kill, args.drop_step, args.repeat_step]
        .into_iter()
        .flatten()
    {
        if fault.rank >= args.workers {
            return Err(Failure::input(format!(
                "fault at rank {} but there are {} workers",
                fault.rank, args.workers
            )));
        }
    }
    let temporary: Option<TempDir>;
    let root = match &args.dir {
        Some(dir) => {
            temporary = None;
            dir.clone()
        }
        None => {
            temporary = Some(tempfile_dir()?);
            temporary.as_ref().expect("just set").0.clone()
        }
    };
    // The scheduler's own view of every rank's blocks, to check S1 and S5
    // against what is published on disk.
    let tiers = (0..args.workers)
        .map(|rank| FsTier::open(&root, &rank_namespace(rank)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Failure::unreachable(error.to_string()))?;
    let (sender, incoming) = mpsc::channel();
    let mut workers = (0..args.workers)
        .map(|rank| spawn_worker(rank, &root, args.block_kib, sender.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    drop(sender);

    let outcome = drive::drive(args, &tiers, &mut workers, &incoming);
    // Close every channel, then collect the workers' ends.
    for worker in &mut workers {
        worker.steps = None;
    }
    let mut notes = Vec::new();
    let mut left_over = Vec::new();
    for worker in workers {
        let Worker {
            rank,
            mut child,
            stderr,
            lost,
            ..
        } = worker;
        let status = child.wait();
        let stderr = stderr.join().unwrap_or_default();
        if lost.is_none() && !status.as_ref().is_ok_and(|s| s.success()) {
            // A worker that was never lost must end cleanly: nothing left
            // tracked, nothing running.
            let status = status
                .as_ref()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            left_over.push(format!(
                "worker {rank} ended badly ({status}): {}",
                stderr.trim()
            ));
        }
        if let Some((step, why)) = lost {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            let said = stderr.trim();
            let said = if said.is_empty() { "nothing" } else { said };
            notes.push((rank, step, why, status, said.to_owned()));
        }
    }
    drop(temporary);
    let (mut tally, latency, held) = outcome?;
    // With a worker lost the run stops before every request finished: the
    // others then rightly end with requests they could not report.
    if notes.is_empty() {
        tally.violations.extend(left_over);
    }
    report(args, &tally, &latency, held, &notes)?;
    if !tally.violations.is_empty() {
        return Err(Failure::run(format!(
            "{} violation(s) of the save protocol; first: {}",
            tally.violations.len(),
            tally.violations[0]
        )));
    }
    if let Some((rank, step, why, _, said)) = notes.first() {
        return Err(Failure::run(format!(
            "worker {rank} lost at step {step} ({why}; it said: {said}); {held} request(s) held, never freed"
        )));
    }
    Ok(())
}

fn report(
    args: &SavesArgs,
    tally: &Tally,
    latency: &SaveLatency,
    held: usize,
    notes: &[(u32, u64, String, String, String)],
) -> Result<(), Failure> {
    if args.json {
        let lost: Vec<_> = notes
            .iter()
            .map(|(rank, step, why, status, said)| {
                json!({"rank": rank, "step": step, "why": why, "status": status, "stderr": said})
            })
            .collect();
        let value = json!({
            "workers": args.workers,
            "steps": tally.steps,
            "requests": tally.requests,
            "saves": tally.saves,
            "preemptions": tally.preemptions,
            "delayed": tally.delayed,
            "freed": tally.freed,
            "held": held,
            "max_waiting": tally.max_waiting,
            "deferred": tally.deferred,
            "tasks_waited": tally.waited,
            "save_latency_p50_us": latency.quantile(0.5).map(|d| d.as_micros() as u64),
            "save_latency_p99_us": latency.quantile(0.99).map(|d| d.as_micros() as u64),
            "violations": tally.violations,
            "lost_workers": lost,
        });
        say!("{value}");
        return Ok(());
    }
    say!(
        "{} steps, {} workers: {} requests, {} blocks saved per rank, {} preemptions",
        tally.steps,
        args.workers,
        tally.requests,
        tally.saves,
        tally.preemptions
    );
    say!(
        "{} requests delayed their free; {} freed once every worker reported them, {} held; at most {} waiting at once",
        tally.delayed,
        tally.freed,
        held,
        tally.max_waiting
    );
    say!(
        "{} finished requests were reported in a later step than their finish (a save still ran); {} saves waited by a fence",
        tally.deferred,
        tally.waited
    );
    say!(
        "save latency (all workers, bucket bounds): p50 {}, p99 {}",
        ms_or_dash(latency.quantile(0.5)),
        ms_or_dash(latency.quantile(0.99))
    );
    for (rank, step, why, status, said) in notes {
        say!("worker {rank} lost at step {step}: {why} ({status}); it said: {said}");
    }
    if tally.violations.is_empty() {
        say!("S1, S2, S5 held: no request freed before every rank published its saves, none twice");
    } else {
        for violation in &tally.violations {
            say!("VIOLATION {violation}");
        }
    }
    Ok(())
}
