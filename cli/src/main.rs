//! The `kvtier` command: `kvtier demo` runs a simulated scheduler on an
//! embedded default tier; `kvtier probe` measures lookups against your own
//! storage. `kvtier --help` for the details.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod cli;

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
fn main() -> std::process::ExitCode {
    cli::main()
}

/// Built for a model checker (`--cfg kvtier_loom` / `kvtier_shuttle`): the
/// tiers and drivers the command needs are not compiled in.
#[cfg(any(kvtier_loom, kvtier_shuttle))]
fn main() {
    eprintln!(
        "kvtier was built for a model checker; rebuild without --cfg kvtier_loom/kvtier_shuttle"
    );
    std::process::exit(2);
}
