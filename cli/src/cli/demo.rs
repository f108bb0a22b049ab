//! `kvtier demo`: a small scheduler over several steps on a real file-system
//! tier, exercising both protocols and printing what happens.
//!
//! The demo is an application of the library, not part of its verified
//! core: its own bookkeeping (a `std` mutex for the backend's event log, a
//! `std` thread per slow save) uses `std` directly, since the crate's sync
//! shim is private to the library. Everything kvtier itself runs goes
//! through the shim as usual.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use kvtier::{
    FsTier, SaveScheduler, SaveTracker, StoreTask, TierError, Verdict, lookup::AsyncBackend,
    lookup::Phase, lookup::TokioConfig, lookup::TokioLookup, save::CompletionTask, save::TaskError,
    tier::FsSaveTask,
};

use super::failure::Failure;
use super::report::{ms, ms_or_dash, quantile};
use super::temp::tempfile_dir;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Keep the tier in this directory (created if missing) instead of a
    /// temporary one.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Extra delay of the slow requests' lookups, in milliseconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    slow_ms: u64,
}

/// Blocks of the shared system prompt, present in the tier from an earlier run.
const PREFIX: [u64; 6] = [
    0x5157_0001,
    0x5157_0002,
    0x5157_0003,
    0x5157_0004,
    0x5157_0005,
    0x5157_0006,
];
/// The prefix block whose file is damaged: found by lookup, refused by load.
const DAMAGED: u64 = 0x5157_0005;
/// How long the scheduler idles between steps, draining published answers,
/// beyond the slow path's delay (so the slow groups land within their step).
const STEP_SLACK: Duration = Duration::from_millis(30);
/// Bytes per KV block in the demo.
const BLOCK_BYTES: usize = 16 * 1024;

fn own_blocks(request: u32, count: u64) -> Vec<u64> {
    (0..count)
        .map(|i| 0xB10C_0000 + u64::from(request) * 0x100 + i)
        .collect()
}

fn block_bytes(key: u64) -> Vec<u8> {
    key.to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(BLOCK_BYTES)
        .collect()
}

/// The fs tier, with the lookups of some requests delayed (a slow path to
/// the storage), recording when each group is answered.
struct DemoBackend {
    tier: FsTier,
    slow: HashSet<String>,
    delay: Duration,
    answered: Arc<Mutex<Vec<(String, usize, Instant)>>>,
}

impl AsyncBackend<u64, String> for DemoBackend {
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[u64], request: &String) -> Result<Vec<bool>, TierError> {
        if self.slow.contains(request) {
            tokio::time::sleep(self.delay).await;
        }
        let answers = AsyncBackend::batch_lookup(&self.tier, keys, request).await;
        self.answered.lock().expect("demo bookkeeping").push((
            request.clone(),
            keys.len(),
            Instant::now(),
        ));
        answers
    }
}

/// A save on the tier's I/O threads, or one to a slow device (a thread
/// that waits before writing), so a request can finish while its saves
/// still run.
enum DemoSave {
    Fs(FsSaveTask),
    Slow(CompletionTask<()>),
}

impl DemoSave {
    fn slow(tier: &FsTier, key: u64, delay: Duration) -> Self {
        let (task, completer) = CompletionTask::new(());
        let tier = tier.clone();
        // The demo's simulated slow device: application code, outside the
        // library's shim (see the module docs); completion goes through
        // kvtier's CompletionTask, which uses the shim.
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            match tier.store(&key, &block_bytes(key)) {
                Ok(()) => completer.succeed(),
                Err(error) => completer.fail(TaskError::Failed(Box::new(error))),
            }
        });
        Self::Slow(task)
    }
}

impl StoreTask for DemoSave {
    fn check(&self) -> bool {
        match self {
            Self::Fs(task) => task.check(),
            Self::Slow(task) => task.check(),
        }
    }

    fn wait(self) -> Result<(), TaskError> {
        match self {
            Self::Fs(task) => task.wait(),
            Self::Slow(task) => task.wait(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    NotArrived,
    Waiting,
    Running { steps_left: u32 },
    Finished,
    Cancelled,
}

struct Req {
    id: String,
    blocks: Vec<u64>,
    arrives: u32,
    /// Steps it runs once scheduled (0: finishes in the step it starts).
    runs: u32,
    /// Cancelled by its client right after this step's flush.
    cancel_at: Option<u32>,
    /// Its saves go to a slow device.
    slow_saves: bool,
    state: State,
}

fn plan() -> Vec<Req> {
    let request = |n: u32, arrives: u32, blocks: Vec<u64>, runs: u32| Req {
        id: format!("r{n}"),
        blocks,
        arrives,
        runs,
        cancel_at: None,
        slow_saves: false,
        state: State::NotArrived,
    };
    let with_prefix = |own: Vec<u64>| -> Vec<u64> { PREFIX.iter().copied().chain(own).collect() };
    let mut requests = vec![
        // r1's lookups take the slow path; r2's, submitted after them, do not.
        request(1, 1, with_prefix(own_blocks(1, 4)), 2),
        request(2, 1, with_prefix(own_blocks(2, 3)), 2),
        // r3 (slow too) is cancelled while its lookup is in flight.
        request(3, 2, with_prefix(own_blocks(3, 3)), 2),
        // r4 continues r2's conversation, saves to a slow device and
        // finishes in the step it starts, before its saves are done: its
        // blocks are freed a step later.
        request(
            4,
            3,
            with_prefix([own_blocks(2, 3), own_blocks(4, 2)].concat()),
            0,
        ),
        // r5 repeats r1's prompt after r1 finished: its keys were cleaned up
        // and are probed afresh (new generations), now as hits.
        request(5, 6, with_prefix(own_blocks(1, 4)), 1),
        // r6 repeats the cancelled r3's prompt: never saved, so misses.
        request(6, 6, with_prefix(own_blocks(3, 3)), 1),
    ];
    requests[2].cancel_at = Some(2);
    requests[3].slow_saves = true;
    requests
}

#[derive(Default)]
struct Totals {
    loads: u64,
    computed: u64,
    failed_loads: u64,
    saves_submitted: u64,
    latencies: Vec<Duration>,
}

pub(crate) fn run(args: &DemoArgs) -> Result<(), Failure> {
    let failed = |error: kvtier::LookupError| Failure::run(error.to_string());
    let temporary;
    let root = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|error| Failure::input(format!("--dir {}: {error}", dir.display())))?;
            dir.clone()
        }
        None => {
            temporary = tempfile_dir()?;
            temporary.0.clone()
        }
    };
    let tier = FsTier::open(&root, "demo-model/rank0")
        .map_err(|error| Failure::input(error.to_string()))?;
    // An earlier run left the shared prefix in the tier; one of its files
    // has since been damaged (cut short).
    for key in PREFIX {
        tier.store(&key, &block_bytes(key))
            .map_err(|error| Failure::run(error.to_string()))?;
    }
    let damaged = tier.path_of(&DAMAGED);
    std::fs::write(
        &damaged,
        &std::fs::read(&damaged).unwrap_or_default()[..100],
    )
    .map_err(|error| Failure::run(format!("{}: {error}", damaged.display())))?;

    let answered = Arc::new(Mutex::new(Vec::new()));
    let backend = DemoBackend {
        tier: tier.clone(),
        slow: ["r1".to_owned(), "r3".to_owned()].into(),
        delay: Duration::from_millis(args.slow_ms),
        answered: answered.clone(),
    };
    let config = TokioConfig::default()
        .max_concurrent_groups(4)
        .group_timeout(Some(Duration::from_secs(2)));
    let mut lookup = TokioLookup::tokio(backend, config).map_err(failed)?;
    let mut scheduler: SaveScheduler<String> = SaveScheduler::new();
    let mut worker: SaveTracker<String, DemoSave> = SaveTracker::new();
    let mut requests = plan();
    let mut totals = Totals::default();

    say!(
        "kvtier demo: a scheduler over 7 steps on an fs tier at {}",
        root.join(tier.namespace()).display()
    );
    say!(
        "  lookups: TokioLookup, 4 groups at once, 2 s timeout; r1 and r3 take a {} ms slow path",
        args.slow_ms
    );
    say!(
        "  saves: SaveTracker over FsTier saves (write + rename on I/O threads); r4's go to a slow device"
    );
    say!("");

    let step_length = Duration::from_millis(args.slow_ms) + STEP_SLACK;
    for step in 1..=7u32 {
        let mut lines = Vec::new();
        let arrived: Vec<&str> = requests
            .iter_mut()
            .filter(|r| r.arrives == step)
            .map(|r| {
                r.state = State::Waiting;
                r.id.as_str()
            })
            .collect();
        let mut header = format!("step {step}");
        if !arrived.is_empty() {
            header += &format!("  arrive {}", arrived.join(" "));
        }

        // Ask about every block of each waiting request in turn; run the
        // request once every verdict is in: load its hits (a failed load is
        // marked a miss, so later lookups do not offer it again), compute
        // the rest, and save what was computed.
        let (mut hits, mut misses, mut pending) = (0, 0, 0);
        let mut saves: Vec<(String, Vec<u64>, bool)> = Vec::new();
        for request in requests.iter_mut().filter(|r| r.state == State::Waiting) {
            let mut verdicts = Vec::new();
            for key in &request.blocks {
                let verdict = lookup.lookup(key, &request.id);
                match &verdict {
                    Verdict::Hit(_) => hits += 1,
                    Verdict::Miss => misses += 1,
                    Verdict::Pending => pending += 1,
                }
                verdicts.push(verdict);
            }
            if verdicts.iter().any(Verdict::is_pending) {
                continue;
            }
            request.state = State::Running {
                steps_left: request.runs,
            };
            let (mut loaded, mut computed) = (0, Vec::new());
            for (key, verdict) in request.blocks.iter().zip(&verdicts) {
                let Verdict::Hit(ticket) = verdict else {
                    computed.push(*key);
                    continue;
                };
                match tier.load(ticket.key()) {
                    Ok(Some(_)) => loaded += 1,
                    failure => {
                        let why = match failure {
                            Err(error) => short(&error.to_string()).to_owned(),
                            _ => "the block is gone".to_owned(),
                        };
                        lookup.mark_miss(ticket);
                        totals.failed_loads += 1;
                        lines.push(format!(
                            "         {}: loading block {key:#x} failed ({why}); mark_miss: recomputed here, a miss for later lookups",
                            request.id
                        ));
                        computed.push(*key);
                    }
                }
            }
            totals.loads += loaded;
            totals.computed += computed.len() as u64;
            lines.push(format!(
                "         run {}: {loaded} blocks loaded from the tier, {} computed and saved",
                request.id,
                computed.len()
            ));
            saves.push((request.id.clone(), computed, request.slow_saves));
        }
        if hits + misses + pending > 0 {
            header += &format!(
                "  lookups {}: {hits} hit, {misses} miss, {pending} pending",
                hits + misses + pending
            );
        }

        let save_step =
            scheduler.record_step(saves.iter().map(|(id, keys, _)| (id.clone(), keys.len())));
        worker.begin_step(&save_step).expect("steps in sequence");
        for (id, keys, slow) in &saves {
            for key in keys {
                let task = if *slow {
                    DemoSave::slow(&tier, *key, Duration::from_millis(args.slow_ms))
                } else {
                    DemoSave::Fs(tier.save(key, block_bytes(*key)))
                };
                worker.submit(task, std::slice::from_ref(id));
                totals.saves_submitted += 1;
            }
        }

        // Requests that end this step: forget their lookups; their blocks
        // are freed once no save reads them.
        let mut finishing = Vec::new();
        for request in requests.iter_mut() {
            if let State::Running { steps_left } = request.state {
                if steps_left == 0 {
                    request.state = State::Finished;
                    lookup.cleanup(&request.id);
                    let delayed = scheduler.request_finished(&request.id);
                    if delayed {
                        lines.push(format!(
                            "         {} finished; it saved blocks, so its free waits for the save tracker",
                            request.id
                        ));
                    } else {
                        lines.push(format!(
                            "         {} finished; it saved nothing, freed at once",
                            request.id
                        ));
                    }
                    finishing.push(request.id.clone());
                } else {
                    request.state = State::Running {
                        steps_left: steps_left - 1,
                    };
                }
            }
        }
        let freed = worker.get_finished(&finishing);
        let later: Vec<&String> = freed.iter().filter(|id| !finishing.contains(id)).collect();
        let now: Vec<&String> = freed.iter().filter(|id| finishing.contains(id)).collect();
        if !now.is_empty() {
            lines.push(format!(
                "         freed {}: every save reading their blocks is done",
                join(&now)
            ));
        }
        if !later.is_empty() {
            lines.push(format!(
                "         freed {} now that its saves are done (a delayed free)",
                join(&later)
            ));
        }

        // End of step: hand the new keys to the driver.
        let flushed_at = Instant::now();
        let keys = lookup.flush().map_err(failed)?;
        // Keys now in flight, whose time to verdict is measured below.
        let mut unresolved: HashSet<u64> = requests
            .iter()
            .filter(|r| r.state == State::Waiting)
            .flat_map(|r| r.blocks.iter().copied())
            .filter(|key| {
                lookup
                    .table()
                    .key_state(key)
                    .is_some_and(|s| s.phase == Phase::InFlight)
            })
            .collect();
        if keys > 0 {
            header += &format!("  → flush {keys} new keys");
        }
        say!("{header}");
        for line in lines {
            say!("{line}");
        }

        for request in requests.iter_mut() {
            if request.cancel_at == Some(step) && request.state == State::Waiting {
                request.state = State::Cancelled;
                lookup.cleanup(&request.id);
                say!(
                    "         {} cancelled by its client while its lookup is in flight: its answers will be dropped",
                    request.id
                );
            }
        }

        // Idle until the next step, applying answers as they are published.
        while flushed_at.elapsed() < step_length {
            lookup.drain();
            unresolved.retain(|key| match lookup.table().key_state(key) {
                Some(state) if matches!(state.phase, Phase::Resolved { .. }) => {
                    totals.latencies.push(flushed_at.elapsed());
                    false
                }
                // Dropped as an orphan: nobody waits for it any more.
                None => false,
                Some(_) => true,
            });
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut events = std::mem::take(&mut *answered.lock().expect("demo bookkeeping"));
        events.sort_by_key(|(_, _, at)| *at);
        for (request, keys, at) in events {
            let after = at.saturating_duration_since(flushed_at);
            say!(
                "         +{:>6.1} ms  {request}'s group answered ({keys} keys) and published",
                ms(after)
            );
        }
    }

    lookup.drain();
    worker.wait_all();
    let stats = lookup.stats();
    let save_stats = worker.stats();
    let scheduler_stats = scheduler.stats();
    lookup.shutdown().map_err(|error| failed(error.into()))?;

    say!("");
    say!("summary");
    let p50 = quantile(&mut totals.latencies, 0.5);
    let p99 = quantile(&mut totals.latencies, 0.99);
    let rows: Vec<(&str, String)> = vec![
        ("lookups", stats.lookups.to_string()),
        ("  hits", stats.hits.to_string()),
        ("  misses", stats.misses.to_string()),
        ("  pending answers", stats.pending.to_string()),
        (
            "groups submitted / published",
            format!("{} / {}", stats.groups_submitted, stats.groups_applied),
        ),
        ("stale results dropped", stats.stale_results.to_string()),
        (
            "orphaned answers dropped",
            stats.orphans_dropped.to_string(),
        ),
        ("failed loads marked miss", stats.marked_miss.to_string()),
        (
            "time to verdict p50 / p99",
            format!("{} / {}", ms_or_dash(p50), ms_or_dash(p99)),
        ),
        (
            "blocks loaded / computed",
            format!("{} / {}", totals.loads, totals.computed),
        ),
        (
            "saves submitted / failed",
            format!("{} / {}", totals.saves_submitted, save_stats.task_failures),
        ),
        (
            "requests reported finished",
            save_stats.reported.to_string(),
        ),
        ("  delayed frees reported", save_stats.deferred.to_string()),
        ("  freed at once", scheduler_stats.freed_at_once.to_string()),
        (
            "group timeouts / backend errors",
            format!("{} / {}", stats.timeouts, stats.backend_errors),
        ),
    ];
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in rows {
        say!("  {name:<width$}  {value}");
    }
    if stats.anomalies != 0 {
        return Err(Failure::run(format!(
            "{} protocol anomalies",
            stats.anomalies
        )));
    }
    Ok(())
}

fn join(ids: &[&String]) -> String {
    ids.iter()
        .map(|id| id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The part of an error message after the path, for the timeline.
fn short(message: &str) -> &str {
    message.rsplit(": ").next().unwrap_or(message)
}
