//! A prober of one's own: the sans-IO seam as a user crate sees it. A custom
//! prober can build every outcome a built-in one can, publish from any
//! thread in any order, refuse work, and is shut down exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use kvtier::lookup::{Group, LookupError, Prober, Publisher, Refused, Submission};
use kvtier::{Lookup, Verdict};

/// Answers each group by its request's name, on a thread per group; counts
/// its shutdowns.
struct ByName {
    results: Publisher<u64>,
    running: Vec<JoinHandle<()>>,
    shutdowns: Arc<AtomicUsize>,
}

fn outcome_for(group: Group<u64, String>) -> kvtier::lookup::GroupResult<u64> {
    match group.request().as_str() {
        "fail" => group.failed(),
        "slow" => group.timed_out(),
        "gone" => group.cancelled(),
        // The first answer arrived before the panic; the rest are misses.
        "boom" => group.panicked([true]),
        _ => {
            let answers: Vec<bool> = group.keys().iter().map(|key| key % 2 == 0).collect();
            group.answered(answers)
        }
    }
}

impl Prober<u64, String> for ByName {
    fn submit(&mut self, submission: Submission<u64, String>) -> Result<(), Refused<u64, String>> {
        if submission
            .groups()
            .iter()
            .any(|group| group.request() == "refused")
        {
            let error = LookupError::WorkerLost("the pool is gone".into());
            return Err(Refused { submission, error });
        }
        for group in submission.into_groups() {
            let results = self.results.clone();
            self.running.push(std::thread::spawn(move || {
                results.publish(outcome_for(group));
            }));
        }
        Ok(())
    }

    fn wait_idle(&mut self) -> Result<(), LookupError> {
        for thread in self.running.drain(..) {
            thread
                .join()
                .map_err(|_| LookupError::WorkerLost("a probe thread panicked".into()))?;
        }
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), LookupError> {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.wait_idle()
    }
}

fn lookup_by_name(shutdowns: &Arc<AtomicUsize>) -> Lookup<u64, String, ByName> {
    let shutdowns = shutdowns.clone();
    Lookup::with_prober(move |results| ByName {
        results,
        running: Vec::new(),
        shutdowns,
    })
}

fn req(name: &str) -> String {
    name.to_owned()
}

#[test]
fn a_custom_prober_can_produce_every_outcome() {
    let shutdowns = Arc::new(AtomicUsize::new(0));
    let mut lookup = lookup_by_name(&shutdowns);
    let names = ["answer", "fail", "slow", "gone", "boom"];
    for (i, name) in names.iter().enumerate() {
        let base = 10 * i as u64;
        for key in [base, base + 2] {
            assert!(lookup.lookup(&key, &req(name)).is_pending());
        }
    }
    assert_eq!(lookup.flush().unwrap(), 10);
    assert_eq!(lookup.wait_idle().unwrap(), 5);
    let verdicts: Vec<(bool, bool)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let base = 10 * i as u64;
            let mut hit = |key| lookup.lookup(&key, &req(name)).is_hit();
            (hit(base), hit(base + 2))
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            (true, true),   // answered: both even keys stored
            (false, false), // failed
            (false, false), // timed out
            (false, false), // cancelled
            (true, false),  // panicked after one answer
        ]
    );
    let stats = lookup.stats();
    assert_eq!(
        (
            stats.groups_applied,
            stats.backend_errors,
            stats.timeouts,
            stats.cancelled,
            stats.backend_panics,
            stats.anomalies
        ),
        (5, 1, 1, 1, 1, 0)
    );
    for name in names {
        lookup.cleanup(&req(name));
    }
    let table = lookup.shutdown().unwrap();
    assert!(table.is_empty());
    assert_eq!(shutdowns.load(Ordering::SeqCst), 1, "shut down once");
}

#[test]
fn a_refused_submission_becomes_misses_and_the_error_is_returned() {
    let shutdowns = Arc::new(AtomicUsize::new(0));
    let mut lookup = lookup_by_name(&shutdowns);
    lookup.lookup(&4, &req("refused"));
    lookup.lookup(&6, &req("answer"));
    assert!(matches!(lookup.flush(), Err(LookupError::WorkerLost(_))));
    // Nothing waits on a prober that will never answer.
    assert_eq!(lookup.lookup(&4, &req("refused")), Verdict::Miss);
    assert_eq!(lookup.lookup(&6, &req("answer")), Verdict::Miss);
    assert_eq!(lookup.stats().cancelled, 2);
    // The next step's keys go to the prober again.
    lookup.lookup(&8, &req("answer"));
    assert_eq!(lookup.flush().unwrap(), 1);
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&8, &req("answer")).is_hit());
}

#[test]
fn dropping_a_lookup_shuts_its_prober_down_exactly_once() {
    let shutdowns = Arc::new(AtomicUsize::new(0));
    let mut lookup = lookup_by_name(&shutdowns);
    lookup.lookup(&2, &req("answer"));
    lookup.flush().unwrap();
    drop(lookup);
    assert_eq!(shutdowns.load(Ordering::SeqCst), 1);
}
