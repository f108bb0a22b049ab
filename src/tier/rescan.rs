//! A thread that reconciles a directory tier's budget with its directory
//! every so often, so that processes sharing the directory stay within one
//! capacity (see `capacity/reconcile.rs` and docs/design.md, "Capacity
//! across processes"). One per budgeted tier that asks for it; dropping the
//! [`Rescanner`] stops and joins the thread.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::budget::DirBudget;
use super::tree::BlockLayout;
use crate::sync::thread::{Builder, JoinHandle};
use crate::sync::{Arc, Condvar, Mutex};

/// The running thread; stopped and joined on drop.
pub(crate) struct Rescanner {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Rescanner {
    /// Starts a thread that reconciles `budget` with `dir` every
    /// `interval` (the first time one interval from now). A reconcile that
    /// fails (the directory cannot be listed) is logged and tried again at
    /// the next interval.
    pub(crate) fn start(
        budget: DirBudget,
        dir: PathBuf,
        layout: BlockLayout,
        stale_temp_age: Duration,
        interval: Duration,
    ) -> std::io::Result<Self> {
        let stop: Arc<(Mutex<bool>, Condvar)> = Arc::default();
        let stopped = stop.clone();
        let thread = Builder::new()
            .name("kvtier-rescan".into())
            .spawn(move || {
                while wait(&stopped, interval) {
                    if let Err(error) = budget.reconcile(&dir, layout, stale_temp_age) {
                        tracing::warn!(%error, dir = %dir.display(), "cannot reconcile the budget with the directory");
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// Waits `interval` or until stopped; `true` when the time is up.
fn wait(stop: &(Mutex<bool>, Condvar), interval: Duration) -> bool {
    let deadline = Instant::now() + interval;
    let mut stopped = stop.0.lock();
    loop {
        if *stopped {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        stopped = stop.1.wait_timeout(stopped, deadline - now);
    }
}

impl Drop for Rescanner {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(thread) = self.thread.take() {
            // A reconcile in progress finishes first (one listing).
            let _ = thread.join();
        }
    }
}
