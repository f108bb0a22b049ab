//! How the loom and shuttle test files run their models: one place for the
//! bounds, iteration counts, replay and the printed figures, so every model
//! file honours the same environment variables.

/// Explores `body` with loom: preemption bound 3 unless `LOOM_MAX_PREEMPTIONS`
/// sets another, or none at all with `KVTIER_LOOM_EXHAUSTIVE=1`; prints how
/// many interleavings were explored.
#[cfg(kvtier_loom)]
pub fn explore(name: &str, body: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    // A plain std counter: it counts executions, outside loom's view.
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("KVTIER_LOOM_EXHAUSTIVE").is_some() {
        builder.preemption_bound = None;
    } else {
        builder.preemption_bound.get_or_insert(3);
    }
    let bound = builder.preemption_bound;
    let started = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        body();
    });
    println!(
        "loom model {name}: {} interleavings, preemption bound {bound:?}, {:.2?}",
        executions.load(Ordering::Relaxed),
        started.elapsed()
    );
}

/// A shuttle scheduler.
#[cfg(kvtier_shuttle)]
#[derive(Clone, Copy, Debug)]
pub enum Schedules {
    /// Uniformly random scheduling decisions.
    Random,
    /// Probabilistic concurrency testing, depth 3: bugs that need up to two
    /// forced preemptions.
    Pct,
}

/// Runs `scenario` under `schedules` for `KVTIER_SHUTTLE_ITERATIONS`
/// schedules (default 100,000) and prints how long that took — or, when
/// `KVTIER_SHUTTLE_REPLAY` holds a printed failing schedule, replays it.
#[cfg(kvtier_shuttle)]
pub fn run_shuttle(name: &str, scenario: fn(), schedules: Schedules) {
    if let Ok(schedule) = std::env::var("KVTIER_SHUTTLE_REPLAY") {
        shuttle::replay(scenario, &schedule);
        return;
    }
    let iterations = std::env::var("KVTIER_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let started = std::time::Instant::now();
    match schedules {
        Schedules::Random => shuttle::check_random(scenario, iterations),
        Schedules::Pct => shuttle::check_pct(scenario, iterations, 3),
    }
    println!(
        "shuttle {name} ({schedules:?}): {iterations} schedules in {:.1?}",
        started.elapsed()
    );
}
