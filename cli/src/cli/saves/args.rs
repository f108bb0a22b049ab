//! What `kvtier saves` is asked to do (its arguments and faults), and what
//! it saw (the tally).

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct SavesArgs {
    /// Worker processes (ranks).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(super) workers: u32,
    /// Steps with arrivals, saves, preemptions and finishes; then every
    /// request finishes and the run drains.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(super) steps: u64,
    /// Seed of the simulated workload.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Keep the tier in this directory instead of a temporary one.
    #[arg(long, value_name = "DIR")]
    pub(super) dir: Option<PathBuf>,
    /// Bytes per saved block, in KiB (about one block in five is 16 times
    /// larger, so some saves outlast a step).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(super) block_kib: u32,
    /// Fault: kill -9 worker RANK right after sending it step STEP.
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    pub(super) kill: Option<Fault>,
    /// Fault: do not send step STEP to worker RANK (lost on the wire).
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    pub(super) drop_step: Option<Fault>,
    /// Fault: send step STEP to worker RANK twice.
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_fault)]
    pub(super) repeat_step: Option<Fault>,
    /// How long to wait for a worker's report before counting it lost.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(super) report_timeout_ms: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// A fault aimed at one worker and one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(super) rank: u32,
    pub(super) step: u64,
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

/// What the run saw.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) steps: u64,
    pub(super) requests: u64,
    pub(super) saves: u64,
    pub(super) preemptions: u64,
    pub(super) delayed: u64,
    pub(super) freed: u64,
    pub(super) violations: Vec<String>,
    pub(super) max_waiting: usize,
    /// Summed over the workers' last reports: finished requests reported
    /// later than the step that finished them (a save still ran), tasks
    /// waited by a fence or a drain.
    pub(super) deferred: u64,
    pub(super) waited: u64,
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
}
