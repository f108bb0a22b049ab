//! A scripted store for the save tests: single-threaded, the test decides
//! when each task's I/O ends, and every wait and handle release is logged.

#![allow(dead_code)] // each test file uses part of it

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kvtier::{StoreTask, save::TaskError};

/// How a scripted task ends when waited for.
#[derive(Clone, Copy, Debug)]
pub enum Ending {
    Ok,
    Fails,
    TimesOut,
    PanicsInWait,
    PanicsInCheck,
}

#[derive(Default)]
struct Log {
    /// Tasks whose I/O is still reading blocks.
    running: HashSet<u64>,
    /// Tasks waited for while their I/O was still running.
    waited_running: Vec<u64>,
    /// Every wait call, in order.
    waits: Vec<u64>,
    /// Handle releases per task.
    released: HashMap<u64, u32>,
    /// Blocks (request ids) read by each running task.
    reads: HashMap<u64, Vec<u64>>,
}

/// A single-threaded store: the test decides when each task's I/O ends;
/// waiting for a running task stands for blocking until its I/O ends.
#[derive(Clone, Default)]
pub struct Store {
    log: Arc<Mutex<Log>>,
    next: Arc<Mutex<u64>>,
}

struct Handle {
    task: u64,
    log: Arc<Mutex<Log>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        *self
            .log
            .lock()
            .unwrap()
            .released
            .entry(self.task)
            .or_default() += 1;
    }
}

pub struct Task {
    pub id: u64,
    ending: Ending,
    log: Arc<Mutex<Log>>,
    _handle: Handle,
}

impl Store {
    pub fn start(&self, requests: &[u64], ending: Ending) -> Task {
        let id = {
            let mut next = self.next.lock().unwrap();
            *next += 1;
            *next
        };
        let mut log = self.log.lock().unwrap();
        log.running.insert(id);
        log.reads.insert(id, requests.to_vec());
        log.released.insert(id, 0);
        drop(log);
        Task {
            id,
            ending,
            log: self.log.clone(),
            _handle: Handle {
                task: id,
                log: self.log.clone(),
            },
        }
    }

    /// The store's I/O for `task` ends.
    pub fn complete(&self, task: u64) {
        self.log.lock().unwrap().running.remove(&task);
    }

    pub fn complete_all(&self) {
        self.log.lock().unwrap().running.clear();
    }

    /// S1: no running task reads a block of `request`.
    pub fn nothing_reads(&self, request: u64) -> bool {
        let log = self.log.lock().unwrap();
        log.running
            .iter()
            .all(|task| !log.reads[task].contains(&request))
    }

    pub fn is_running(&self, task: u64) -> bool {
        self.log.lock().unwrap().running.contains(&task)
    }

    pub fn waits(&self) -> Vec<u64> {
        self.log.lock().unwrap().waits.clone()
    }

    pub fn waited_running(&self) -> Vec<u64> {
        self.log.lock().unwrap().waited_running.clone()
    }

    /// S4: every task started so far had its handle released exactly once.
    pub fn every_handle_released_once(&self) -> bool {
        let log = self.log.lock().unwrap();
        log.released.values().all(|count| *count == 1)
    }

    pub fn released(&self, task: u64) -> u32 {
        self.log.lock().unwrap().released[&task]
    }
}

impl StoreTask for Task {
    fn check(&self) -> bool {
        if let Ending::PanicsInCheck = self.ending {
            panic!("check of task {} panicked", self.id);
        }
        !self.log.lock().unwrap().running.contains(&self.id)
    }

    fn wait(self) -> Result<(), TaskError> {
        {
            let mut log = self.log.lock().unwrap();
            log.waits.push(self.id);
            if log.running.remove(&self.id) {
                log.waited_running.push(self.id);
            }
        }
        match self.ending {
            Ending::Ok | Ending::PanicsInCheck => Ok(()),
            Ending::Fails => Err(TaskError::failed("disk full")),
            Ending::TimesOut => Err(TaskError::TimedOut),
            Ending::PanicsInWait => panic!("wait of task {} panicked", self.id),
        }
    }
}
