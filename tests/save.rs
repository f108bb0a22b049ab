//! Behaviour of deferred save completion: one test per invariant S1–S6 of
//! docs/design.md and per fault, on deterministic scripted store tasks (and
//! real threads for `CompletionTask`).

#[path = "common/store.rs"]
mod store;

use std::sync::{Arc, Mutex};

use store::{Ending, Store, Task};

use kvtier::{
    SaveScheduler, SaveTracker, StoreTask, save::CompletionMode, save::CompletionTask,
    save::MultiConnector, save::Report, save::ReportAggregator, save::ReportError,
    save::SchedulerConnector, save::TaskError, save::WorkerConnector,
};

type Tracker = SaveTracker<u64, Task>;

fn setup(mode: CompletionMode) -> (Store, SaveScheduler<u64>, Tracker) {
    (
        Store::default(),
        SaveScheduler::new(),
        SaveTracker::with_mode(mode),
    )
}

#[test]
fn s1_a_finished_request_is_reported_only_after_its_save_completed() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    let step = scheduler.record_step([(1, 4), (2, 4)]);
    worker.begin_step(&step).expect("steps in sequence");
    let task = store.start(&[1, 2], Ending::Ok);
    let io = task.id;
    worker.submit(task, &[1, 2]);

    assert!(scheduler.request_finished(&1));
    assert_eq!(
        worker.get_finished(&[1]),
        Vec::<u64>::new(),
        "the save still reads 1's blocks"
    );
    assert_eq!(worker.deferred_requests(), &[1]);
    assert_eq!(worker.stats().deferred, 1);
    assert!(!store.nothing_reads(1));

    store.complete(io);
    // vLLM passes each finished id once: the tracker remembered 1.
    assert_eq!(worker.get_finished(&[]), vec![1]);
    assert!(store.nothing_reads(1));
    assert!(
        store.waited_running().is_empty(),
        "non-blocking mode never waits on running I/O"
    );
    assert_eq!(worker.stats().tasks_reaped, 1);
    assert!(store.every_handle_released_once());
    worker.check_invariants().unwrap();
}

#[test]
fn blocking_mode_waits_for_the_finished_requests_tasks_only() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::Blocking);
    let step = scheduler.record_step([(1, 1), (2, 1)]);
    worker.begin_step(&step).expect("steps in sequence");
    let first = store.start(&[1], Ending::Ok);
    let second = store.start(&[2], Ending::Ok);
    let (first_id, second_id) = (first.id, second.id);
    worker.submit(first, &[1]);
    worker.submit(second, &[2]);

    assert!(scheduler.request_finished(&1));
    assert_eq!(worker.get_finished(&[1]), vec![1]);
    assert_eq!(store.waited_running(), vec![first_id]);
    assert!(
        store.is_running(second_id),
        "2 has not finished: its save is not waited"
    );
    assert_eq!(worker.stats().tasks_waited, 1);
    assert_eq!(worker.stats().deferred, 0);
}

#[test]
fn a_task_shared_by_several_requests_is_waited_once_and_counts_for_all() {
    for mode in [CompletionMode::NonBlocking, CompletionMode::Blocking] {
        let (store, mut scheduler, mut worker) = setup(mode);
        let step = scheduler.record_step([(1, 2), (2, 2), (3, 2)]);
        worker.begin_step(&step).expect("steps in sequence");
        let shared = store.start(&[1, 2, 3], Ending::Ok);
        let id = shared.id;
        worker.submit(shared, &[1, 2, 3]);

        let mut reported = worker.get_finished(&[1, 2]);
        if mode == CompletionMode::NonBlocking {
            assert!(reported.is_empty());
            store.complete(id);
            reported = worker.get_finished(&[]);
        }
        assert_eq!(reported, vec![1, 2], "{mode:?}");
        assert_eq!(
            store.waits(),
            vec![id],
            "{mode:?}: one wait for the shared task"
        );
        // 3 has not finished, but its save is over: reported at once later.
        assert_eq!(worker.get_finished(&[3]), vec![3], "{mode:?}");
        assert_eq!(store.waits(), vec![id], "{mode:?}");
        assert!(store.every_handle_released_once());
    }
}

#[test]
fn s3_requests_that_never_saved_are_never_reported() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    // 2 is scheduled with an empty save range.
    let step = scheduler.record_step([(1, 3), (2, 0)]);
    assert_eq!(step.requests(), &[1]);
    worker.begin_step(&step).expect("steps in sequence");
    worker.submit(store.start(&[1], Ending::Ok), &[1]);
    store.complete_all();

    assert!(!scheduler.request_finished(&2));
    assert!(!scheduler.request_finished(&9));
    assert!(scheduler.request_finished(&1));
    assert_eq!(worker.get_finished(&[2, 9, 1]), vec![1]);
    assert_eq!(worker.stats().not_delayed, 2);
}

#[test]
fn s2_each_request_is_reported_once_even_when_passed_again() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 1)]))
        .expect("steps in sequence");
    let task = store.start(&[1], Ending::Ok);
    let id = task.id;
    worker.submit(task, &[1]);
    assert!(worker.get_finished(&[1]).is_empty());
    assert!(
        worker.get_finished(&[1]).is_empty(),
        "a repeated finish is not a second entry"
    );
    store.complete(id);
    assert_eq!(worker.get_finished(&[1]), vec![1]);
    assert!(worker.get_finished(&[1]).is_empty());
    assert!(worker.get_finished(&[]).is_empty());
    let stats = worker.stats();
    // Passed again twice while finishing, once more after it was reported.
    assert_eq!(
        (stats.reported, stats.repeated_finishes, stats.not_delayed),
        (1, 2, 1)
    );
}

#[test]
fn s5_preemption_waits_only_for_the_preempted_requests_tasks() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 1), (2, 1), (3, 1)]))
        .expect("steps in sequence");
    let a = store.start(&[1], Ending::Ok);
    let ab = store.start(&[1, 2], Ending::Ok);
    let c = store.start(&[3], Ending::Ok);
    let (a_id, ab_id, c_id) = (a.id, ab.id, c.id);
    worker.submit(a, &[1]);
    worker.submit(ab, &[1, 2]);
    worker.submit(c, &[3]);

    assert_eq!(worker.handle_preemptions(&[2]), 1);
    assert!(
        store.nothing_reads(2),
        "after the fence nothing reads 2's blocks"
    );
    assert_eq!(store.waits(), vec![ab_id]);
    assert!(store.is_running(a_id) && store.is_running(c_id));

    // Preemption does not report or forget: 2 is still delayed on both sides.
    assert!(worker.is_tracked(&2) && scheduler.is_delayed(&2));
    assert_eq!(
        worker.handle_preemptions(&[2, 7]),
        0,
        "nothing left to fence"
    );
    assert_eq!(worker.stats().preemption_fences, 2);
    assert!(scheduler.request_finished(&2));
    assert_eq!(worker.get_finished(&[2]), vec![2]);
}

#[test]
fn layer_wise_saves_are_one_task_per_layer_under_the_same_tracking() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 8)]))
        .expect("steps in sequence");
    let layers: Vec<u64> = (0..3)
        .map(|_| {
            let task = store.start(&[1], Ending::Ok);
            let id = task.id;
            worker.submit(task, &[1]);
            id
        })
        .collect();
    assert_eq!(worker.tasks_of(&1).len(), 3);
    assert!(worker.get_finished(&[1]).is_empty());
    for layer in &layers[..2] {
        store.complete(*layer);
        assert!(
            worker.get_finished(&[]).is_empty(),
            "a layer is still being saved"
        );
    }
    store.complete(layers[2]);
    assert_eq!(worker.get_finished(&[]), vec![1]);
    assert_eq!(worker.stats().tasks_reaped, 3);
}

#[test]
fn a_refused_submission_still_reports_the_request_and_releases_the_handle_once() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 2)]))
        .expect("steps in sequence");
    // The store refuses the task and hands its handle back inside the error.
    let refused = store.start(&[1], Ending::Ok);
    let id = refused.id;
    store.complete(id);
    worker.submit_failed(&[1], RefusedSave(refused));
    assert_eq!(store.released(id), 1);
    assert!(scheduler.request_finished(&1));
    assert_eq!(
        worker.get_finished(&[1]),
        vec![1],
        "its blocks must not leak"
    );
    assert_eq!(worker.stats().submit_failures, 1);
    assert!(store.waits().is_empty(), "a refused task is never waited");
}

struct RefusedSave(#[allow(dead_code)] Task);

impl std::fmt::Display for RefusedSave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("queue full")
    }
}

#[test]
fn failed_timed_out_and_panicking_saves_are_counted_and_still_reported_once() {
    for mode in [CompletionMode::NonBlocking, CompletionMode::Blocking] {
        let (store, mut scheduler, mut worker) = setup(mode);
        let endings = [
            Ending::Fails,
            Ending::TimesOut,
            Ending::PanicsInWait,
            Ending::PanicsInCheck,
        ];
        let requests: Vec<u64> = (1..=endings.len() as u64).collect();
        worker
            .begin_step(&scheduler.record_step(requests.iter().map(|r| (*r, 1))))
            .expect("steps in sequence");
        for (request, ending) in requests.iter().zip(endings) {
            worker.submit(store.start(&[*request], ending), &[*request]);
        }
        for request in &requests {
            assert!(scheduler.request_finished(request));
        }
        store.complete_all();
        let mut reported = worker.get_finished(&requests);
        if mode == CompletionMode::NonBlocking {
            // A task whose check panics is never waited by a non-blocking
            // call: its request is reported once a wait is allowed.
            assert_eq!(worker.deferred_requests(), [4], "{mode:?}");
            assert_eq!(worker.running_tasks(), 1);
            assert!(
                worker.get_finished(&[]).is_empty(),
                "checked again, not waited"
            );
            reported.extend(worker.wait_all());
        }
        reported.sort_unstable();
        assert_eq!(reported, requests, "{mode:?}");
        let stats = worker.stats();
        assert_eq!(stats.task_failures, 1, "{mode:?}");
        assert_eq!(stats.task_timeouts, 1, "{mode:?}");
        // A blocking get_finished waits without checking first.
        let panics = if mode == CompletionMode::Blocking {
            1
        } else {
            2
        };
        assert_eq!(
            stats.task_panics, panics,
            "{mode:?}: in wait, and in check (once, however often checked) unless blocking"
        );
        assert_eq!(stats.reported, 4, "{mode:?}");
        assert!(store.every_handle_released_once(), "{mode:?}");
        assert!(worker.get_finished(&requests).is_empty());
        worker.check_invariants().unwrap();
    }
}

#[test]
fn an_abandoned_completion_task_is_reported_not_leaked() {
    let mut scheduler = SaveScheduler::new();
    let mut worker: SaveTracker<u64, CompletionTask<()>> = SaveTracker::new();
    worker
        .begin_step(&scheduler.record_step([(5, 1)]))
        .expect("steps in sequence");
    let (task, completer) = CompletionTask::new(());
    worker.submit(task, &[5]);
    assert!(worker.get_finished(&[5]).is_empty());
    std::thread::spawn(move || drop(completer)).join().unwrap();
    assert_eq!(worker.get_finished(&[]), vec![5]);
    assert_eq!(worker.stats().tasks_abandoned, 1);
}

#[test]
fn completion_tasks_are_completed_from_io_threads_and_release_their_handle_once() {
    let released = Arc::new(Mutex::new(Vec::new()));
    struct Event(u64, Arc<Mutex<Vec<u64>>>);
    impl Drop for Event {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    let mut scheduler = SaveScheduler::new();
    let mut worker = SaveTracker::new();
    let requests: Vec<u64> = (0..16).collect();
    worker
        .begin_step(&scheduler.record_step(requests.iter().map(|r| (*r, 1))))
        .expect("steps in sequence");
    let mut io = Vec::new();
    for request in &requests {
        let (task, completer) = CompletionTask::new(Event(*request, released.clone()));
        worker.submit(task, &[*request]);
        let request = *request;
        io.push(std::thread::spawn(move || {
            if request % 3 == 0 {
                completer.fail(TaskError::failed("device error"));
            } else {
                completer.succeed();
            }
        }));
    }
    // Preempting 0..4 waits for exactly their tasks, whatever the threads do.
    assert_eq!(worker.handle_preemptions(&[0, 1, 2, 3]), 4);
    for thread in io {
        thread.join().unwrap();
    }
    let mut reported = Vec::new();
    for request in &requests {
        assert!(scheduler.request_finished(request));
    }
    reported.extend(worker.get_finished(&requests));
    reported.sort_unstable();
    assert_eq!(reported, requests);
    let mut released = released.lock().unwrap().clone();
    released.sort_unstable();
    assert_eq!(
        released, requests,
        "each event handle released exactly once"
    );
    let stats = worker.stats();
    assert_eq!((stats.task_failures, stats.tasks_abandoned), (6, 0));
}

#[test]
fn a_completion_task_shows_its_handle_and_state_until_waited() {
    let (task, completer) = CompletionTask::new("event-7");
    assert_eq!(task.handle(), Some(&"event-7"));
    assert!(!task.check());
    assert!(format!("{task:?}").contains("complete: false"), "{task:?}");
    assert!(
        format!("{completer:?}").starts_with("Completer"),
        "{completer:?}"
    );
    completer.complete(Err(TaskError::TimedOut));
    assert!(task.check());
    assert!(format!("{task:?}").contains("complete: true"), "{task:?}");
    assert!(matches!(task.wait(), Err(TaskError::TimedOut)));

    let (task, completer) = CompletionTask::new(());
    completer.succeed();
    assert!(
        task.wait().is_ok(),
        "succeed is not an abandoned completion"
    );
}

#[test]
fn a_rank_that_saves_nothing_reports_the_same_requests_and_frees_happen_once_per_worker() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut saving: Tracker = SaveTracker::new();
    let mut idle: Tracker = SaveTracker::new();
    let mut frees = ReportAggregator::new(2).unwrap();

    let step = scheduler.record_step([(1, 1), (2, 1)]);
    saving.begin_step(&step).expect("steps in sequence");
    idle.begin_step(&step).expect("steps in sequence"); // records before its early return
    let task = store.start(&[1, 2], Ending::Ok);
    let id = task.id;
    saving.submit(task, &[1, 2]);

    for request in [1, 2] {
        assert!(scheduler.request_finished(&request));
        frees.expect(request);
    }
    assert_eq!(frees.waiting(), 2);
    assert!(!frees.is_waiting(&3), "3 never finished");
    let free = |report: Result<Report<u64>, ReportError<u64>>| {
        let report = report.unwrap();
        assert!(report.is_clean(), "{report:?}");
        report.free
    };
    assert_eq!(
        free(frees.report(1, idle.get_finished(&[1, 2]))),
        Vec::<u64>::new()
    );
    assert_eq!(
        free(frees.report(0, saving.get_finished(&[1, 2]))),
        Vec::<u64>::new()
    );
    assert!(frees.is_waiting(&1), "worker 0 still saves 1's blocks");
    store.complete(id);
    assert_eq!(
        free(frees.report(1, idle.get_finished(&[]))),
        Vec::<u64>::new()
    );
    assert_eq!(free(frees.report(0, saving.get_finished(&[]))), [1, 2]);
    assert_eq!(frees.waiting(), 0);
}

#[test]
fn the_aggregator_rejects_duplicate_unexpected_and_out_of_range_reports() {
    let mut frees = ReportAggregator::new(2).unwrap();
    assert!(frees.expect(1u64));
    assert!(!frees.expect(1u64));
    assert_eq!(
        frees.report(2, [1]),
        Err(ReportError::NoSuchWorker {
            worker: 2,
            workers: 2
        })
    );
    assert!(frees.is_waiting(&1), "a refused batch takes nothing");
    let report = frees.report(0, [1]).unwrap();
    assert!(report.is_clean() && report.free.is_empty(), "{report:?}");
    assert_eq!(
        frees.report(0, [1]).unwrap().refused,
        [ReportError::Duplicate {
            worker: 0,
            request: 1
        }]
    );
    assert_eq!(
        frees.report(1, [3]).unwrap().refused,
        [ReportError::Unexpected {
            worker: 1,
            request: 3
        }]
    );
    assert_eq!(frees.report(1, [1]).unwrap().free, [1]);
    assert_eq!(
        frees.report(1, [1]).unwrap().refused,
        [ReportError::Unexpected {
            worker: 1,
            request: 1
        }]
    );
}

/// A refused report in a batch must not swallow the accepted ones beside
/// it: their requests are freed in the same call.
#[test]
fn a_refused_report_never_swallows_an_accepted_free() {
    // One worker: 10 is complete on its report, 999 nobody waits for.
    let mut frees = ReportAggregator::new(1).unwrap();
    frees.expect(10u64);
    let report = frees.report(0, [10, 999]).unwrap();
    assert_eq!(report.free, [10], "10's blocks are freed");
    assert_eq!(
        report.refused,
        [ReportError::Unexpected {
            worker: 0,
            request: 999
        }]
    );
    assert_eq!(frees.waiting(), 0);

    // Two workers: worker 1 reports 11 twice after worker 0 reported it.
    let mut frees = ReportAggregator::new(2).unwrap();
    frees.expect(11u64);
    frees.expect(12u64);
    assert!(frees.report(0, [11]).unwrap().free.is_empty());
    let report = frees.report(1, [11, 11, 12]).unwrap();
    assert_eq!(report.free, [11]);
    // The second 11 comes after 11 was freed: nobody waits for it any more.
    assert_eq!(
        report.refused,
        [ReportError::Unexpected {
            worker: 1,
            request: 11
        }]
    );
    assert!(frees.is_waiting(&12), "worker 0 still owes 12");
    assert_eq!(frees.report(0, [12]).unwrap().free, [12]);
}

/// One inner connector reporting a request twice must not stand in for
/// another inner connector's report: the request stays delayed until the
/// connector that still saves it reports.
#[test]
fn a_multi_connector_counts_reports_per_connector() {
    let mut local = SaveScheduler::new();
    let mut remote = SaveScheduler::new();
    local.record_step([(1u64, 1)]);
    remote.record_step([(1u64, 1)]);
    let mut both = MultiConnector::new(vec![local, remote]);
    assert!(both.request_finished(&1));
    let report = both.finished_sending([(0, 1), (0, 1)]);
    assert!(
        report.free.is_empty(),
        "remote (1) has not reported: {report:?}"
    );
    assert_eq!(
        report.refused,
        [ReportError::Duplicate {
            worker: 0,
            request: 1
        }]
    );
    assert_eq!(
        both.finished_sending([(2, 1)]).refused,
        [ReportError::NoSuchWorker {
            worker: 2,
            workers: 2
        }]
    );
    assert_eq!(both.outstanding(), 1);
    assert_eq!(both.finished_sending([(1, 1)]).free, [1]);
    assert_eq!(both.unexpected_reports(), 2);

    // A connector that did not delay the request cannot report it.
    let mut only_local = SaveScheduler::new();
    only_local.record_step([(2u64, 1)]);
    let mut both = MultiConnector::new(vec![only_local, SaveScheduler::new()]);
    assert!(both.request_finished(&2));
    let report = both.finished_sending([(1, 2)]);
    assert_eq!(
        report.refused,
        [ReportError::Unexpected {
            worker: 1,
            request: 2
        }]
    );
    assert_eq!(both.finished_sending([(0, 2)]).free, [2]);
}

/// A connector pair as a serving engine would hold it: the scheduler half
/// and one worker's half.
struct SavingConnector {
    scheduler: SaveScheduler<u64>,
    worker: Tracker,
}

impl SchedulerConnector<u64> for SavingConnector {
    fn request_finished(&mut self, request: &u64) -> bool {
        self.scheduler.request_finished(request)
    }
}

impl WorkerConnector<u64> for SavingConnector {
    fn get_finished(&mut self, finished: &[u64]) -> Vec<u64> {
        self.worker.get_finished(finished)
    }

    fn will_report(&self, request: &u64) -> bool {
        self.worker.is_tracked(request)
    }
}

#[test]
fn a_multi_connector_forwards_to_every_inner_connector_and_frees_after_all_reported() {
    let store = Store::default();
    let mut multi = MultiConnector::new(vec![
        SavingConnector {
            scheduler: SaveScheduler::new(),
            worker: SaveTracker::new(),
        },
        SavingConnector {
            scheduler: SaveScheduler::new(),
            worker: SaveTracker::new(),
        },
    ]);
    // Connector 0 saves requests 1 and 2, connector 1 saves request 1 only.
    let mut io = Vec::new();
    for (index, saves) in [vec![(1, 2), (2, 2)], vec![(1, 2), (2, 0)]]
        .into_iter()
        .enumerate()
    {
        let connector = &mut multi.inner_mut()[index];
        let step = connector.scheduler.record_step(saves);
        connector
            .worker
            .begin_step(&step)
            .expect("steps in sequence");
        let task = store.start(step.requests(), Ending::Ok);
        io.push(task.id);
        connector.worker.submit(task, step.requests());
    }

    assert_eq!((multi.outstanding(), multi.unexpected_reports()), (0, 0));
    assert!(multi.request_finished(&1));
    assert!(multi.request_finished(&2));
    assert!(!multi.request_finished(&3));
    assert_eq!(multi.outstanding(), 2);
    assert_eq!(multi.inner().len(), 2);
    for connector in multi.inner() {
        assert_eq!(
            connector.scheduler.delayed_count(),
            0,
            "every inner connector forgot them"
        );
    }
    let reports = multi.get_finished_each(&[1, 2, 3]);
    assert!(reports.is_empty());

    store.complete(io[1]); // connector 1's save of 1 is done; connector 0's is not
    let reports = multi.get_finished_each(&[]);
    assert_eq!(reports, vec![(1, 1)]);
    assert!(
        multi.finished_sending(reports).free.is_empty(),
        "connector 0 still saves 1"
    );

    assert_eq!(multi.outstanding(), 2, "1 still waits for connector 0");
    store.complete(io[0]);
    let reports = multi.get_finished_each(&[]);
    assert_eq!(multi.finished_sending(reports).free, vec![1, 2]);
    assert_eq!(multi.outstanding(), 0);
    assert!(multi.finished_sending([(0, 1)]).free.is_empty());
    assert_eq!(multi.unexpected_reports(), 1);
}

#[test]
fn s6_the_scheduler_and_every_worker_agree_on_who_delays_its_free() {
    let store = Store::default();
    let mut scheduler = SaveScheduler::new();
    let mut workers: Vec<Tracker> = (0..3).map(|_| SaveTracker::new()).collect();
    let plans: [&[(u64, usize)]; 4] = [
        &[(1, 1), (2, 0), (3, 2)],
        &[(2, 1), (3, 1), (4, 0)],
        &[(5, 1), (1, 1)],
        &[(6, 0)],
    ];
    let mut finished_so_far = Vec::new();
    for (index, plan) in plans.iter().enumerate() {
        let step = scheduler.record_step(plan.iter().copied());
        for (rank, worker) in workers.iter_mut().enumerate() {
            worker.begin_step(&step).expect("steps in sequence");
            if rank != 2 && !step.requests().is_empty() {
                worker.submit(store.start(step.requests(), Ending::Ok), step.requests());
            }
        }
        let finished: Vec<u64> = plan
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| *r as usize == index + 1)
            .collect();
        for request in &finished {
            scheduler.request_finished(request);
        }
        store.complete_all();
        for worker in &mut workers {
            worker.get_finished(&finished);
        }
        finished_so_far.extend(finished);
        for request in 0..8 {
            for worker in &workers {
                assert_eq!(
                    scheduler.is_delayed(&request),
                    worker.is_tracked(&request),
                    "step {index}, request {request}"
                );
            }
        }
    }
}

#[test]
fn a_save_for_a_request_no_step_recorded_is_counted_and_never_reported() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 1)]))
        .expect("steps in sequence");
    worker.submit(store.start(&[1, 9], Ending::Ok), &[1, 9]);
    assert_eq!(worker.stats().unrecorded_saves, 1);
    assert_eq!(
        worker.handle_preemptions(&[9]),
        1,
        "the fence still covers it"
    );
    assert_eq!(worker.get_finished(&[9, 1]), vec![1]);
}

#[test]
fn wait_all_drains_every_task_for_shutdown() {
    let (store, mut scheduler, mut worker) = setup(CompletionMode::NonBlocking);
    worker
        .begin_step(&scheduler.record_step([(1, 1), (2, 1)]))
        .expect("steps in sequence");
    worker.submit(store.start(&[1], Ending::Ok), &[1]);
    worker.submit(store.start(&[2], Ending::Ok), &[2]);
    assert!(worker.get_finished(&[1]).is_empty());
    assert_eq!(
        worker.wait_all(),
        vec![1],
        "2 has not finished and stays tracked"
    );
    assert_eq!(worker.running_tasks(), 0);
    assert!(worker.is_tracked(&2));
    assert!(store.every_handle_released_once());
    assert_eq!(worker.get_finished(&[2]), vec![2]);
}

/// The crate's own halves compose directly: scheduler sides through boxed
/// trait objects, worker sides as they are.
#[test]
fn multi_connectors_compose_the_crates_own_halves_and_boxed_connectors() {
    let store = Store::default();
    let mut local = SaveScheduler::new();
    let mut remote = SaveScheduler::new();
    let mut local_worker: Tracker = SaveTracker::new();
    let mut remote_worker: Tracker = SaveTracker::new();
    let local_step = local.record_step([(1, 1), (2, 1)]);
    let remote_step = remote.record_step([(1, 1)]);
    local_worker
        .begin_step(&local_step)
        .expect("steps in sequence");
    remote_worker
        .begin_step(&remote_step)
        .expect("steps in sequence");
    local_worker.submit(store.start(&[1, 2], Ending::Ok), &[1, 2]);
    remote_worker.submit(store.start(&[1], Ending::Ok), &[1]);

    let boxed: Vec<Box<dyn SchedulerConnector<u64>>> = vec![Box::new(local), Box::new(remote)];
    let mut schedulers = MultiConnector::new(boxed);
    let mut workers = MultiConnector::<_, u64>::new(vec![
        Box::new(local_worker) as Box<dyn WorkerConnector<u64>>,
        Box::new(remote_worker),
    ]);
    assert!(schedulers.request_finished(&1));
    assert!(schedulers.request_finished(&2));
    assert!(
        !schedulers.request_finished(&1),
        "each inner connector forgot 1"
    );
    assert!(workers.get_finished_each(&[1, 2]).is_empty());

    store.complete_all();
    let reports = workers.get_finished_each(&[]);
    assert_eq!(
        reports,
        vec![(0, 1), (0, 2), (1, 1)],
        "local reports 1 and 2, remote reports 1"
    );
    assert_eq!(schedulers.finished_sending(reports).free, vec![2, 1]);
    assert_eq!(schedulers.outstanding(), 0);
}

/// A save whose `check` panics and whose `wait` blocks until its I/O ends.
struct CheckPanicsWaitBlocks {
    io_done: std::sync::mpsc::Receiver<()>,
}

impl StoreTask for CheckPanicsWaitBlocks {
    fn check(&self) -> bool {
        panic!("the device event's status call broke");
    }

    fn wait(self) -> Result<(), TaskError> {
        // Bounded only so that a tracker which wrongly waits fails the test
        // instead of hanging it.
        match self
            .io_done
            .recv_timeout(std::time::Duration::from_secs(10))
        {
            Ok(()) => Ok(()),
            Err(_) => Err(TaskError::TimedOut),
        }
    }
}

/// A non-blocking `get_finished` never waits, even for a task whose check
/// panics (nothing then says whether its I/O is over): the request stays
/// deferred, and the wait happens where waiting is the caller's choice.
#[test]
fn a_panicking_check_never_makes_a_non_blocking_call_wait() {
    let (end_io, io_done) = std::sync::mpsc::channel();
    let mut scheduler = SaveScheduler::new();
    let mut worker: SaveTracker<u64, CheckPanicsWaitBlocks> = SaveTracker::new();
    worker
        .begin_step(&scheduler.record_step([(1, 1)]))
        .expect("steps in sequence");
    worker.submit(CheckPanicsWaitBlocks { io_done }, &[1]);
    assert!(scheduler.request_finished(&1));
    let started = std::time::Instant::now();
    for _ in 0..3 {
        assert!(worker.get_finished(&[1]).is_empty());
    }
    // The wait blocks until end_io is sent, which happens only after these
    // calls returned: a call that waited would take its 10 s timeout.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(worker.stats().task_panics, 1, "counted once");
    end_io.send(()).unwrap();
    assert_eq!(worker.wait_all(), [1]);
    worker.check_invariants().unwrap();
}

thread_local! {
    static COMPARISONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A request id that counts how often it is compared.
#[derive(Clone, Debug)]
struct Counted(u64);

impl std::hash::Hash for Counted {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for Counted {
    fn eq(&self, other: &Self) -> bool {
        COMPARISONS.with(|count| count.set(count.get() + 1));
        self.0 == other.0
    }
}

impl Eq for Counted {}

/// Recording a step of n requests compares ids O(n) times, not O(n^2):
/// a step with 10^5 saving requests must not stall the scheduler.
#[test]
fn recording_a_large_step_is_linear_in_its_requests() {
    let n = 20_000u64;
    let mut scheduler = SaveScheduler::new();
    // Every request listed twice, the duplicates at the end.
    let saves = (0..n).chain(0..n).map(|r| (Counted(r), 1));
    COMPARISONS.with(|count| count.set(0));
    let step = scheduler.record_step(saves);
    let comparisons = COMPARISONS.with(|count| count.get());
    assert_eq!(step.requests().len(), n as usize);
    assert!(
        comparisons < 8 * n,
        "{comparisons} comparisons for {} listed requests",
        2 * n
    );
    assert_eq!(scheduler.delayed_count(), n as usize);
}

/// An aggregator for no workers could never free anything: it is refused
/// instead of silently counting one worker.
#[test]
fn an_aggregator_for_no_workers_is_refused() {
    let refused = ReportAggregator::<u64>::new(0);
    assert!(
        matches!(refused, Err(ReportError::NoWorkers)),
        "{refused:?}"
    );
    assert!(ReportAggregator::<u64>::new(1).is_ok());
}

/// A worker count is a caller's number: past the cap it is refused with a
/// typed error instead of sizing two vectors (2**40 workers aborted the
/// process with a failed allocation).
#[test]
fn an_aggregator_for_more_workers_than_the_cap_is_refused() {
    let max = ReportAggregator::<u64>::MAX_WORKERS;
    assert!(ReportAggregator::<u64>::new(max).is_ok());
    for workers in [max + 1, 1 << 31, 1 << 40, usize::MAX] {
        let refused = ReportAggregator::<u64>::new(workers);
        assert!(
            matches!(refused, Err(ReportError::TooManyWorkers { workers: w, max: m }) if w == workers && m == max),
            "{refused:?}"
        );
    }
}

#[test]
fn each_reported_request_says_whether_every_save_of_it_succeeded() {
    for mode in [CompletionMode::NonBlocking, CompletionMode::Blocking] {
        let (store, mut scheduler, mut worker) = setup(mode);
        // 1: two good saves. 2: a good one and a failed one. 3: a refused
        // one. 4: a timed-out one shared with 5, which also has a good one.
        // 6: one that panics in its wait.
        let step = scheduler.record_step((1..=6).map(|r| (r, 1)));
        worker.begin_step(&step).expect("steps in sequence");
        worker.submit(store.start(&[1], Ending::Ok), &[1]);
        worker.submit(store.start(&[1], Ending::Ok), &[1]);
        worker.submit(store.start(&[2], Ending::Ok), &[2]);
        worker.submit(store.start(&[2], Ending::Fails), &[2]);
        worker.submit_failed(&[3], "the store is full");
        worker.submit(store.start(&[4, 5], Ending::TimesOut), &[4, 5]);
        worker.submit(store.start(&[5], Ending::Ok), &[5]);
        worker.submit(store.start(&[6], Ending::PanicsInWait), &[6]);
        store.complete_all();
        let mut outcomes = worker.get_finished_outcomes(&[1, 2, 3, 4, 5, 6]);
        outcomes.sort_unstable_by_key(|(request, _)| *request);
        use kvtier::save::SaveOutcome::{Failed, Saved};
        assert_eq!(
            outcomes,
            [
                (1, Saved),
                (2, Failed),
                (3, Failed),
                (4, Failed),
                (5, Failed),
                (6, Failed)
            ],
            "{mode:?}"
        );
        // A request reported, recorded again and saved well starts afresh.
        let step = scheduler.record_step([(2, 1)]);
        worker.begin_step(&step).expect("steps in sequence");
        worker.submit(store.start(&[2], Ending::Ok), &[2]);
        store.complete_all();
        assert_eq!(worker.get_finished_outcomes(&[2]), [(2, Saved)], "{mode:?}");
        worker.check_invariants().unwrap();
    }
}

#[test]
fn a_tracker_that_is_its_own_scheduler_records_reports_and_waits_without_reporting() {
    let store = Store::default();
    let mut jobs: Tracker = SaveTracker::new();
    jobs.record(&[10, 11]);
    assert!(jobs.is_tracked(&10) && jobs.is_tracked(&11));
    let mut tracked: Vec<u64> = jobs.tracked().copied().collect();
    tracked.sort_unstable();
    assert_eq!(tracked, [10, 11]);
    let first = store.start(&[10], Ending::Ok);
    let io = first.id;
    jobs.submit(first, &[10]);
    jobs.submit(store.start(&[11], Ending::Ok), &[11]);
    assert!(
        jobs.get_finished(&[10, 11]).is_empty(),
        "both still running"
    );
    store.complete(io);
    assert_eq!(jobs.get_finished(&[]), [10]);
    store.complete_all();
    assert_eq!(jobs.wait_running(), 1, "11 is waited for ...");
    assert!(store.nothing_reads(11));
    assert!(jobs.is_tracked(&11), "... and not reported by the wait");
    assert_eq!(jobs.get_finished(&[]), [11]);
    assert_eq!(jobs.stats().steps, 0, "no step was taken");
    jobs.check_invariants().unwrap();
}
