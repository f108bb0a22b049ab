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

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use kvtier::save::wire;
use kvtier::save::{ReportAggregator, SaveLatency, WorkerReport};
use kvtier::{FsTier, SaveScheduler};
use serde_json::json;

use super::Failure;
use super::demo::{TempDir, tempfile_dir};
use super::report::ms_or_dash;

#[derive(Debug, Args)]
pub(crate) struct SavesArgs {
    /// Worker processes (ranks).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    workers: u32,
    /// Steps with arrivals, saves, preemptions and finishes; then every
    /// request finishes and the run drains.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    steps: u64,
    /// Seed of the simulated workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep the tier in this directory instead of a temporary one.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Bytes per saved block, in KiB (every fifth request saves 16 times
    /// as much, so some saves outlast a step).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    block_kib: u32,
    /// Fault: kill -9 worker RANK right after sending it step STEP.
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    kill: Option<Fault>,
    /// Fault: do not send step STEP to worker RANK (lost on the wire).
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    drop_step: Option<Fault>,
    /// Fault: send step STEP to worker RANK twice.
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    repeat_step: Option<Fault>,
    /// How long to wait for a worker's report before counting it lost.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    report_timeout_ms: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// A fault aimed at one worker and one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    rank: u32,
    step: u64,
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    let (rank, step) = text
        .split_once('@')
        .ok_or_else(|| format!("expected RANK@STEP, got {text:?}"))?;
    let rank = rank
        .parse()
        .map_err(|_| format!("bad rank {rank:?} in {text:?}"))?;
    let step = step
        .parse()
        .map_err(|_| format!("bad step {step:?} in {text:?}"))?;
    Ok(Fault { rank, step })
}

/// The namespace of rank `rank`'s blocks under the shared root.
pub(crate) fn rank_namespace(rank: u32) -> String {
    format!("rank{rank}")
}

/// The key of the block `request` saves in step `step` (FNV-1a over the id,
/// mixed with the step).
pub(crate) fn block_key(request: &str, step: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in request.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix(hash ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A block's bytes: its key, repeated; every fifth request's blocks (by
/// key) are 16 times longer.
pub(crate) fn block_payload(key: u64, bytes: usize) -> Vec<u8> {
    let len = if key.is_multiple_of(5) {
        bytes * 16
    } else {
        bytes
    };
    let mut payload = key.to_le_bytes().repeat(len.div_ceil(8));
    payload.truncate(len);
    payload
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The workload's random numbers.
struct Rng(u64);

impl Rng {
    fn chance(&mut self, percent: u64) -> bool {
        self.0 = splitmix(self.0);
        self.0 % 100 < percent
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 = splitmix(self.0);
        self.0 % n.max(1)
    }
}

/// One worker process, as the scheduler sees it.
struct Worker {
    rank: u32,
    child: Child,
    /// Its stdin; `None` once it is lost.
    steps: Option<BufWriter<ChildStdin>>,
    /// What it wrote to stderr, collected by a thread.
    stderr: std::thread::JoinHandle<String>,
    /// Why it was counted lost, and at which step.
    lost: Option<(u64, String)>,
}

/// A report, or the end of a worker's stdout (`None`), or a read error.
type Incoming = (u32, Result<Option<Vec<u8>>, String>);

fn spawn_worker(
    rank: u32,
    root: &Path,
    block_kib: u32,
    incoming: mpsc::Sender<Incoming>,
) -> Result<Worker, Failure> {
    let exe = std::env::current_exe()
        .map_err(|error| Failure::run(format!("cannot find the kvtier binary: {error}")))?;
    let mut child = Command::new(exe)
        .arg("save-worker")
        .arg("--rank")
        .arg(rank.to_string())
        .arg("--root")
        .arg(root)
        .arg("--block-kib")
        .arg(block_kib.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| Failure::run(format!("cannot start worker {rank}: {error}")))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let steps = child.stdin.take().map(BufWriter::new);
    // The command's own threads (application code, outside the library's
    // shim): one reads each worker's reports, one its stderr.
    std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut message = Vec::new();
        loop {
            let read = wire::read_message(&mut stdout, &mut message);
            let ended = !matches!(read, Ok(Some(_)));
            let item = match read {
                Ok(Some(_)) => Ok(Some(std::mem::take(&mut message))),
                Ok(None) => Ok(None),
                Err(error) => Err(error.to_string()),
            };
            if incoming.send((rank, item)).is_err() || ended {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    Ok(Worker {
        rank,
        child,
        steps,
        stderr,
        lost: None,
    })
}

/// A simulated request.
struct Request {
    id: String,
    /// Preempted until this step.
    preempted_until: Option<u64>,
}

/// What the run saw.
#[derive(Default)]
struct Tally {
    steps: u64,
    requests: u64,
    saves: u64,
    preemptions: u64,
    delayed: u64,
    freed: u64,
    violations: Vec<String>,
    max_waiting: usize,
    /// Summed over the workers' last reports: finished requests reported
    /// later than the step that finished them (a save still ran), tasks
    /// waited by a fence or a drain.
    deferred: u64,
    waited: u64,
}

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

    let outcome = drive(args, &tiers, &mut workers, &incoming);
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

/// The run: steps until the workload is over and every delayed request is
/// freed (or can never be, a worker being lost).
fn drive(
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
        metadata.encode_into(&mut step_bytes);
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

/// Sends the step to every live worker (with the faults asked for);
/// returns the ranks a report is due from.
fn send(args: &SavesArgs, workers: &mut [Worker], step: u64, bytes: &[u8]) -> Vec<u32> {
    let mut expecting = Vec::new();
    for worker in workers.iter_mut() {
        let at = |fault: Option<Fault>| {
            fault
                == Some(Fault {
                    rank: worker.rank,
                    step,
                })
        };
        let Some(channel) = worker.steps.as_mut() else {
            continue;
        };
        if at(args.drop_step) {
            // Lost on the wire: no report can come for it.
            continue;
        }
        let copies = if at(args.repeat_step) { 2 } else { 1 };
        let mut sent = Ok(());
        for _ in 0..copies {
            sent = sent.and_then(|()| channel.write_all(bytes));
        }
        if let Err(error) = sent.and_then(|()| channel.flush()) {
            lose(worker, step, format!("its stdin failed: {error}"));
            continue;
        }
        expecting.push(worker.rank);
        if at(args.kill) {
            // kill -9 while it works on the step.
            let _ = worker.child.kill();
        }
    }
    expecting
}

fn lose(worker: &mut Worker, step: u64, why: String) {
    if worker.lost.is_none() {
        worker.lost = Some((step, why));
    }
    worker.steps = None;
}

/// Reads one report from each rank in `expecting`, in whatever order they
/// come; a rank whose stdout ends, fails or stays silent past `timeout` is
/// lost.
fn receive(
    workers: &mut [Worker],
    step: u64,
    mut expecting: Vec<u32>,
    incoming: &mpsc::Receiver<Incoming>,
    timeout: Duration,
    mut take: impl FnMut(u32, WorkerReport<String>),
) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    while !expecting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, item) = match incoming.recv_timeout(left) {
            Ok(message) => message,
            Err(_) => {
                for rank in expecting.drain(..) {
                    lose(
                        &mut workers[rank as usize],
                        step,
                        format!("no report within {timeout:?}"),
                    );
                }
                break;
            }
        };
        let worker = &mut workers[rank as usize];
        if worker.lost.is_some() {
            continue;
        }
        match item {
            Ok(Some(message)) => match WorkerReport::<String>::decode(&message) {
                Ok(report) => {
                    expecting.retain(|r| *r != rank);
                    take(rank, report);
                }
                Err(error) => lose(
                    worker,
                    step,
                    format!("it sent an undecodable report: {error}"),
                ),
            },
            Ok(None) => lose(worker, step, "its reports ended".to_owned()),
            Err(error) => lose(worker, step, format!("reading its reports failed: {error}")),
        }
        if worker.lost.is_some() {
            expecting.retain(|r| *r != rank);
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_as_rank_at_step() {
        assert_eq!(parse_fault("1@40"), Ok(Fault { rank: 1, step: 40 }));
        assert!(parse_fault("1-40").is_err());
        assert!(parse_fault("x@4").is_err());
        assert!(parse_fault("1@").is_err());
    }

    #[test]
    fn block_keys_differ_by_request_and_step() {
        assert_ne!(block_key("req-1", 0), block_key("req-1", 1));
        assert_ne!(block_key("req-1", 0), block_key("req-2", 0));
        assert_eq!(block_key("req-1", 7), block_key("req-1", 7));
        assert_eq!(block_payload(5, 8).len(), 128);
        assert_eq!(block_payload(6, 8).len(), 8);
    }
}
