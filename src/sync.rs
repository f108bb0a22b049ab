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

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
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

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub(crate) mod thread {
        pub(crate) use std::thread::{Builder, JoinHandle};
    }
}

/// loom and shuttle both mirror `std`'s API (poisoning `lock`, by-value
/// `Condvar::wait`); this wraps either one into the shim's API.
#[cfg(any(kvtier_loom, kvtier_shuttle))]
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

            pub(crate) fn notify_one(&self) {
                self.0.notify_one();
            }

            pub(crate) fn notify_all(&self) {
                self.0.notify_all();
            }
        }

        pub(crate) mod thread {
            pub(crate) use $checker::thread::{Builder, JoinHandle};
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
