//! A store task whose check or wait is interrupted (a Python
//! `KeyboardInterrupt` inside `done()` or `wait()`) is not over: the
//! tracker keeps it running, the call stops without passing its fence or
//! reporting, hands the cause back, and a retry finishes the job (S14).

use std::cell::Cell;
use std::rc::Rc;

use kvtier::save::{CompletionMode, Interrupted, StepError, TaskError};
use kvtier::{SaveScheduler, SaveTracker, StoreTask};

/// A save whose next `interruptions` checks and waits are interrupted; the
/// shared counter says how many waits went through (the I/O really ended).
struct Stubborn {
    interruptions: Rc<Cell<usize>>,
    waited: Rc<Cell<usize>>,
    done: bool,
}

impl Stubborn {
    fn new(interruptions: usize, done: bool) -> (Self, Rc<Cell<usize>>, Rc<Cell<usize>>) {
        let left = Rc::new(Cell::new(interruptions));
        let waited = Rc::new(Cell::new(0));
        let task = Self {
            interruptions: left.clone(),
            waited: waited.clone(),
            done,
        };
        (task, left, waited)
    }

    fn interrupted(&self) -> Option<Interrupted> {
        let left = self.interruptions.get();
        (left > 0).then(|| {
            self.interruptions.set(left - 1);
            Interrupted("KeyboardInterrupt".into())
        })
    }
}

impl StoreTask for Stubborn {
    fn check(&self) -> bool {
        self.done
    }

    fn wait(self) -> Result<(), TaskError> {
        self.waited.set(self.waited.get() + 1);
        Ok(())
    }

    fn try_check(&self) -> Result<bool, Interrupted> {
        match self.interrupted() {
            Some(cause) => Err(cause),
            None => Ok(self.check()),
        }
    }

    fn try_wait(self) -> Result<Result<(), TaskError>, (Self, Interrupted)> {
        match self.interrupted() {
            Some(cause) => Err((self, cause)),
            None => Ok(self.wait()),
        }
    }
}

#[test]
fn an_interrupted_fence_does_not_pass_and_the_step_can_be_offered_again() {
    let mut scheduler = SaveScheduler::new();
    let mut worker = SaveTracker::new();
    let step = scheduler.record_step([(1u64, 4)]);
    worker.begin_step(&step).unwrap();
    let (task, _, waited) = Stubborn::new(1, false);
    worker.submit(task, &[1]);

    scheduler.preempt(&[1]);
    let fenced = scheduler.record_step([]);
    assert_eq!(worker.begin_step(&fenced), Err(StepError::Interrupted));
    assert_eq!(waited.get(), 0, "the save was not waited");
    assert_eq!(worker.running_tasks(), 1, "the save still reads its blocks");
    assert_eq!(worker.next_step(), fenced.step(), "the step was not taken");
    let cause = worker.take_interruption().expect("the cause is kept");
    assert!(cause.to_string().contains("KeyboardInterrupt"), "{cause}");
    assert!(worker.take_interruption().is_none(), "taken once");
    assert_eq!(worker.stats().preemption_fences, 0);
    worker.check_invariants().unwrap();

    worker
        .begin_step(&fenced)
        .expect("the retry passes the fence");
    assert_eq!(waited.get(), 1);
    assert_eq!(worker.running_tasks(), 0);
    assert_eq!(worker.stats().preemption_fences, 1);
    worker.check_invariants().unwrap();
}

#[test]
fn an_interrupted_handle_preemptions_stops_at_the_interrupted_task() {
    let mut worker = SaveTracker::new();
    worker.record(&[1u64, 2]);
    let (first, _, first_waited) = Stubborn::new(0, false);
    let (second, _, second_waited) = Stubborn::new(1, false);
    worker.submit(first, &[1]);
    worker.submit(second, &[2]);
    assert_eq!(worker.handle_preemptions(&[1, 2]), 1);
    assert!(worker.take_interruption().is_some());
    assert_eq!((first_waited.get(), second_waited.get()), (1, 0));
    assert!(
        worker.tasks_of(&2).len() == 1,
        "the interrupted save is kept"
    );
    assert_eq!(worker.handle_preemptions(&[1, 2]), 1);
    assert!(worker.take_interruption().is_none());
    assert_eq!(second_waited.get(), 1);
}

#[test]
fn an_interrupted_blocking_get_finished_reports_nothing_and_the_next_call_does() {
    let mut worker = SaveTracker::with_mode(CompletionMode::Blocking);
    worker.record(&[1u64, 2]);
    let (task, _, waited) = Stubborn::new(1, false);
    worker.submit(task, &[1]);
    assert_eq!(worker.get_finished(&[1, 2]), Vec::<u64>::new());
    assert!(worker.take_interruption().is_some());
    assert_eq!(waited.get(), 0);
    assert!(worker.is_tracked(&1) && worker.is_tracked(&2));
    worker.check_invariants().unwrap();
    assert_eq!(worker.get_finished(&[]), vec![1, 2]);
    assert_eq!(waited.get(), 1);
}

#[test]
fn an_interrupted_check_stops_the_poll_and_keeps_the_task() {
    // After an interrupt no more of the caller's code runs: the complete
    // task behind the interrupted one is not even checked.
    let mut worker = SaveTracker::new();
    worker.record(&[1u64, 2]);
    let (task, _, waited) = Stubborn::new(1, true);
    let (behind, _, behind_waited) = Stubborn::new(0, true);
    worker.submit(task, &[1]);
    worker.submit(behind, &[2]);
    assert_eq!(worker.poll(), 0);
    assert!(worker.take_interruption().is_some());
    assert_eq!((worker.running_tasks(), waited.get()), (2, 0));
    assert_eq!(behind_waited.get(), 0);
    assert_eq!(worker.poll(), 2);
    assert_eq!(worker.get_finished(&[1, 2]), vec![1, 2]);
}

#[test]
fn an_interrupted_wait_all_waits_again_when_called_again() {
    let mut worker = SaveTracker::new();
    worker.record(&[1u64]);
    let (task, _, waited) = Stubborn::new(2, false);
    worker.submit(task, &[1]);
    worker.get_finished(&[1]);
    assert!(
        worker.take_interruption().is_some(),
        "the poll was interrupted"
    );
    assert_eq!(worker.wait_all(), Vec::<u64>::new());
    assert!(worker.take_interruption().is_some());
    assert_eq!(worker.wait_all(), vec![1]);
    assert_eq!(waited.get(), 1);
}

#[test]
fn an_interrupted_get_finished_reports_nothing_until_the_next_call() {
    // What an interrupted call reported would be lost: its caller raises
    // the interrupt instead of returning the list.
    let mut worker = SaveTracker::new();
    worker.record(&[1u64, 2]);
    let (done, _, _) = Stubborn::new(0, true);
    let (interrupting, _, _) = Stubborn::new(1, false);
    worker.submit(done, &[1]);
    worker.submit(interrupting, &[2]);
    assert_eq!(worker.get_finished(&[1, 2]), Vec::<u64>::new());
    assert!(worker.take_interruption().is_some());
    assert_eq!(
        worker.get_finished(&[]),
        vec![1],
        "1 is reported by the next call"
    );
}
