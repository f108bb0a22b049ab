//! `kvtier save-worker`: one worker process of `kvtier saves`. It reads
//! encoded [`SaveStep`]s from stdin, saves each saving request's block of
//! the step on its own rank's [`FsTier`], and writes one encoded
//! [`WorkerReport`](kvtier::save::WorkerReport) per step to stdout.
//!
//! A step out of sequence (one skipped, or one taken twice) means the
//! channel from the scheduler lost or repeated a message: the worker
//! refuses it, says why on stderr and exits with code 4, holding every
//! request it has not reported (the scheduler must not free them on its
//! own). At the end of its input it waits for every save still running and
//! exits with code 5 if it still tracks a request it never reported.

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use clap::Args;
use kvtier::save::wire::{self, MessageKind};
use kvtier::tier::{FsOptions, FsSaveTask};
use kvtier::{FsTier, SaveStep, SaveTracker};

use super::failure::Failure;
use super::saves::{block_key, block_payload, rank_namespace};

/// Exit code of a worker that refused a step or a message.
pub(crate) const REFUSED: u8 = 4;
/// Exit code of a worker that ended with requests it never reported.
pub(crate) const LEFT_OVER: u8 = 5;

#[derive(Debug, Args)]
pub(crate) struct SaveWorkerArgs {
    /// This worker's rank (its index among the workers).
    #[arg(long)]
    rank: u32,
    /// The tier's root directory, shared by all ranks.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Bytes per saved block, in KiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    block_kib: u32,
}

fn refused(message: String) -> Failure {
    Failure {
        code: REFUSED,
        message,
    }
}

pub(crate) fn run(args: &SaveWorkerArgs) -> Result<(), Failure> {
    let tier = FsTier::open_with(
        &args.root,
        &rank_namespace(args.rank),
        FsOptions::default().io_threads(2),
    )
    .map_err(|error| Failure::unreachable(format!("rank {}: {error}", args.rank)))?;
    let mut tracker: SaveTracker<String, FsSaveTask> = SaveTracker::new();
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut message = Vec::new();
    let mut report = Vec::new();
    let block_bytes = args.block_kib as usize * 1024;
    loop {
        let kind = wire::read_message(&mut input, &mut message)
            .map_err(|error| refused(format!("rank {}: {error}", args.rank)))?;
        match kind {
            None => break,
            Some(MessageKind::Step) => {}
            Some(other) => {
                return Err(refused(format!(
                    "rank {}: expected a step, got a {other:?} message",
                    args.rank
                )));
            }
        }
        let step = SaveStep::<String>::decode(&message)
            .map_err(|error| refused(format!("rank {}: {error}", args.rank)))?;
        // Before the forward pass: the fence for the step's preemptions, and
        // the step's saving requests recorded.
        tracker.begin_step(&step).map_err(|error| {
            refused(format!(
                "rank {} refused step {}: {error}",
                args.rank,
                step.step()
            ))
        })?;
        // After the forward pass: one block per saving request, submitted
        // and not waited for.
        for request in step.requests() {
            let key = block_key(request, step.step());
            let task = tier.save(&key, block_payload(key, block_bytes));
            tracker.submit(task, std::slice::from_ref(request));
        }
        report.clear();
        tracker
            .finish_step(args.rank, &step)
            .encode_into(&mut report)
            .map_err(|error| refused(format!("rank {}: its report: {error}", args.rank)))?;
        let sent = output.write_all(&report).and_then(|()| output.flush());
        if sent.is_err() {
            // The scheduler is gone: nobody will free anything any more.
            break;
        }
    }
    // The scheduler closed the channel: drain the saves still running, so
    // no write is cut short when the process exits. A request still
    // tracked now was never reported; after a run in which every request
    // finished, that is a leak, and the exit code says so.
    tracker.wait_all();
    if tracker.tracked_requests() > 0 {
        return Err(Failure {
            code: LEFT_OVER,
            message: format!(
                "rank {}: {} request(s) still tracked at the end, never reported",
                args.rank,
                tracker.tracked_requests()
            ),
        });
    }
    Ok(())
}
