//! The worker processes as the scheduler sees them: started from this same
//! binary, fed steps on stdin, read back on stdout by one thread each, and
//! counted lost when their reports end, fail or stop coming.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvtier::save::{WorkerReport, wire};

use super::args::{Fault, SavesArgs};
use crate::cli::failure::Failure;

/// One worker process, as the scheduler sees it.
pub(super) struct Worker {
    pub(super) rank: u32,
    pub(super) child: Child,
    /// Its stdin; `None` once it is lost.
    pub(super) steps: Option<BufWriter<ChildStdin>>,
    /// What it wrote to stderr, collected by a thread.
    pub(super) stderr: std::thread::JoinHandle<String>,
    /// Why it was counted lost, and at which step.
    pub(super) lost: Option<(u64, String)>,
}

/// A report, or the end of a worker's stdout (`None`), or a read error.
pub(super) type Incoming = (u32, Result<Option<Vec<u8>>, String>);

pub(super) fn spawn_worker(
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
/// Sends the step to every live worker (with the faults asked for);
/// returns the ranks a report is due from.
pub(super) fn send(args: &SavesArgs, workers: &mut [Worker], step: u64, bytes: &[u8]) -> Vec<u32> {
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
pub(super) fn receive(
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
