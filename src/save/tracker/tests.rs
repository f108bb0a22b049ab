use super::*;
use crate::fault::logged;
use crate::save::scheduler::SaveScheduler;
use crate::save::task::TaskError;

/// A task that is complete at once and ends as given.
struct Ends(Result<(), &'static str>);

impl StoreTask for Ends {
    fn check(&self) -> bool {
        true
    }

    fn wait(self) -> Result<(), TaskError> {
        self.0.map_err(TaskError::failed)
    }
}

fn tracker_of(requests: &[u64]) -> SaveTracker<u64, Ends> {
    let mut tracker = SaveTracker::new();
    tracker
        .begin_step(&SaveScheduler::new().record_step(requests.iter().map(|r| (*r, 1))))
        .expect("steps in sequence");
    tracker
}

#[test]
fn the_mode_is_kept_and_poll_counts_what_it_reaped() {
    assert_eq!(
        SaveTracker::<u64, Ends>::new().mode(),
        CompletionMode::NonBlocking
    );
    let mut tracker = SaveTracker::with_mode(CompletionMode::Blocking);
    assert_eq!(tracker.mode(), CompletionMode::Blocking);
    tracker
        .begin_step(&SaveScheduler::new().record_step([(1u64, 1)]))
        .expect("steps in sequence");
    tracker.submit(Ends(Ok(())), &[1]);
    tracker.submit(Ends(Ok(())), &[1]);
    assert_eq!(tracker.poll(), 2);
    assert_eq!(tracker.poll(), 0);
}

#[test]
fn a_refused_submission_and_a_failed_save_are_logged_and_a_clean_one_is_not() {
    let mut tracker = tracker_of(&[1, 2]);
    let ((), log) = logged(|| {
        tracker.submit(Ends(Ok(())), &[1]);
        tracker.poll();
    });
    assert_eq!(log, "");

    let ((), log) = logged(|| tracker.submit_failed(&[1], "queue full"));
    assert!(
        log.contains("WARN") && log.contains("refused") && log.contains("queue full"),
        "{log}"
    );

    let (_, log) = logged(|| {
        tracker.submit(Ends(Err("disk full")), &[2]);
        tracker.get_finished(&[2])
    });
    assert!(log.contains("WARN") && log.contains("disk full"), "{log}");
}

#[test]
fn a_panicking_check_and_wait_are_logged_as_errors() {
    struct Panics;
    impl StoreTask for Panics {
        fn check(&self) -> bool {
            panic!("check exploded")
        }
        fn wait(self) -> Result<(), TaskError> {
            panic!("wait exploded")
        }
    }
    let mut tracker = SaveTracker::new();
    tracker
        .begin_step(&SaveScheduler::new().record_step([(1u64, 1)]))
        .expect("steps in sequence");
    tracker.submit(Panics, &[1]);
    let (reported, log) = logged(|| tracker.get_finished(&[1]));
    assert!(reported.is_empty(), "a non-blocking call never waits");
    assert!(
        log.contains("ERROR") && log.contains("check exploded"),
        "{log}"
    );
    let (reported, log) = logged(|| tracker.get_finished(&[]));
    assert!(reported.is_empty());
    assert!(!log.contains("check exploded"), "logged once: {log}");
    let (reported, log) = logged(|| tracker.wait_all());
    assert_eq!(reported, vec![1]);
    assert!(log.contains("wait exploded"), "{log}");
    assert_eq!(tracker.stats().task_panics, 2);
}

#[test]
fn dropping_a_tracker_with_running_tasks_warns_and_an_idle_one_does_not() {
    struct Running;
    impl StoreTask for Running {
        fn check(&self) -> bool {
            false
        }
        fn wait(self) -> Result<(), TaskError> {
            Ok(())
        }
    }
    let ((), log) = logged(|| drop(SaveTracker::<u64, Running>::new()));
    assert_eq!(log, "");
    let mut tracker = SaveTracker::new();
    tracker.submit(Running, &[1]);
    let ((), log) = logged(|| drop(tracker));
    assert!(log.contains("WARN") && log.contains("wait_all"), "{log}");
}
