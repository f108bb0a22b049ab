//! A deterministic, single-threaded store for the save-completion models:
//! the model decides when each task's I/O ends and how its wait ends, and the
//! store's log is the independent witness of S1, S4 and S5 (which blocks are
//! still read, which tasks were waited, which handles released).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;

use kvtier::{StoreTask, save::TaskError};

pub use crate::save_ending::Ending;
use crate::save_reference::Rid;
use crate::scripted::ScriptedPanic;

/// What the store saw.
#[derive(Debug, Default)]
pub struct StoreLog {
    /// Tasks whose I/O still reads blocks.
    pub running: BTreeSet<u64>,
    /// Worker and requests of every task started.
    pub reads: BTreeMap<u64, (usize, Vec<Rid>)>,
    /// Every `wait`, in order.
    pub waits: Vec<u64>,
    /// Handle releases per task (started or refused).
    pub released: BTreeMap<u64, u32>,
    /// Tasks the store refused.
    pub refused: BTreeSet<u64>,
    next: u64,
}

/// The shared store (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct ScriptedStore {
    log: Rc<RefCell<StoreLog>>,
}

/// The per-task handle (the device event of a real store): counts its
/// releases.
#[derive(Debug)]
pub struct EventHandle {
    task: u64,
    log: Rc<RefCell<StoreLog>>,
}

impl Drop for EventHandle {
    fn drop(&mut self) {
        *self.log.borrow_mut().released.entry(self.task).or_default() += 1;
    }
}

/// A task of the scripted store.
#[derive(Debug)]
pub struct ScriptedTask {
    id: u64,
    ending: Ending,
    log: Rc<RefCell<StoreLog>>,
    _handle: EventHandle,
}

/// A submission the store refused; owns the handle, which is released when
/// the tracker drops it.
#[derive(Debug)]
pub struct Refused(pub EventHandle);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store queue full (task {})", self.0.task)
    }
}

impl ScriptedStore {
    fn handle(&self) -> EventHandle {
        let mut log = self.log.borrow_mut();
        let task = log.next;
        log.next += 1;
        log.released.insert(task, 0);
        EventHandle {
            task,
            log: self.log.clone(),
        }
    }

    /// Starts a task of `worker` reading `requests`' blocks.
    pub fn start(&self, worker: usize, requests: &[Rid], ending: Ending) -> ScriptedTask {
        let handle = self.handle();
        let id = handle.task;
        let mut log = self.log.borrow_mut();
        log.running.insert(id);
        log.reads.insert(id, (worker, requests.to_vec()));
        drop(log);
        ScriptedTask {
            id,
            ending,
            log: self.log.clone(),
            _handle: handle,
        }
    }

    /// A submission the store refuses.
    pub fn refuse(&self) -> Refused {
        let handle = self.handle();
        self.log.borrow_mut().refused.insert(handle.task);
        Refused(handle)
    }

    /// The I/O of `task` ends.
    pub fn end_io(&self, task: u64) {
        self.log.borrow_mut().running.remove(&task);
    }

    /// Tasks whose I/O is running, ascending.
    pub fn running(&self) -> Vec<u64> {
        self.log.borrow().running.iter().copied().collect()
    }

    /// Running tasks of `worker` reading a block of any of `requests`.
    pub fn reading(&self, worker: usize, requests: &[Rid]) -> Vec<u64> {
        let log = self.log.borrow();
        log.running
            .iter()
            .copied()
            .filter(|task| {
                let (owner, reads) = &log.reads[task];
                *owner == worker && reads.iter().any(|r| requests.contains(r))
            })
            .collect()
    }

    /// Number of waits so far.
    pub fn wait_count(&self) -> usize {
        self.log.borrow().waits.len()
    }

    /// The waits after the first `from`.
    pub fn waits_since(&self, from: usize) -> Vec<u64> {
        self.log.borrow().waits[from..].to_vec()
    }

    /// The requests `task` reads, and its worker.
    pub fn reads_of(&self, task: u64) -> (usize, Vec<Rid>) {
        self.log.borrow().reads[&task].clone()
    }

    /// S4 at the end: every started task waited exactly once, every refused
    /// one never, and every handle released exactly once.
    pub fn check_all_released(&self) -> Result<(), String> {
        let log = self.log.borrow();
        for (task, count) in &log.released {
            if *count != 1 {
                return Err(format!("handle of task {task} released {count} times"));
            }
        }
        let mut waited: BTreeMap<u64, u32> = BTreeMap::new();
        for task in &log.waits {
            *waited.entry(*task).or_default() += 1;
        }
        for task in log.reads.keys() {
            let count = waited.get(task).copied().unwrap_or(0);
            if count != 1 {
                return Err(format!("task {task} waited {count} times"));
            }
        }
        if let Some(task) = log.refused.iter().find(|t| waited.contains_key(t)) {
            return Err(format!("refused task {task} was waited"));
        }
        Ok(())
    }
}

impl ScriptedTask {
    /// The store's id of this task.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl StoreTask for ScriptedTask {
    fn check(&self) -> bool {
        if self.ending == Ending::PanicsInCheck {
            std::panic::panic_any(ScriptedPanic(self.id));
        }
        !self.log.borrow().running.contains(&self.id)
    }

    fn wait(self) -> Result<(), TaskError> {
        {
            let mut log = self.log.borrow_mut();
            log.waits.push(self.id);
            // Waiting blocks until the I/O ends: here, it ends now.
            log.running.remove(&self.id);
        }
        match self.ending {
            Ending::Ok | Ending::PanicsInCheck => Ok(()),
            Ending::Fails => Err(TaskError::failed("scripted write error")),
            Ending::TimesOut => Err(TaskError::TimedOut),
            Ending::Abandoned => Err(TaskError::Abandoned),
            Ending::PanicsInWait => std::panic::panic_any(ScriptedPanic(self.id)),
        }
    }
}
