//! The real save-completion halves (one [`SaveScheduler`], several
//! [`SaveTracker`]s) and the specification driven by one operation sequence,
//! compared after every operation, with S1–S6 checked directly against the
//! [`ScriptedStore`]'s log. Shared by the proptest suite and the
//! `save_vs_reference` fuzz target.

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use kvtier::{SaveScheduler, SaveTracker, TaskId, save::CompletionMode, save::ReportAggregator};

use crate::save_reference::{Rid, SchedulerSpec, SpecStep, WorkerSpec};
use crate::save_scripted::{Ending, ScriptedStore, ScriptedTask};

/// Request slots: each slot holds one live request id at a time, and a new
/// id once its request finished (vLLM never reuses a request id).
pub const SLOTS: usize = 6;

/// One operation. Numbers are reduced into the run's domains, so any value
/// is valid; an operation with nothing to act on does nothing.
#[derive(Clone, Debug, Arbitrary)]
pub enum SaveOp {
    /// A step: `saves[i] = (slot, blocks % 3)`; every worker begins it.
    Step {
        /// (slot, blocks) pairs.
        saves: Vec<(u8, u8)>,
    },
    /// A worker submits a task reading the step's requests picked by `pick`
    /// (bit i = the i-th request of the last step), or, with `stray`, the
    /// live requests of the slots in `pick` (saves no step recorded).
    Submit {
        /// Which worker.
        worker: u8,
        /// Bit mask.
        pick: u8,
        /// Pick from every live slot instead of the last step.
        stray: bool,
        /// How its wait ends.
        ending: Ending,
    },
    /// The store refuses a worker's submission for the last step's requests.
    Refuse {
        /// Which worker.
        worker: u8,
        /// Bit mask over the last step's requests.
        pick: u8,
    },
    /// The I/O of one running task ends.
    IoEnds {
        /// Index into the running tasks.
        task: u8,
    },
    /// A worker polls.
    Poll {
        /// Which worker.
        worker: u8,
    },
    /// The requests of the slots in `pick` finish: `request_finished` on the
    /// scheduler, then every worker's `get_finished` with them.
    Finish {
        /// Bit mask over slots.
        pick: u8,
    },
    /// One worker's `get_finished(&[])` (a later step).
    GetFinished {
        /// Which worker.
        worker: u8,
    },
    /// One worker's `get_finished` is passed an id that already finished
    /// again (vLLM passes each id once; a tracker must not report twice
    /// when a caller does not).
    Repeat {
        /// Which worker.
        worker: u8,
        /// Index into the requests finished so far.
        which: u8,
    },
    /// Every worker fences the preempted requests of the slots in `pick`.
    Preempt {
        /// Bit mask over slots.
        pick: u8,
    },
}

type Worker = SaveTracker<Rid, ScriptedTask>;

/// Everything, side by side.
pub struct SaveLockstep {
    store: ScriptedStore,
    scheduler: SaveScheduler<Rid>,
    scheduler_spec: SchedulerSpec,
    workers: Vec<Worker>,
    specs: Vec<WorkerSpec>,
    frees: ReportAggregator<Rid>,
    /// Live request id per slot.
    live: [Rid; SLOTS],
    next_id: Rid,
    last_step: Vec<Rid>,
    /// Every request finished so far, in order.
    finished: Vec<Rid>,
    /// Store task id -> (worker, tracker task id).
    task_of: BTreeMap<u64, (usize, TaskId)>,
    /// (request, worker) pairs owed a report: request_finished said true and
    /// the worker has not reported it yet.
    owed: BTreeSet<(Rid, usize)>,
}

impl SaveLockstep {
    /// A run with `workers` workers (at least one) in `mode`.
    pub fn new(mode: CompletionMode, workers: usize) -> Self {
        let workers = workers.max(1);
        Self {
            store: ScriptedStore::default(),
            scheduler: SaveScheduler::new(),
            scheduler_spec: SchedulerSpec::default(),
            workers: (0..workers).map(|_| SaveTracker::with_mode(mode)).collect(),
            specs: (0..workers).map(|_| WorkerSpec::new(mode)).collect(),
            frees: ReportAggregator::new(workers).expect("at least one worker"),
            live: std::array::from_fn(|slot| slot as Rid),
            next_id: SLOTS as Rid,
            last_step: Vec::new(),
            finished: Vec::new(),
            task_of: BTreeMap::new(),
            owed: BTreeSet::new(),
        }
    }

    fn worker(&self, index: u8) -> usize {
        usize::from(index) % self.workers.len()
    }

    fn slots(&self, pick: u8) -> Vec<Rid> {
        (0..SLOTS)
            .filter(|slot| pick & (1 << slot) != 0)
            .map(|slot| self.live[slot])
            .collect()
    }

    fn of_last_step(&self, pick: u8) -> Vec<Rid> {
        self.last_step
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 8 && pick & (1 << i) != 0)
            .map(|(_, r)| *r)
            .collect()
    }

    /// Applies `op` to everything and compares.
    pub fn apply(&mut self, op: &SaveOp) -> Result<(), String> {
        match op {
            SaveOp::Step { saves } => {
                let saves: Vec<(Rid, usize)> = saves
                    .iter()
                    .map(|(slot, blocks)| {
                        (
                            self.live[usize::from(*slot) % SLOTS],
                            usize::from(blocks % 3),
                        )
                    })
                    .collect();
                let step = self.scheduler.record_step(saves.iter().copied());
                let expected = self.scheduler_spec.record_step(&saves);
                let recorded = SpecStep {
                    step: step.step(),
                    requests: step.requests().to_vec(),
                    preempted: step.preempted().to_vec(),
                    finished: step.finished().to_vec(),
                };
                if recorded != expected || step.is_empty() != recorded.is_empty() {
                    return Err(format!(
                        "step {saves:?}: recorded {recorded:?} (empty: {}), specification {expected:?}",
                        step.is_empty()
                    ));
                }
                for w in 0..self.workers.len() {
                    self.begin_step(w, &step, &expected)?;
                }
                self.last_step = expected.requests;
            }
            SaveOp::Submit {
                worker,
                pick,
                stray,
                ending,
            } => {
                let w = self.worker(*worker);
                let requests = if *stray {
                    self.slots(*pick)
                } else {
                    self.of_last_step(*pick)
                };
                let task = self.store.start(w, &requests, *ending);
                let store_id = task.id();
                let id = self.workers[w].submit(task, &requests);
                let spec_id = self.specs[w].submit(&requests, *ending);
                if id.get() != spec_id {
                    return Err(format!("submit: task id {id}, specification {spec_id}"));
                }
                self.task_of.insert(store_id, (w, id));
            }
            SaveOp::Refuse { worker, pick } => {
                let w = self.worker(*worker);
                let requests = self.of_last_step(*pick);
                self.workers[w].submit_failed(&requests, self.store.refuse());
                self.specs[w].submit_failed();
            }
            SaveOp::IoEnds { task } => {
                let running = self.store.running();
                if !running.is_empty() {
                    let store_id = running[usize::from(*task) % running.len()];
                    self.store.end_io(store_id);
                    let (w, id) = self.task_of[&store_id];
                    self.specs[w].io_ends(id.get());
                }
            }
            SaveOp::Poll { worker } => {
                let w = self.worker(*worker);
                let reaped = self.workers[w].poll();
                let expected = self.specs[w].poll();
                if reaped != expected {
                    return Err(format!(
                        "worker {w} poll reaped {reaped}, specification {expected}"
                    ));
                }
            }
            SaveOp::Finish { pick } => {
                let finished = self.slots(*pick);
                self.finish(&finished)?;
            }
            SaveOp::GetFinished { worker } => {
                let w = self.worker(*worker);
                self.get_finished(w, &[])?;
            }
            SaveOp::Repeat { worker, which } => {
                if !self.finished.is_empty() {
                    let w = self.worker(*worker);
                    let request = self.finished[usize::from(*which) % self.finished.len()];
                    self.get_finished(w, &[request])?;
                }
            }
            SaveOp::Preempt { pick } => {
                // Fenced at once, as by an engine calling the fence itself,
                // and again by the next step, which carries them: that fence
                // waits what was submitted for them in between.
                let preempted = self.slots(*pick);
                self.scheduler.preempt(&preempted);
                self.scheduler_spec.preempt(&preempted);
                for w in 0..self.workers.len() {
                    self.preempt(w, &preempted)?;
                }
            }
        }
        self.compare()
    }

    /// The requests `finished` finish: the scheduler answers, every worker
    /// is told; their slots get fresh ids.
    fn finish(&mut self, finished: &[Rid]) -> Result<(), String> {
        // A finished request saves no more: the step's list forgets it.
        self.last_step.retain(|request| !finished.contains(request));
        for request in finished {
            let delay = self.scheduler.request_finished(request);
            let expected = self.scheduler_spec.request_finished(*request);
            if delay != expected {
                return Err(format!(
                    "request_finished({request}): {delay}, specification {expected}"
                ));
            }
            if delay {
                self.frees.expect(*request);
                self.owed
                    .extend((0..self.workers.len()).map(|w| (*request, w)));
            }
            self.finished.push(*request);
            if let Some(slot) = self.live.iter().position(|r| r == request) {
                self.live[slot] = self.next_id;
                self.next_id += 1;
            }
        }
        for w in 0..self.workers.len() {
            self.get_finished(w, finished)?;
        }
        Ok(())
    }

    fn get_finished(&mut self, w: usize, finished: &[Rid]) -> Result<(), String> {
        let reported = self.workers[w].get_finished(finished);
        let expected = self.specs[w].get_finished(finished);
        self.take_reports(
            w,
            &format!("get_finished({finished:?})"),
            reported,
            expected,
        )
    }

    /// A worker's orderly shutdown: it waits for every task (a task whose
    /// check panics is only ever waited, never reaped) and reports.
    fn wait_all(&mut self, w: usize) -> Result<(), String> {
        let reported = self.workers[w].wait_all();
        let expected = self.specs[w].wait_all();
        self.take_reports(w, "wait_all()", reported, expected)
    }

    /// Compares a worker's reports with the specification's and hands them
    /// to the aggregator, checking S1-S3.
    fn take_reports(
        &mut self,
        w: usize,
        call: &str,
        reported: Vec<Rid>,
        expected: Vec<Rid>,
    ) -> Result<(), String> {
        if reported != expected {
            return Err(format!(
                "worker {w} {call}: {reported:?}, specification {expected:?}"
            ));
        }
        // S1: nothing reads a reported request's blocks.
        let reading = self.store.reading(w, &reported);
        if !reading.is_empty() {
            return Err(format!(
                "S1: worker {w} reported {reported:?} while tasks {reading:?} read them"
            ));
        }
        // S2 (once) and S3 (only delayed requests): the aggregator refuses
        // a duplicate or an unexpected report.
        for request in &reported {
            if !self.owed.remove(&(*request, w)) {
                return Err(format!(
                    "S2/S3: worker {w} reported {request}, which it did not owe"
                ));
            }
        }
        let report = self
            .frees
            .report(w, reported)
            .map_err(|why| format!("aggregator: {why}"))?;
        if let Some(why) = report.refused.first() {
            return Err(format!("aggregator: {why}"));
        }
        let freed = report.free;
        // S1 across workers: a request is freed once every worker reported
        // it, and then no task of any worker reads its blocks.
        for w in 0..self.workers.len() {
            let reading = self.store.reading(w, &freed);
            if !reading.is_empty() {
                return Err(format!(
                    "S1: {freed:?} freed while worker {w}'s tasks {reading:?} read them"
                ));
            }
        }
        Ok(())
    }

    /// Worker `w` takes the step (the same step a second time must be
    /// refused, and change nothing), fencing its preemptions: S5 and S6.
    fn begin_step(
        &mut self,
        w: usize,
        step: &kvtier::SaveStep<Rid>,
        expected: &SpecStep,
    ) -> Result<(), String> {
        let before = self.store.wait_count();
        let waits_before = self.workers[w].stats().tasks_waited;
        self.workers[w]
            .begin_step(step)
            .map_err(|error| format!("worker {w} refused step {}: {error}", step.step()))?;
        let fenced = self.specs[w]
            .begin_step(expected)
            .map_err(|(due, got)| format!("specification refused step {got} (due {due})"))?;
        let waited = (self.workers[w].stats().tasks_waited - waits_before) as usize;
        if waited != fenced.len() {
            return Err(format!(
                "worker {w} step {} fenced {waited} tasks, specification {fenced:?}",
                step.step()
            ));
        }
        self.check_fence(w, &expected.preempted, before)?;
        match self.workers[w].begin_step(step) {
            Err(kvtier::save::StepError::Repeated { expected: due, got })
                if due == step.step() + 1 && got == step.step() => {}
            other => {
                return Err(format!(
                    "worker {w} took step {} twice: {other:?}",
                    step.step()
                ));
            }
        }
        Ok(())
    }

    fn preempt(&mut self, w: usize, preempted: &[Rid]) -> Result<(), String> {
        let before = self.store.wait_count();
        let waited = self.workers[w].handle_preemptions(preempted);
        let expected = self.specs[w].handle_preemptions(preempted);
        if waited != expected.len() {
            return Err(format!(
                "worker {w} preempt {preempted:?}: waited {waited}, specification {expected:?}"
            ));
        }
        self.check_fence(w, preempted, before)
    }

    /// S5: after a fence over `preempted`, nothing of worker `w` reads a
    /// preempted block, and the waits since `before` were only of tasks
    /// reading one.
    fn check_fence(&mut self, w: usize, preempted: &[Rid], before: usize) -> Result<(), String> {
        // S5: afterwards nothing of this worker reads a preempted block, and
        // only tasks reading one were waited.
        let reading = self.store.reading(w, preempted);
        if !reading.is_empty() {
            return Err(format!(
                "S5: after fencing {preempted:?}, worker {w}'s tasks {reading:?} still read them"
            ));
        }
        for task in self.store.waits_since(before) {
            let (_, reads) = self.store.reads_of(task);
            if !reads.iter().any(|r| preempted.contains(r)) {
                return Err(format!(
                    "S5: fencing {preempted:?} waited task {task}, which reads {reads:?}"
                ));
            }
        }
        Ok(())
    }

    /// Compares every worker with its specification; checks S6.
    fn compare(&self) -> Result<(), String> {
        for (w, (worker, spec)) in self.workers.iter().zip(&self.specs).enumerate() {
            worker
                .check_invariants()
                .map_err(|why| format!("worker {w}: {why}"))?;
            if worker.stats() != spec.stats {
                return Err(format!(
                    "worker {w} stats {:?}\nspecification {:?}",
                    worker.stats(),
                    spec.stats
                ));
            }
            if worker.running_tasks() != spec.tasks.len() {
                return Err(format!(
                    "worker {w}: {} running tasks, specification {}",
                    worker.running_tasks(),
                    spec.tasks.len()
                ));
            }
            if worker.deferred_requests() != spec.finishing {
                return Err(format!(
                    "worker {w}: deferred {:?}, specification {:?}",
                    worker.deferred_requests(),
                    spec.finishing
                ));
            }
            if worker.tracked_requests() != spec.recorded.len() {
                return Err(format!(
                    "worker {w}: {} tracked, specification {:?}",
                    worker.tracked_requests(),
                    spec.recorded
                ));
            }
            for request in 0..self.next_id {
                // S6: a worker tracks a request exactly while the scheduler
                // would delay its free, or it finished delayed and this
                // worker still owes its report.
                let tracked = worker.is_tracked(&request);
                let should =
                    self.scheduler.is_delayed(&request) || self.owed.contains(&(request, w));
                if tracked != should || tracked != spec.recorded.contains(&request) {
                    return Err(format!(
                        "S6: worker {w} tracks {request}: {tracked}; scheduler delays it: {}; report owed: {}",
                        self.scheduler.is_delayed(&request),
                        self.owed.contains(&(request, w))
                    ));
                }
            }
        }
        if self.scheduler.stats() != self.scheduler_spec.stats {
            return Err(format!(
                "scheduler stats {:?}, specification {:?}",
                self.scheduler.stats(),
                self.scheduler_spec.stats
            ));
        }
        if self.scheduler.delayed_count() != self.scheduler_spec.delayed.len() {
            return Err(format!(
                "scheduler delays {} requests, specification {:?}",
                self.scheduler.delayed_count(),
                self.scheduler_spec.delayed
            ));
        }
        Ok(())
    }

    /// Ends the run: every live request finishes, every I/O ends, every
    /// worker reports, then shuts down (`wait_all`). Then every delayed request must have been freed once
    /// per worker (S2), every task waited and every handle released exactly
    /// once (S4), and nothing may remain.
    pub fn finish_run(&mut self) -> Result<(), String> {
        let live = self.live.to_vec();
        self.finish(&live)?;
        for task in self.store.running() {
            self.store.end_io(task);
            let (w, id) = self.task_of[&task];
            self.specs[w].io_ends(id.get());
        }
        for w in 0..self.workers.len() {
            self.get_finished(w, &[])?;
            self.wait_all(w)?;
        }
        self.compare()?;
        if !self.owed.is_empty() {
            return Err(format!("S2: reports never made: {:?}", self.owed));
        }
        if self.frees.waiting() != 0 {
            return Err(format!("S2: {} requests never freed", self.frees.waiting()));
        }
        for (w, worker) in self.workers.iter().enumerate() {
            if worker.running_tasks() != 0 || worker.tracked_requests() != 0 {
                return Err(format!(
                    "worker {w} kept {} tasks and {} requests",
                    worker.running_tasks(),
                    worker.tracked_requests()
                ));
            }
        }
        self.store.check_all_released()
    }
}
