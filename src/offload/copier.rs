//! The copies of [`plan`](super::plan), run on native threads: an engine
//! submits a job and goes on; [`BlockCopier::finished`] reports it once its
//! bytes are in place, and [`BlockCopier::wait`] fences the jobs a
//! preemption names.
//!
//! The books are the save core's, as for vLLM's tier transfers: each job is
//! a request of a [`SaveTracker`] that is its own scheduler, with one task,
//! so a job is reported exactly once (S2) and never while a copy of it still
//! runs (S1: its task completes after its last copy), and a fence waits for
//! the named jobs and for no other (S5).

use std::any::Any;
use std::fmt;
use std::time::{Duration, Instant};

use super::plan::{Copy, CopyLayout, Direction, PlanError, Transfer};
use crate::save::SaveTracker;
use crate::save::{CompletionTask, SaveOutcome};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::tier::identified_by_id;
use crate::tier::pool::IoPool;

/// A job as the tracker holds it: equal, and hashed, by id alone.
#[derive(Clone)]
struct Job {
    id: u64,
    direction: Direction,
    bytes: usize,
    nanos: Arc<AtomicU64>,
}

impl Job {
    fn named(id: u64) -> Self {
        Self {
            id,
            direction: Direction::Store,
            bytes: 0,
            nanos: Arc::default(),
        }
    }
}

identified_by_id!(Job);

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} job {} ({} bytes)",
            self.direction, self.id, self.bytes
        )
    }
}

/// A job the copier is done with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedCopy {
    /// The job's id.
    pub id: u64,
    /// Store or load.
    pub direction: Direction,
    /// Whether every copy ran.
    pub succeeded: bool,
    /// Bytes the job moves.
    pub bytes: usize,
    /// Time its copies took.
    pub copy_time: Duration,
}

/// Why a job was refused at submission (it is then not taken at all).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// Its block ids do not fit the layout.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A job with this id is still in flight.
    #[error("KV copy job {0} is still in flight")]
    InFlight(u64),
    /// The copier was shut down.
    #[error("the KV copier was shut down")]
    ShutDown,
    /// Its threads could not be started.
    #[error("could not start the KV copy threads: {0}")]
    Threads(#[source] std::io::Error),
}

/// Copies KV blocks between an engine's KV cache and an offload region
/// described by a [`CopyLayout`] (see the module docs).
///
/// ```
/// use kvtier::offload::{BlockCopier, CacheTensor, CopyLayout, Direction, Extent, LayerRef, Transfer};
///
/// let mut engine = vec![0u8; 4 * 16]; // 4 blocks of 16 bytes
/// let mut region = vec![0u8; 2 * 32]; // 2 chunks of 2 blocks
/// engine[16..32].fill(7);
/// let extent = |memory: &mut Vec<u8>, rows, stride| Extent {
///     base: memory.as_mut_ptr() as usize,
///     rows,
///     stride,
/// };
/// let tensor = CacheTensor {
///     engine: extent(&mut engine, 4, 16),
///     offload: extent(&mut region, 2, 32),
///     page: 16,
/// };
/// let layout = CopyLayout::new(vec![tensor], vec![vec![LayerRef { tensor: 0, bytes: 16 }]], 2)?;
/// // SAFETY: both vectors outlive the copier and nothing else touches
/// // them while a job runs.
/// let mut copier = unsafe { BlockCopier::new(layout, 2, Box::new(())) }?;
/// let job = Transfer { engine_blocks: &[1], chunks: &[1], group_sizes: &[1], block_indices: &[1] };
/// copier.submit(Direction::Store, 1, &job)?;
/// copier.wait(&[1]);
/// assert!(copier.finished()[0].succeeded);
/// copier.shutdown();
/// assert_eq!(&region[48..64], &[7; 16]); // chunk 1, second slot
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BlockCopier {
    layout: CopyLayout,
    /// `None` once shut down.
    pool: Option<IoPool>,
    jobs: SaveTracker<Job, CompletionTask>,
    /// Jobs submitted since the last `finished`.
    submitted: Vec<Job>,
    /// Holds the memory in place; dropped at shutdown, after the last copy.
    keep_alive: Option<Box<dyn Any + Send + Sync>>,
}

impl BlockCopier {
    /// A copier over `layout`'s memory, on `threads` threads (1 to [`MAX_IO_THREADS`](crate::settings::MAX_IO_THREADS), clamped;
    /// about half of them serve loads first, the rest stores first).
    ///
    /// # Safety
    ///
    /// Every row `layout` describes is memory valid for reads and writes
    /// until `keep_alive` is dropped (at [`shutdown`](Self::shutdown) or
    /// drop, after the last copy), and engine rows do not overlap offload
    /// rows. While a job runs (from its submission until it is reported or
    /// waited for), nothing else writes the bytes it reads, nor touches the
    /// bytes it writes: an engine's contract for its transfer jobs.
    pub unsafe fn new(
        layout: CopyLayout,
        threads: usize,
        keep_alive: Box<dyn Any + Send + Sync>,
    ) -> Result<Self, CopyError> {
        // guard: H2-copier-threads-capped
        let threads = threads.clamp(1, crate::settings::MAX_IO_THREADS);
        let pool = IoPool::with_lanes([threads - threads / 2, threads / 2], "kvtier-kv-copy")
            .map_err(CopyError::Threads)?;
        Ok(Self {
            layout,
            pool: Some(pool),
            jobs: SaveTracker::new(),
            submitted: Vec::new(),
            keep_alive: Some(keep_alive),
        })
    }

    /// The layout.
    pub fn layout(&self) -> &CopyLayout {
        &self.layout
    }

    /// Plans job `id` and queues its copies; returns its bytes. Never waits
    /// for a copy. A job that does not fit the layout, or whose id is in
    /// flight, is refused whole.
    pub fn submit(
        &mut self,
        direction: Direction,
        id: u64,
        transfer: &Transfer<'_>,
    ) -> Result<usize, CopyError> {
        let Some(pool) = &self.pool else {
            return Err(CopyError::ShutDown);
        };
        // guard: C4-one-job-per-id-in-flight
        if self.jobs.is_tracked(&Job::named(id)) {
            return Err(CopyError::InFlight(id));
        }
        let mut copies = Vec::new();
        let bytes = self.layout.plan(transfer, &mut copies)?;
        let job = Job {
            id,
            direction,
            bytes,
            nanos: Arc::default(),
        };
        let (task, completer) = CompletionTask::new(());
        let nanos = job.nanos.clone();
        let lane = match direction {
            Direction::Load => 0,
            Direction::Store => 1,
        };
        pool.submit_to(
            lane,
            Box::new(move || {
                let started = Instant::now();
                // guard: C5-reported-after-the-last-copy
                run(direction, &copies);
                let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                nanos.store(took, Ordering::Relaxed);
                completer.succeed();
            }),
        );
        self.jobs.record(std::slice::from_ref(&job));
        self.jobs.submit(task, std::slice::from_ref(&job));
        self.submitted.push(job);
        Ok(bytes)
    }

    /// The jobs that ended since the last call, each reported once. Never
    /// blocks.
    pub fn finished(&mut self) -> Vec<FinishedCopy> {
        self.jobs
            .take_finished_outcomes(&mut self.submitted)
            .into_iter()
            .map(|(job, outcome)| FinishedCopy {
                id: job.id,
                direction: job.direction,
                succeeded: outcome == SaveOutcome::Saved,
                bytes: job.bytes,
                copy_time: Duration::from_nanos(job.nanos.load(Ordering::Relaxed)),
            })
            .collect()
    }

    /// Waits until the jobs `ids` (those still running; unknown ids are
    /// ignored) no longer touch their blocks, and for no other job: the
    /// fence before an engine reuses a preempted request's blocks. Their
    /// reports come with the next [`finished`](Self::finished). Returns how
    /// many jobs it waited for.
    pub fn wait(&mut self, ids: &[u64]) -> usize {
        let named: Vec<Job> = ids.iter().map(|&id| Job::named(id)).collect();
        // guard: C6-wait-fences-the-named-jobs
        self.jobs.handle_preemptions(&named)
    }

    /// Jobs submitted and not reported yet.
    pub fn in_flight(&self) -> usize {
        self.jobs.tracked_requests()
    }

    /// Runs every job submitted (an engine's shutdown waits for its
    /// transfers), stops the threads and lets go of the memory. Jobs
    /// submitted afterwards are refused. Returns how many jobs it waited
    /// for.
    pub fn shutdown(&mut self) -> usize {
        let waited = self.jobs.running_tasks();
        // Dropping the pool runs what is queued and joins the threads.
        drop(self.pool.take());
        self.jobs.wait_running();
        // guard: C7-shutdown-lets-go-of-the-memory
        drop(self.keep_alive.take());
        waited
    }
}

impl Drop for BlockCopier {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl fmt::Debug for BlockCopier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockCopier")
            .field("groups", &self.layout.groups())
            .field("blocks_per_chunk", &self.layout.blocks_per_chunk())
            .field("in_flight", &self.in_flight())
            .field("shut_down", &self.pool.is_none())
            .finish_non_exhaustive()
    }
}

/// Runs one job's copies.
fn run(direction: Direction, copies: &[Copy]) {
    for copy in copies {
        let (from, to) = match direction {
            Direction::Store => (copy.engine, copy.offload),
            Direction::Load => (copy.offload, copy.engine),
        };
        #[allow(unsafe_code)]
        // SAFETY: the plan kept both ranges inside rows of the layout, which
        // `BlockCopier::new`'s contract makes valid memory while the copier
        // holds it (the pool runs no job after the memory is let go), and
        // the engine's contract keeps every other access off them while the
        // job runs. `copy` tolerates overlap, though the contract rules it
        // out.
        unsafe {
            std::ptr::copy(
                std::ptr::with_exposed_provenance::<u8>(from),
                std::ptr::with_exposed_provenance_mut::<u8>(to),
                copy.len,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::plan::{CacheTensor, Extent, LayerRef};
    use crate::sync::atomic::AtomicUsize;

    /// Counts its drops: stands for the engine's tensors.
    struct Held(Arc<AtomicUsize>);

    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn shutdown_runs_what_was_submitted_then_lets_go_of_the_memory() {
        let mut engine = vec![5u8; 4 * 8];
        let mut region = vec![0u8; 4 * 8];
        let extent = |memory: &mut Vec<u8>| Extent {
            base: memory.as_mut_ptr() as usize,
            rows: 4,
            stride: 8,
        };
        let tensor = CacheTensor {
            engine: extent(&mut engine),
            offload: extent(&mut region),
            page: 8,
        };
        let layout = CopyLayout::new(
            vec![tensor],
            vec![vec![LayerRef {
                tensor: 0,
                bytes: 8,
            }]],
            1,
        )
        .unwrap();
        let released = Arc::new(AtomicUsize::new(0));
        // SAFETY: both vectors outlive the copier; nothing else touches them.
        let mut copier =
            unsafe { BlockCopier::new(layout, 1, Box::new(Held(released.clone()))) }.unwrap();
        for id in 0..4u64 {
            let block = [id as i64];
            let job = Transfer {
                engine_blocks: &block,
                chunks: &block,
                group_sizes: &[1],
                block_indices: &[0],
            };
            copier.submit(Direction::Store, id, &job).unwrap();
        }
        copier.shutdown();
        assert_eq!(released.load(Ordering::SeqCst), 1, "the memory was let go");
        assert_eq!(region, vec![5u8; 32], "every job submitted ran");
        assert_eq!(copier.finished().len(), 4);
        assert!(matches!(
            copier.submit(
                Direction::Store,
                9,
                &Transfer {
                    engine_blocks: &[0],
                    chunks: &[0],
                    group_sizes: &[1],
                    block_indices: &[0],
                }
            ),
            Err(CopyError::ShutDown)
        ));
        drop(copier);
        assert_eq!(released.load(Ordering::SeqCst), 1, "let go once");
    }

    #[test]
    fn a_thread_count_past_the_cap_is_clamped_not_allocated() {
        let mut memory = vec![0u8; 8];
        let extent = Extent {
            base: memory.as_mut_ptr() as usize,
            rows: 1,
            stride: 8,
        };
        let tensor = CacheTensor {
            engine: extent,
            offload: extent,
            page: 8,
        };
        let layer = LayerRef {
            tensor: 0,
            bytes: 8,
        };
        let layout = CopyLayout::new(vec![tensor], vec![vec![layer]], 1).unwrap();
        // SAFETY: no job is submitted; the memory outlives the copier.
        let copier = unsafe { BlockCopier::new(layout, usize::MAX, Box::new(())) };
        assert!(copier.is_ok(), "{:?}", copier.err());
        drop(copier);
        drop(memory);
    }
}
