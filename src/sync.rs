//! The one place kvtier gets its synchronisation primitives from.
//!
//! Every atomic, mutex, condition variable, `Arc` and thread the crate uses is
//! imported from this module. By default they are `std`'s atomics and threads
//! with `parking_lot`'s `Mutex`/`Condvar`. Built with `--cfg kvtier_loom` they
//! are [loom]'s, so loom can enumerate every interleaving of the real driver;
//! built with `--cfg kvtier_shuttle` they are [shuttle]'s, for randomised
//! schedules at sizes loom cannot reach. A primitive imported from anywhere
//! else would be invisible to both checkers, so nothing else in `src/` names
//! `std::sync`, `std::thread` or `parking_lot` directly.
//!
//! The cfg names are crate-specific (`kvtier_loom`, not `loom`) so that a
//! workspace built for loom does not flip other crates' `cfg(loom)` code.
//!
//! All three back-ends are presented with one API: `Mutex::lock` returns the
//! guard directly (no poisoning: a panic in kvtier's short critical sections is
//! a bug, and the guarded data stays consistent anyway), and `Condvar::wait`
//! takes the guard by value and hands it back, as `std`'s does.
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

#[cfg(all(kvtier_loom, kvtier_shuttle))]
compile_error!(
    "`--cfg kvtier_loom` and `--cfg kvtier_shuttle` are mutually exclusive: pick one model checker per build"
);

#[cfg(not(model_checked))]
mod imp {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::atomic;

    /// A mutex whose `lock` returns the guard directly.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable with `std`'s by-value `wait`.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        /// Waits at most `limit`; callers re-check their condition and
        /// their deadline, so whether it timed out is not reported.
        #[cfg_attr(not(tokio_driver), allow(dead_code))]
        pub(crate) fn wait_timeout<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            limit: std::time::Duration,
        ) -> MutexGuard<'a, T> {
            self.0.wait_for(&mut guard, limit);
            guard
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub(crate) mod thread {
        pub(crate) use std::thread::{Builder, JoinHandle, current};
    }
}

/// loom and shuttle both mirror `std`'s API (poisoning `lock`, by-value
/// `Condvar::wait`); this wraps either one into the shim's API.
#[cfg(model_checked)]
macro_rules! checked_primitives {
    ($checker:ident) => {
        pub(crate) use $checker::sync::Arc;
        pub(crate) use $checker::sync::atomic;

        /// A mutex whose `lock` returns the guard directly.
        #[derive(Debug)]
        pub(crate) struct Mutex<T>($checker::sync::Mutex<T>);

        pub(crate) type MutexGuard<'a, T> = $checker::sync::MutexGuard<'a, T>;

        impl<T> Mutex<T> {
            pub(crate) fn new(value: T) -> Self {
                Self($checker::sync::Mutex::new(value))
            }

            pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
                // Poisoning only records that another thread panicked while
                // holding the lock; kvtier's critical sections leave the data
                // consistent, so the guard is used as is.
                self.0
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            }
        }

        /// A condition variable with `std`'s by-value `wait`.
        #[derive(Debug)]
        pub(crate) struct Condvar($checker::sync::Condvar);

        impl Condvar {
            pub(crate) fn new() -> Self {
                Self($checker::sync::Condvar::new())
            }

            pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
                self.0
                    .wait(guard)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            }

            /// Neither checker models time: their `wait_timeout` waits
            /// until notified, so a model that relies on a timeout to make
            /// progress deadlocks and is reported, rather than passing.
            #[allow(dead_code)] // only the tasks driver waits with a deadline
            pub(crate) fn wait_timeout<'a, T>(
                &self,
                guard: MutexGuard<'a, T>,
                limit: std::time::Duration,
            ) -> MutexGuard<'a, T> {
                match self.0.wait_timeout(guard, limit) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                }
            }

            pub(crate) fn notify_one(&self) {
                self.0.notify_one();
            }

            pub(crate) fn notify_all(&self) {
                self.0.notify_all();
            }
        }

        pub(crate) mod thread {
            pub(crate) use $checker::thread::{Builder, JoinHandle, current};
        }
    };
}

#[cfg(kvtier_loom)]
mod imp {
    checked_primitives!(loom);
}

#[cfg(all(kvtier_shuttle, not(kvtier_loom)))]
mod imp {
    checked_primitives!(shuttle);
}

/// `std`'s `UnsafeCell` behind loom's closure API (`with` / `with_mut`), so
/// the code that touches a cell is the same under every back-end and loom can
/// check each access for causality. shuttle does not model memory, so it uses
/// this stand-in too.
#[cfg(not(kvtier_loom))]
pub(crate) mod cell {
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(kvtier_loom)]
pub(crate) mod cell {
    pub(crate) use loom::cell::UnsafeCell;
}

pub(crate) use imp::*;

/// A number no other call in this process returns: the identity of a
/// lookup table, which its tickets and group results carry.
///
/// A plain `std` atomic in every build, model checkers included, and on
/// purpose: it hands out identities, it does not order anything between
/// threads (a table and everything it hands out are used by its owner), so
/// there is no interleaving for loom or shuttle to explore, and a checker's
/// atomics cannot live in a `static`.
pub(crate) fn unique_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Async tasks, for the [`TokioProber`](crate::lookup::TokioProber): a
/// `Spawner` to start tasks on, a `Task` handle to abort them, and a
/// `timeout` combinator. On tokio by default (feature `tokio`); on
/// shuttle's executor under `--cfg kvtier_shuttle`, so the same driver code
/// runs under the checker. loom has no task executor, so under
/// `--cfg kvtier_loom` the driver is not built.
#[cfg(all(tokio_driver, not(kvtier_shuttle)))]
pub(crate) mod task {
    use std::future::Future;
    use std::time::Duration;

    /// The runtime tasks are spawned on.
    pub(crate) type Spawner = tokio::runtime::Handle;

    /// A spawned task, for aborting it.
    pub(crate) type Task = tokio::task::AbortHandle;

    /// Bounds the requests a tier has in flight at once, over all groups.
    #[cfg_attr(not(object_tier), allow(dead_code))]
    pub(crate) type Semaphore = tokio::sync::Semaphore;

    /// A request slot taken from a [`Semaphore`].
    #[cfg_attr(not(object_tier), allow(dead_code))]
    pub(crate) type SemaphorePermit<'a> = tokio::sync::SemaphorePermit<'a>;

    pub(crate) fn spawn<F>(spawner: &Spawner, future: F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        spawner.spawn(future).abort_handle()
    }

    /// `future`'s output, or `None` if `limit` passed first.
    pub(crate) async fn timeout<F: Future>(
        limit: Option<Duration>,
        future: F,
    ) -> Option<F::Output> {
        match limit {
            None => Some(future.await),
            Some(limit) => tokio::time::timeout(limit, future).await.ok(),
        }
    }
}

#[cfg(all(kvtier_shuttle, not(kvtier_loom)))]
pub(crate) mod task {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use shuttle::rand::RngCore;

    /// shuttle has one executor per test execution.
    #[derive(Clone, Copy, Debug, Default)]
    pub(crate) struct Spawner;

    /// A spawned task, for aborting it.
    pub(crate) type Task = shuttle::future::AbortHandle;

    pub(crate) fn spawn<F>(_: &Spawner, future: F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        shuttle::future::spawn(future).abort_handle()
    }

    /// shuttle has no clock. A timeout is a race: it fires once the future
    /// has been polled and found pending a random number (0 to 3) of times,
    /// drawn from shuttle's seeded random source, so the checker explores
    /// answers arriving before the deadline, after it, and never.
    pub(crate) async fn timeout<F: Future>(
        limit: Option<Duration>,
        future: F,
    ) -> Option<F::Output> {
        match limit {
            None => Some(future.await),
            Some(_) => {
                let patience = shuttle::rand::thread_rng().next_u64() % 4;
                Race {
                    future: Box::pin(future),
                    patience,
                }
                .await
            }
        }
    }

    struct Race<F> {
        future: Pin<Box<F>>,
        patience: u64,
    }

    impl<F: Future> Future for Race<F> {
        type Output = Option<F::Output>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
                return Poll::Ready(Some(output));
            }
            if self.patience == 0 {
                return Poll::Ready(None);
            }
            self.patience -= 1;
            // The "clock" ticks on every scheduling of this task.
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}
