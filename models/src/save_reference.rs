//! The save-completion protocol as a short, sequential specification: the
//! oracle the real [`kvtier::SaveScheduler`] and [`kvtier::SaveTracker`] are
//! compared with. Written for clarity: sets and linear scans, every rule in
//! the words of docs/design.md (S1–S6).

use std::collections::{BTreeMap, BTreeSet};

use kvtier::{save::CompletionMode, save::SaveStats, save::SchedulerSaveStats};

use crate::save_ending::Ending;

/// A request id.
pub type Rid = u64;

/// The scheduler side: the requests whose free is delayed.
#[derive(Clone, Debug, Default)]
pub struct SchedulerSpec {
    /// Recorded by a step, not finished yet.
    pub delayed: BTreeSet<Rid>,
    /// Preempted since the last step.
    pub preempted: Vec<Rid>,
    /// Delayed requests finished since the last step.
    pub finished: Vec<Rid>,
    /// The counters the scheduler must show.
    pub stats: SchedulerSaveStats,
}

/// A step as the specification records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStep {
    /// Its sequence number.
    pub step: u64,
    /// The saving requests: non-empty ranges, each once, in order.
    pub requests: Vec<Rid>,
    /// Preempted since the previous step, in order.
    pub preempted: Vec<Rid>,
    /// Delayed requests finished since the previous step, in order.
    pub finished: Vec<Rid>,
}

impl SpecStep {
    /// Nothing saves, nobody was preempted or finished.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.preempted.is_empty() && self.finished.is_empty()
    }
}

impl SchedulerSpec {
    /// The step: its saving requests (non-empty ranges, each once, in
    /// order), and the preemptions and delayed finishes since the last one.
    pub fn record_step(&mut self, saves: &[(Rid, usize)]) -> SpecStep {
        let step = self.stats.steps;
        self.stats.steps += 1;
        let mut requests = Vec::new();
        for (request, blocks) in saves {
            if *blocks > 0 && !requests.contains(request) {
                requests.push(*request);
                if self.delayed.insert(*request) {
                    self.stats.recorded += 1;
                }
            }
        }
        SpecStep {
            step,
            requests,
            preempted: std::mem::take(&mut self.preempted),
            finished: std::mem::take(&mut self.finished),
        }
    }

    /// Preempted requests go to the next step.
    pub fn preempt(&mut self, requests: &[Rid]) {
        self.preempted.extend_from_slice(requests);
    }

    /// Delay the free exactly for recorded requests; forget the request; a
    /// delayed one goes to the next step's finished list.
    pub fn request_finished(&mut self, request: Rid) -> bool {
        let delay = self.delayed.remove(&request);
        if delay {
            self.stats.delayed += 1;
            self.finished.push(request);
        } else {
            self.stats.freed_at_once += 1;
        }
        delay
    }
}

/// A submitted task as the specification sees it.
#[derive(Clone, Debug)]
pub struct SpecTask {
    /// The requests whose blocks it reads (each once).
    pub requests: Vec<Rid>,
    /// How its wait ends.
    pub ending: Ending,
    /// Whether the store's I/O has ended (a check would say complete).
    pub io_done: bool,
    /// Whether a check of it panicked already (counted once).
    pub check_panicked: bool,
}

/// One worker's tracker.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Blocking or not.
    pub mode: CompletionMode,
    /// Recorded, not reported.
    pub recorded: BTreeSet<Rid>,
    /// Finished, recorded, not reported, in finishing order.
    pub finishing: Vec<Rid>,
    /// Running tasks by tracker task id.
    pub tasks: BTreeMap<u64, SpecTask>,
    /// The next tracker task id.
    pub next_task: u64,
    /// The counters the tracker must show.
    pub stats: SaveStats,
}

/// How a task left.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Left {
    Reaped,
    Waited,
}

impl WorkerSpec {
    /// An empty tracker.
    pub fn new(mode: CompletionMode) -> Self {
        Self {
            mode,
            recorded: BTreeSet::new(),
            finishing: Vec::new(),
            tasks: BTreeMap::new(),
            next_task: 0,
            stats: SaveStats::default(),
        }
    }

    /// Takes the step: refused unless it is the next in sequence; otherwise
    /// fences its preempted requests (if any), then records its requests.
    /// Returns the fenced tasks.
    pub fn begin_step(&mut self, step: &SpecStep) -> Result<Vec<u64>, (u64, u64)> {
        if step.step != self.stats.steps {
            return Err((self.stats.steps, step.step));
        }
        let fenced = if step.preempted.is_empty() {
            Vec::new()
        } else {
            self.handle_preemptions(&step.preempted)
        };
        self.stats.steps += 1;
        for request in &step.requests {
            if self.recorded.insert(*request) {
                self.stats.recorded += 1;
            }
        }
        Ok(fenced)
    }

    /// A task reading `requests`; returns its id.
    pub fn submit(&mut self, requests: &[Rid], ending: Ending) -> u64 {
        let id = self.next_task;
        self.next_task += 1;
        self.stats.tasks_submitted += 1;
        let mut members = Vec::new();
        for request in requests {
            if !members.contains(request) {
                members.push(*request);
                if !self.recorded.contains(request) {
                    self.stats.unrecorded_saves += 1;
                }
            }
        }
        self.tasks.insert(
            id,
            SpecTask {
                requests: members,
                ending,
                io_done: false,
                check_panicked: false,
            },
        );
        id
    }

    /// A refused submission.
    pub fn submit_failed(&mut self) {
        self.stats.submit_failures += 1;
    }

    /// The store's I/O of task `id` ended.
    pub fn io_ends(&mut self, id: u64) {
        if let Some(task) = self.tasks.get_mut(&id) {
            task.io_done = true;
        }
    }

    /// Reaps the tasks a check finds complete; returns how many were
    /// reaped. A poll never waits: a task whose check panics stays running
    /// (its first panic counted), until a fence, `wait_all` or a blocking
    /// `get_finished` waits for it.
    pub fn poll(&mut self) -> usize {
        let ids: Vec<u64> = self.tasks.keys().copied().collect();
        let mut reaped = 0;
        for id in ids {
            let task = self.tasks.get_mut(&id).expect("a running task");
            if task.ending == Ending::PanicsInCheck {
                if !task.check_panicked {
                    task.check_panicked = true;
                    self.stats.task_panics += 1;
                }
            } else if task.io_done {
                self.close(id, Left::Reaped);
                reaped += 1;
            }
        }
        reaped
    }

    /// Reports finished requests none of whose tasks runs.
    pub fn get_finished(&mut self, finished: &[Rid]) -> Vec<Rid> {
        let mut started = Vec::new();
        for request in finished {
            if !self.recorded.contains(request) {
                self.stats.not_delayed += 1;
            } else if self.finishing.contains(request) {
                self.stats.repeated_finishes += 1;
            } else {
                self.finishing.push(*request);
                started.push(*request);
            }
        }
        if self.mode == CompletionMode::Blocking {
            let finishing = self.finishing.clone();
            for id in self.tasks_reading(&finishing) {
                self.close(id, Left::Waited);
            }
        }
        self.poll();
        let reported: Vec<Rid> = self
            .finishing
            .iter()
            .copied()
            .filter(|request| self.tasks_reading(&[*request]).is_empty())
            .collect();
        self.finishing.retain(|request| !reported.contains(request));
        for request in &reported {
            self.recorded.remove(request);
        }
        self.stats.reported += reported.len() as u64;
        self.stats.deferred += started
            .iter()
            .filter(|request| self.finishing.contains(request))
            .count() as u64;
        reported
    }

    /// Waits for the tasks reading a preempted request; returns their ids.
    pub fn handle_preemptions(&mut self, preempted: &[Rid]) -> Vec<u64> {
        let fenced = self.tasks_reading(preempted);
        for id in &fenced {
            self.close(*id, Left::Waited);
        }
        self.stats.preemption_fences += 1;
        fenced
    }

    /// Waits for every task; reports every finished request.
    pub fn wait_all(&mut self) -> Vec<Rid> {
        let ids: Vec<u64> = self.tasks.keys().copied().collect();
        for id in ids {
            self.close(id, Left::Waited);
        }
        self.get_finished(&[])
    }

    /// Running tasks reading any of `requests`, ascending.
    pub fn tasks_reading(&self, requests: &[Rid]) -> Vec<u64> {
        self.tasks
            .iter()
            .filter(|(_, task)| task.requests.iter().any(|r| requests.contains(r)))
            .map(|(id, _)| *id)
            .collect()
    }

    fn close(&mut self, id: u64, left: Left) {
        let task = self.tasks.remove(&id).expect("closing a running task");
        match left {
            Left::Reaped => self.stats.tasks_reaped += 1,
            Left::Waited => self.stats.tasks_waited += 1,
        }
        match task.ending {
            Ending::Ok | Ending::PanicsInCheck => {}
            Ending::Fails => self.stats.task_failures += 1,
            Ending::TimesOut => self.stats.task_timeouts += 1,
            Ending::Abandoned => self.stats.tasks_abandoned += 1,
            Ending::PanicsInWait => self.stats.task_panics += 1,
        }
    }
}
