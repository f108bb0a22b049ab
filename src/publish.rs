//! Lock-free publication from workers to the scheduler.
//!
//! A [`PublishStack`] is an intrusive singly linked stack. Producers (the
//! lookup worker) push one node per finished group with a compare-and-swap
//! loop; the single consumer (the scheduler) takes the whole stack with one
//! atomic `swap` and reverses it, which restores publication order. The
//! consumer never waits for a producer and never takes a lock, and when
//! nothing was published its check is a single atomic load.
//!
//! Why this is sound without hazard pointers or tags: nodes are only ever
//! removed by swapping the *whole* list out, never popped one by one, so there
//! is no ABA window — a producer's CAS either links its node in front of the
//! head it read, or fails because the head changed and retries. Once the
//! consumer owns a detached list no producer can reach any of its nodes.

use std::ptr;

use crate::sync::atomic::{AtomicPtr, Ordering};
use crate::sync::cell::UnsafeCell;

/// A node's contents sit in the shim's `UnsafeCell`, so under loom every
/// write (by the producer, before publishing) and every read (by the
/// consumer, after taking) is checked for a happens-before edge: a push whose
/// CAS were `Relaxed` would be reported as a causality violation.
struct Node<T> {
    slot: UnsafeCell<Slot<T>>,
}

struct Slot<T> {
    value: Option<T>,
    next: *mut Node<T>,
}

/// Multi-producer, single-consumer publication stack (see the module docs).
pub(crate) struct PublishStack<T> {
    head: AtomicPtr<Node<T>>,
}

// SAFETY: the stack owns `T` values that move from producer threads to the
// consumer thread, which is exactly what `T: Send` permits; the raw pointers
// are only ever dereferenced by whoever owns the node at that moment.
unsafe impl<T: Send> Send for PublishStack<T> {}
// SAFETY: shared access is limited to atomic operations on `head`; node
// ownership is transferred whole through those atomics (see module docs).
unsafe impl<T: Send> Sync for PublishStack<T> {}

impl<T> PublishStack<T> {
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Publishes `value`; it will be seen by the next [`take_all`](Self::take_all)
    /// that follows this push.
    pub(crate) fn push(&self, value: T) {
        let node = Box::into_raw(Box::new(Node {
            slot: UnsafeCell::new(Slot {
                value: Some(value),
                next: ptr::null_mut(),
            }),
        }));
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` came from `Box::into_raw` above and is not yet
            // shared: only this thread can reach it until the CAS succeeds.
            unsafe { (*node).slot.with_mut(|slot| (*slot).next = head) };
            // Release: the node's contents (and everything the worker did to
            // produce them) happen-before the consumer's Acquire swap.
            // guard: L7-push-retries-its-cas
            match self
                .head
                // guard: L7-release-publication
                .compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(current) => head = current,
            }
        }
    }

    /// True when nothing has been published since the last `take_all`.
    /// One atomic load: this is the scheduler's hot-path check.
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire).is_null()
    }

    /// Takes everything published so far, oldest first.
    pub(crate) fn take_all(&self) -> Vec<T> {
        let mut node = self.head.swap(ptr::null_mut(), Ordering::Acquire);
        let mut taken = Vec::new();
        while !node.is_null() {
            // SAFETY: the swap detached the whole list; every node in it was
            // created by `Box::into_raw` in `push` and is now owned solely by
            // this thread, and each is reclaimed exactly once here.
            let boxed = unsafe { Box::from_raw(node) };
            // SAFETY: this thread owns the node (above); nobody else can
            // reach its slot.
            let (value, next) = boxed
                .slot
                .with_mut(|slot| unsafe { ((*slot).value.take(), (*slot).next) });
            node = next;
            taken.extend(value);
        }
        // The stack yields newest first; publication order is the reverse.
        // guard: L7-publication-order
        taken.reverse();
        taken
    }
}

impl<T> Drop for PublishStack<T> {
    fn drop(&mut self) {
        drop(self.take_all());
    }
}

#[cfg(all(test, not(model_checked)))]
mod tests {
    use super::*;
    use crate::sync::{Arc, thread};

    #[test]
    fn take_all_returns_publication_order_and_empties_the_stack() {
        let stack = PublishStack::new();
        assert!(stack.is_empty());
        for i in 0..5 {
            stack.push(i);
        }
        assert!(!stack.is_empty());
        assert_eq!(stack.take_all(), vec![0, 1, 2, 3, 4]);
        assert!(stack.is_empty());
        assert!(stack.take_all().is_empty());
    }

    #[test]
    fn concurrent_producers_lose_nothing_and_keep_per_producer_order() {
        let stack = Arc::new(PublishStack::new());
        let producers: Vec<_> = (0..4u32)
            .map(|p| {
                let stack = stack.clone();
                thread::Builder::new()
                    .spawn(move || {
                        for i in 0..1000u32 {
                            stack.push((p, i));
                        }
                    })
                    .unwrap()
            })
            .collect();
        let mut seen = Vec::new();
        while seen.len() < 4000 {
            seen.extend(stack.take_all());
            if producers.iter().all(|p| p.is_finished()) {
                seen.extend(stack.take_all());
                break;
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        seen.extend(stack.take_all());
        assert_eq!(seen.len(), 4000);
        for p in 0..4 {
            let order: Vec<u32> = seen
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, i)| *i)
                .collect();
            assert_eq!(order, (0..1000).collect::<Vec<_>>());
        }
    }

    #[test]
    fn dropping_a_non_empty_stack_drops_its_values() {
        let value = Arc::new(());
        let stack = PublishStack::new();
        stack.push(value.clone());
        stack.push(value.clone());
        drop(stack);
        assert_eq!(Arc::strong_count(&value), 1);
    }
}

/// One execution of the push's compare-and-swap retry under loom, for
/// `models/tests/loom_publication.rs` to explore: the drivers have one
/// producer each (and the tokio driver is not built under loom), so only a
/// model with two producers makes a CAS fail and retry. Two producers race
/// their pushes while the consumer takes: every value is taken exactly
/// once, each producer's in its push order, and the consumer's reads of the
/// nodes see the producers' writes (loom checks each `UnsafeCell` access for
/// a happens-before edge). It lives here, not among the library's unit
/// tests, so that CI's loom step builds it with the models (a loom build of
/// the library's tests builds all its test dependencies in release too).
#[cfg(kvtier_loom)]
pub fn two_producers_racing_their_pushes() {
    use crate::sync::{Arc, thread};

    let stack = Arc::new(PublishStack::new());
    let producers: Vec<_> = [[1, 2], [10, 20]]
        .into_iter()
        .map(|values| {
            let stack = stack.clone();
            thread::Builder::new()
                .spawn(move || {
                    for value in values {
                        stack.push(value);
                    }
                })
                .unwrap()
        })
        .collect();
    let mut taken = stack.take_all();
    for producer in producers {
        producer.join().unwrap();
    }
    taken.extend(stack.take_all());
    let mut values = taken.clone();
    values.sort_unstable();
    assert_eq!(values, [1, 2, 10, 20], "taken: {taken:?}");
    let at = |value| taken.iter().position(|v| *v == value).unwrap();
    assert!(at(1) < at(2) && at(10) < at(20), "taken: {taken:?}");
}
