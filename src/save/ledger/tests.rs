use super::*;

/// The requests `take_reportable` hands over.
fn reportable<T>(ledger: &mut SaveLedger<u64, T>) -> Vec<u64> {
    let mut out = Vec::new();
    ledger.take_reportable(|request, _| out.push(request));
    out
}

fn ok_now(_: ()) -> (Ended, Instant) {
    (Ended::Returned(Ok(())), Instant::now())
}

fn ledger_with_task() -> (SaveLedger<u64, ()>, TaskId) {
    let mut ledger = SaveLedger::new();
    ledger.begin_step(&[1, 2]);
    let task = ledger.open_task(&[1, 2, 1], (), Instant::now());
    (ledger, task)
}

#[test]
fn a_task_lists_each_request_once_and_closes_once() {
    let (mut ledger, task) = ledger_with_task();
    assert_eq!(ledger.tasks.get(task).unwrap().members.as_slice(), [1, 2]);
    assert_eq!(ledger.tasks_of(&[2]), vec![task]);
    assert!(ledger.close_task(task, None, Closed::Reaped, ok_now));
    assert!(!ledger.close_task(task, None, Closed::Reaped, ok_now));
    assert_eq!(ledger.latency().count(), 1, "timed once, when it closed");
    assert!(ledger.tasks_of(&[1, 2]).is_empty());
    assert_eq!(ledger.stats().tasks_reaped, 1);
    ledger.check_invariants().unwrap();
}

#[test]
fn tasks_of_is_ascending_and_deduplicated() {
    let mut ledger = SaveLedger::new();
    ledger.begin_step(&[1, 2]);
    let now = Instant::now();
    let a = ledger.open_task(&[2], (), now);
    let b = ledger.open_task(&[1, 2], (), now);
    let c = ledger.open_task(&[1], (), now);
    assert_eq!(ledger.tasks_of(&[1, 2]), vec![a, b, c]);
    assert_eq!(ledger.tasks_of(&[1]), vec![b, c]);
    assert_eq!(ledger.running().collect::<Vec<_>>(), vec![a, b, c]);
}

#[test]
fn check_invariants_finds_a_missing_reverse_entry() {
    let (mut ledger, _) = ledger_with_task();
    ledger.requests.get_mut(&2).unwrap().tasks = None;
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("reverse index"), "{why}");
}

#[test]
fn check_invariants_finds_a_reverse_entry_without_its_task() {
    let (mut ledger, task) = ledger_with_task();
    ledger.tasks.get_mut(task).unwrap().members.remove(&1);
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("does not read it"), "{why}");
}

#[test]
fn check_invariants_finds_an_empty_task_list() {
    let (mut ledger, _) = ledger_with_task();
    ledger.requests.insert(
        9,
        RequestState {
            recorded: Recorded::No,
            tasks: Some(OneOrMany::Many(Vec::new())),
            failed: false,
        },
    );
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("empty task list"), "{why}");
}

#[test]
fn check_invariants_finds_a_request_kept_for_nothing_and_a_wrong_count() {
    let (mut ledger, _) = ledger_with_task();
    let nothing = RequestState {
        recorded: Recorded::No,
        tasks: None,
        failed: false,
    };
    ledger.requests.insert(7, nothing);
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("no record and no task"), "{why}");

    let (mut ledger, _) = ledger_with_task();
    ledger.recorded += 1;
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("the count says"), "{why}");
}

#[test]
fn a_request_stays_while_recorded_or_saving_and_leaves_after_both() {
    let mut ledger: SaveLedger<u64, ()> = SaveLedger::new();
    // Saved before any step recorded it: kept for its task only.
    let early = ledger.open_task(&[5], (), Instant::now());
    assert_eq!(ledger.stats().unrecorded_saves, 1);
    assert!(!ledger.is_recorded(&5));
    ledger.begin_step(&[5, 6]);
    assert!(ledger.is_recorded(&5) && ledger.is_recorded(&6));
    assert_eq!(ledger.recorded_count(), 2);
    let late = ledger.open_task(&[5, 6], (), Instant::now());
    assert_eq!(ledger.stats().unrecorded_saves, 1, "recorded now");
    assert_eq!(ledger.finish(&[5, 6, 5, 8]), vec![5, 6]);
    assert_eq!(
        (ledger.stats().repeated_finishes, ledger.stats().not_delayed),
        (1, 1)
    );
    assert!(ledger.close_task(early, None, Closed::Reaped, ok_now));
    assert!(
        reportable(&mut ledger).is_empty(),
        "`late` still reads both"
    );
    assert!(ledger.close_task(late, None, Closed::Reaped, ok_now));
    assert_eq!(reportable(&mut ledger), vec![5, 6]);
    assert_eq!(ledger.recorded_count(), 0);
    assert!(ledger.requests.is_empty());
    ledger.check_invariants().unwrap();

    // A save of a request no step records leaves with its last task.
    let stray = ledger.open_task(&[9], (), Instant::now());
    assert!(ledger.close_task(stray, None, Closed::Reaped, ok_now));
    assert!(ledger.requests.is_empty());
    ledger.check_invariants().unwrap();
}

#[test]
fn check_invariants_finds_finished_requests_missing_from_the_queue() {
    let (mut ledger, _) = ledger_with_task();
    let mark = |ledger: &mut SaveLedger<u64, ()>, request, recorded| {
        ledger.requests.get_mut(&request).unwrap().recorded = recorded;
    };
    mark(&mut ledger, 1, Recorded::Finished);
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("queued for report"), "{why}");
    mark(&mut ledger, 1, Recorded::Saving);
    ledger.finishing.push(1);
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("queued for report"), "{why}");
    mark(&mut ledger, 2, Recorded::Finished);
    let why = ledger.check_invariants().unwrap_err();
    assert!(why.contains("not finished"), "{why}");
}

#[test]
fn every_ending_is_counted_under_its_own_counter() {
    let mut ledger: SaveLedger<u64, Ended> = SaveLedger::new();
    let endings = [
        Ended::Returned(Ok(())),
        Ended::Returned(Err(TaskError::TimedOut)),
        Ended::Returned(Err(TaskError::Abandoned)),
        Ended::Panicked,
        Ended::Returned(Err(TaskError::failed("x"))),
    ];
    for ended in endings {
        let task = ledger.open_task(&[], ended, Instant::now());
        assert!(ledger.close_task(task, None, Closed::Waited, |ended| (ended, Instant::now())));
    }
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.task_failures,
            stats.task_timeouts,
            stats.tasks_abandoned,
            stats.task_panics
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(stats.tasks_waited, 5);
}
