//! The save protocol across a process boundary, in one process: steps in
//! sequence, preemptions and finishes carried by the step, one report per
//! worker per step and per request (folding several save paths), checked
//! report sequences, and all of it through the wire form.

#[path = "common/store.rs"]
mod store;

use kvtier::save::{
    MultiConnector, ReportAggregator, ReportError, SaveLatency, SaveStats, StepError,
    WorkerConnector, WorkerReport,
};
use kvtier::{SaveScheduler, SaveStep, SaveTracker};
use store::{Ending, Store, Task};

type Tracker = SaveTracker<u64, Task>;

#[test]
fn a_worker_takes_steps_in_sequence_and_a_refused_step_changes_nothing() {
    let mut scheduler = SaveScheduler::new();
    let steps: Vec<SaveStep<u64>> = (1..=3).map(|r| scheduler.record_step([(r, 1)])).collect();
    let mut worker = Tracker::new();
    assert_eq!(worker.next_step(), 0);
    worker.begin_step(&steps[0]).unwrap();

    // Step 1 lost on the way: step 2 is refused, and records nothing.
    assert_eq!(
        worker.begin_step(&steps[2]),
        Err(StepError::Skipped {
            expected: 1,
            got: 2
        })
    );
    assert!(!worker.is_tracked(&3));
    assert_eq!((worker.next_step(), worker.stats().steps), (1, 1));

    // Once the missing step comes, the early one is taken.
    worker.begin_step(&steps[1]).unwrap();
    worker.begin_step(&steps[2]).unwrap();
    assert!(worker.is_tracked(&3));

    // A step sent twice, or replayed, is refused.
    let again = worker.begin_step(&steps[1]);
    assert_eq!(
        again,
        Err(StepError::Repeated {
            expected: 3,
            got: 1
        })
    );
    assert_eq!(
        again.unwrap_err().to_string(),
        "step 1 arrived again (step 3 was due)"
    );
    assert_eq!(
        StepError::Skipped {
            expected: 4,
            got: 7
        }
        .to_string(),
        "step 7 arrived while step 4 was due: 3 step(s) missing"
    );
    assert_eq!(worker.stats().steps, 3);
}

#[test]
fn a_step_carrying_preemptions_fences_their_saves_and_no_others() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut worker = Tracker::new();
    let step = scheduler.record_step([(1, 2), (2, 2)]);
    worker.begin_step(&step).unwrap();
    let first = store.start(&[1], Ending::Ok);
    let (first_id, second_id) = (first.id, 2);
    worker.submit(first, &[1]);
    worker.submit(store.start(&[2], Ending::Ok), &[2]);

    scheduler.preempt(&[1]);
    let next = scheduler.record_step([(2, 1)]);
    assert_eq!(next.preempted(), &[1]);
    worker.begin_step(&next).unwrap();
    // S5 driven by the metadata: the preempted request's save was waited
    // before the step was taken, the other request's was not.
    assert_eq!(store.waits(), vec![first_id]);
    assert!(store.nothing_reads(1));
    assert!(store.is_running(second_id));
    assert_eq!(worker.stats().preemption_fences, 1);
    assert!(worker.is_tracked(&1), "a preempted request stays tracked");

    // A step without preemptions runs no fence.
    worker.begin_step(&scheduler.record_step([])).unwrap();
    assert_eq!(worker.stats().preemption_fences, 1);
    store.complete_all();
    worker.wait_all();
}

/// One step on every worker: take the step, save each saving request's
/// blocks in one task, report.
fn run_step(
    store: &Store,
    workers: &mut [Tracker],
    step: &SaveStep<u64>,
    ending: Ending,
) -> Vec<WorkerReport<u64>> {
    workers
        .iter_mut()
        .enumerate()
        .map(|(rank, worker)| {
            worker.begin_step(step).unwrap();
            if !step.requests().is_empty() {
                worker.submit(store.start(step.requests(), ending), step.requests());
            }
            worker.finish_step(rank as u32, step)
        })
        .collect()
}

#[test]
fn finishes_travel_in_the_step_and_each_worker_reports_each_request_once() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut workers: Vec<Tracker> = (0..2).map(|_| SaveTracker::new()).collect();
    let mut frees = ReportAggregator::new(2).unwrap();

    let step = scheduler.record_step([(1, 4), (2, 0)]);
    for report in run_step(&store, &mut workers, &step, Ending::Ok) {
        assert!(frees.accept(report).unwrap().free.is_empty());
    }
    // 1 finishes with its save running; 2 never saved.
    assert!(scheduler.request_finished(&1));
    frees.expect(1);
    assert!(!scheduler.request_finished(&2));

    let step = scheduler.record_step([]);
    assert_eq!(step.finished(), &[1], "only the delayed finish travels");
    for report in run_step(&store, &mut workers, &step, Ending::Ok) {
        assert!(report.finished.is_empty(), "the save still runs");
        assert!(frees.accept(report).unwrap().free.is_empty());
    }
    assert!(!store.nothing_reads(1));

    store.complete_all();
    let step = scheduler.record_step([]);
    assert!(step.finished().is_empty(), "a finish travels once");
    let reports = run_step(&store, &mut workers, &step, Ending::Ok);
    assert_eq!(
        frees.accept(reports[0].clone()).unwrap().free,
        Vec::<u64>::new()
    );
    assert_eq!(frees.accept(reports[1].clone()).unwrap().free, vec![1]);
    assert_eq!(frees.waiting(), 0);
    assert_eq!(reports[1].stats.reported, 1);
    assert_eq!(
        frees.worker_stats(1).map(|(stats, _)| stats),
        Some(reports[1].stats)
    );
    assert_eq!(frees.latency().count(), 2, "one closed task per worker");
}

#[test]
fn a_lost_or_repeated_report_is_refused_and_takes_nothing() {
    let mut frees = ReportAggregator::new(2).unwrap();
    frees.expect(9u64);
    let report = |worker, step, finished| {
        WorkerReport::new(
            worker,
            step,
            finished,
            SaveStats::default(),
            SaveLatency::default(),
        )
    };
    assert!(frees.accept(report(0, 0, vec![])).unwrap().free.is_empty());
    // Worker 0's report of step 1 was lost: step 2's would free 9 on
    // worker 0's word while its report of step 1 is missing.
    assert_eq!(
        frees.accept(report(0, 2, vec![9])).unwrap_err(),
        ReportError::OutOfSequence {
            worker: 0,
            expected: 1,
            got: 2
        }
    );
    assert_eq!(frees.next_report(0), Some(1));
    assert!(frees.worker_stats(1).is_none());
    assert!(frees.accept(report(0, 1, vec![9])).unwrap().free.is_empty());
    // The same report again.
    assert!(matches!(
        frees.accept(report(0, 1, vec![9])),
        Err(ReportError::OutOfSequence {
            expected: 2,
            got: 1,
            ..
        })
    ));
    assert!(matches!(
        frees.accept(report(5, 0, vec![9])),
        Err(ReportError::NoSuchWorker {
            worker: 5,
            workers: 2
        })
    ));
    assert!(frees.accept(report(1, 0, vec![])).unwrap().free.is_empty());
    assert_eq!(frees.accept(report(1, 1, vec![9])).unwrap().free, vec![9]);
}

#[test]
fn a_folding_multi_connector_reports_once_per_request_after_every_save_path() {
    let store = Store::default();
    // Two save paths in one worker, each with its scheduler-side recorder.
    let mut local = SaveScheduler::new();
    let mut remote = SaveScheduler::new();
    let mut worker = MultiConnector::new(vec![Tracker::new(), Tracker::new()]);
    worker.inner_mut()[0]
        .begin_step(&local.record_step([(1, 2), (2, 2)]))
        .unwrap();
    worker.inner_mut()[1]
        .begin_step(&remote.record_step([(1, 2), (3, 1)]))
        .unwrap();
    let local_task = store.start(&[1, 2], Ending::Ok);
    let local_id = local_task.id;
    worker.inner_mut()[0].submit(local_task, &[1, 2]);
    let remote_task = store.start(&[1], Ending::Ok);
    let remote_id = remote_task.id;
    worker.inner_mut()[1].submit(remote_task, &[1]);
    assert!(worker.will_report(&1) && worker.will_report(&3) && !worker.will_report(&4));

    // The remote path's save of 1 is done, the local one's is not: the
    // worker must not report 1 yet (its local blocks are still read).
    store.complete(remote_id);
    assert!(worker.get_finished(&[1, 2, 4]).is_empty());
    assert!(
        worker.will_report(&1),
        "1 still owes the local path's report"
    );
    assert_eq!(worker.outstanding(), 2);

    store.complete(local_id);
    assert_eq!(worker.get_finished(&[]), vec![1, 2]);
    assert!(worker.get_finished(&[]).is_empty(), "once");
    assert!(store.nothing_reads(1) && store.nothing_reads(2));
    // 3 finishes: only the remote path saved it, and it has no task.
    assert_eq!(worker.get_finished(&[3]), vec![3]);
    assert_eq!(worker.unexpected_reports(), 0);
    assert_eq!(worker.outstanding(), 0);
}

#[test]
fn per_layer_tasks_of_one_request_are_folded_into_one_report() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut worker = Tracker::new();
    let step = scheduler.record_step([(7, 32)]);
    worker.begin_step(&step).unwrap();
    let layers: Vec<u64> = (0..3)
        .map(|_| {
            let task = store.start(&[7], Ending::Ok);
            let id = task.id;
            worker.submit(task, &[7]);
            id
        })
        .collect();
    assert!(worker.get_finished(&[7]).is_empty());
    store.complete(layers[0]);
    store.complete(layers[2]);
    assert!(worker.get_finished(&[]).is_empty(), "layer 1 still saves");
    store.complete(layers[1]);
    assert_eq!(worker.get_finished(&[]), vec![7]);
    assert_eq!(worker.latency().count(), 3, "each layer's save timed");
}

#[test]
fn steps_and_reports_survive_the_wire_between_a_scheduler_and_two_workers() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::<u64>::new();
    let mut workers: Vec<Tracker> = (0..2).map(|_| SaveTracker::new()).collect();
    let mut frees = ReportAggregator::new(2).unwrap();
    let mut freed = Vec::new();
    for round in 0u64..20 {
        if round > 0 && round % 3 == 0 {
            scheduler.preempt(&[round - 1]);
        }
        if round >= 2 && scheduler.request_finished(&(round - 2)) {
            frees.expect(round - 2);
        }
        if round % 2 == 0 {
            store.complete_all();
        }
        let bytes = scheduler.record_step([(round, 1)]).encode().unwrap();
        for (rank, worker) in workers.iter_mut().enumerate() {
            let step = SaveStep::<u64>::decode(&bytes).unwrap();
            worker.begin_step(&step).unwrap();
            worker.submit(store.start(step.requests(), Ending::Ok), step.requests());
            let report = worker.finish_step(rank as u32, &step).encode().unwrap();
            let report = WorkerReport::<u64>::decode(&report).unwrap();
            freed.extend(frees.accept(report).unwrap().free);
        }
    }
    store.complete_all();
    for _ in 0..2 {
        let bytes = scheduler.record_step([]).encode().unwrap();
        for (rank, worker) in workers.iter_mut().enumerate() {
            let step = SaveStep::<u64>::decode(&bytes).unwrap();
            worker.begin_step(&step).unwrap();
            let report =
                WorkerReport::decode(&worker.finish_step(rank as u32, &step).encode().unwrap());
            freed.extend(frees.accept(report.unwrap()).unwrap().free);
        }
    }
    assert_eq!(freed, (0..18).collect::<Vec<u64>>(), "each once, in order");
    assert_eq!(frees.waiting(), 0);
}

/// A save path that reports whatever it is told, owing nothing.
struct Liar;

impl WorkerConnector<u64> for Liar {
    fn get_finished(&mut self, finished: &[u64]) -> Vec<u64> {
        finished.to_vec()
    }

    fn will_report(&self, _: &u64) -> bool {
        false
    }
}

#[test]
fn a_save_path_reporting_what_it_does_not_owe_is_refused_and_never_passed_on() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut tracker = Tracker::new();
    tracker
        .begin_step(&scheduler.record_step([(1, 1)]))
        .unwrap();
    let task = store.start(&[1], Ending::Ok);
    let id = task.id;
    tracker.submit(task, &[1]);
    let mut worker: MultiConnector<Box<dyn WorkerConnector<u64>>, u64> =
        MultiConnector::new(vec![Box::new(tracker), Box::new(Liar)]);
    // The liar reports 1 and 2 at once; 1's save still runs, 2 never saved.
    assert!(worker.get_finished(&[1, 2]).is_empty());
    assert_eq!(worker.unexpected_reports(), 2);
    store.complete(id);
    assert_eq!(worker.get_finished(&[]), vec![1]);
}
