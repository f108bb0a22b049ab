//! Argument parsing, errors and exit codes of the `kvtier` command.

/// `println!` that ends the command quietly when stdout has been closed
/// (piped into `head`, say) instead of panicking; other write errors fail
/// the command.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::cli::report::line(format_args!($($arg)*))?
    };
}

mod books;
mod demo;
mod failure;
mod probe;
mod report;
mod s3;
mod save_worker;
mod saves;
mod temp;
mod trim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// kvtier: a verified concurrency core for KV-cache tiering.
#[derive(Debug, Parser)]
#[command(
    name = "kvtier",
    version,
    about = "Async KV-block lookup and deferred save completion for LLM serving, on real tiers",
    after_help = "Examples:
  kvtier demo                                   # simulated scheduler on a temporary fs tier
  kvtier demo --dir ./kv-demo                   # ... keeping the tier in ./kv-demo
  kvtier probe --fs /mnt/nfs/kv-cache           # lookup latency and throughput on a mount
  kvtier probe --s3 's3://kv-cache/llama?endpoint=http://127.0.0.1:9000' --keys 2000 --json
  kvtier saves --workers 2 --steps 500          # scheduler + 2 worker processes, checked frees
  kvtier saves --kill 1@40                      # ... with worker 1 killed -9 at step 40
  kvtier trim --fs /mnt/kv --capacity 50G       # newest blocks kept within 50 GiB, oldest deleted
  kvtier trim --fs /mnt/kv/<model>/..._r0 --layout vllm --capacity 50G   # vLLM's layout
  kvtier trim --s3 's3://kv-cache/llama?endpoint=http://127.0.0.1:9000' --capacity 50G

Exit codes: 0 success, 1 failure during the run, 2 bad input, 3 storage unreachable."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log kvtier's warnings (-v) or everything down to debug (-vv) on stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate a scheduler over several steps: shared prompt prefixes,
    /// per-group lookup publication with a slow group, a failed load
    /// turned into a miss, a request cancelled mid-lookup, saves freed only
    /// when done, cleanup and key reuse. Prints a step timeline and a summary.
    Demo(demo::DemoArgs),
    /// Measure existence-lookup latency and throughput through kvtier's
    /// tokio driver against your storage, and its usage (read-only except
    /// for creating the namespace directory on --fs).
    Probe(probe::ProbeArgs),
    /// Deferred saves across processes: this process schedules, worker
    /// processes save on a real fs tier; steps and reports travel encoded
    /// over pipes, and every free is checked against the files on disk.
    /// Faults on demand (--kill, --drop-step, --repeat-step).
    Saves(saves::SavesArgs),
    /// Bring a tier's blocks (files on --fs, objects on --s3) under a byte
    /// budget: the newest kept, the oldest deleted, dead writers' temporary
    /// files swept (without --capacity: print the usage only).
    Trim(trim::TrimArgs),
    /// One worker of `kvtier saves` (started by it): steps on stdin,
    /// reports on stdout.
    #[command(hide = true)]
    SaveWorker(save_worker::SaveWorkerArgs),
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => tracing::Level::ERROR,
        1 => tracing::Level::WARN,
        _ => tracing::Level::DEBUG,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Probe(args) => probe::run(&args),
        Command::Saves(args) => saves::run(&args),
        Command::Trim(args) => trim::run(&args),
        Command::SaveWorker(args) => save_worker::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) if failure.code == 0 => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
