//! How the ledger keeps its running tasks: in id order, in a vector.
//!
//! Ids are handed out in ascending order, so a new task goes at the end
//! of a sorted vector (no tree to rebalance, no node to allocate), one is
//! found by binary search, and a closed one leaves a hole that a later
//! pass squeezes out once holes are half the vector. A poll walks the
//! vector in id order, as the model checkers need to replay it.
//!
//! Most tasks read one request's blocks and most requests have one task
//! running, so both lists hold a single element inline ([`OneOrMany`]):
//! no allocation per task or per request in the usual case.

use super::task::TaskId;

/// A list that holds one element without allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OneOrMany<X> {
    One(X),
    Many(Vec<X>),
}

impl<X: PartialEq> OneOrMany<X> {
    pub(crate) fn as_slice(&self) -> &[X] {
        match self {
            Self::One(x) => std::slice::from_ref(x),
            Self::Many(xs) => xs,
        }
    }

    pub(crate) fn contains(&self, x: &X) -> bool {
        self.as_slice().contains(x)
    }

    pub(crate) fn push(&mut self, x: X) {
        match self {
            Self::Many(xs) => xs.push(x),
            Self::One(_) => {
                if let Self::One(first) = std::mem::replace(self, Self::Many(Vec::new())) {
                    *self = Self::Many(vec![first, x]);
                }
            }
        }
    }

    /// Removes every `x`; returns whether the list is empty afterwards
    /// (a `One` holding `x` is, and the caller drops it).
    pub(crate) fn remove(&mut self, x: &X) -> bool {
        match self {
            Self::One(only) => only == x,
            Self::Many(xs) => {
                xs.retain(|other| other != x);
                xs.is_empty()
            }
        }
    }
}

/// Running tasks by id, ascending; `None` marks a closed one not squeezed
/// out yet.
#[derive(Debug)]
pub(crate) struct Running<V> {
    entries: Vec<(TaskId, Option<V>)>,
    holes: usize,
}

impl<V> Default for Running<V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            holes: 0,
        }
    }
}

impl<V> Running<V> {
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.holes
    }

    /// Adds a task whose id is above every id added before.
    pub(crate) fn push(&mut self, id: TaskId, value: V) {
        debug_assert!(self.entries.last().is_none_or(|(last, _)| *last < id));
        self.entries.push((id, Some(value)));
    }

    /// Where task `id` is, if it is running. `hint` is where it was seen
    /// last (by [`iter_mut`](Self::iter_mut)): right unless the vector
    /// was squeezed since, and then the search finds it.
    fn position(&self, id: TaskId, hint: Option<usize>) -> Option<usize> {
        let at = match hint {
            Some(at) if self.entries.get(at).is_some_and(|(at_id, _)| *at_id == id) => at,
            _ => self.entries.binary_search_by_key(&id, |(id, _)| *id).ok()?,
        };
        self.entries[at].1.is_some().then_some(at)
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<&V> {
        self.position(id, None)
            .and_then(|at| self.entries[at].1.as_ref())
    }

    #[cfg(test)]
    pub(crate) fn get_mut(&mut self, id: TaskId) -> Option<&mut V> {
        let at = self.position(id, None)?;
        self.entries[at].1.as_mut()
    }

    /// Takes task `id` out, if it is running (`hint`: see `position`).
    pub(crate) fn remove(&mut self, id: TaskId, hint: Option<usize>) -> Option<V> {
        let at = self.position(id, hint)?;
        let value = self.entries[at].1.take();
        self.holes += 1;
        // guard: S12-closed-tasks-are-squeezed-out
        if self.holes * 2 > self.entries.len() {
            self.entries.retain(|(_, value)| value.is_some());
            self.holes = 0;
            if self.entries.capacity() > 64 && self.entries.len() * 4 < self.entries.capacity() {
                self.entries.shrink_to(self.entries.len() * 2);
            }
        }
        value
    }

    /// Puts back task `id`, taken out by [`remove`](Self::remove) and not
    /// closed after all (its wait was interrupted), where its id belongs.
    pub(crate) fn restore(&mut self, id: TaskId, value: V) {
        match self.entries.binary_search_by_key(&id, |(id, _)| *id) {
            Ok(at) => {
                debug_assert!(self.entries[at].1.is_none(), "{id} restored while running");
                self.entries[at].1 = Some(value);
                self.holes -= 1;
            }
            Err(at) => self.entries.insert(at, (id, Some(value))),
        }
    }

    /// Every running task, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TaskId, &V)> {
        self.entries
            .iter()
            .filter_map(|(id, value)| Some((*id, value.as_ref()?)))
    }

    /// Every running task, ascending, with where it is (a hint for
    /// [`remove`](Self::remove)).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (TaskId, usize, &mut V)> {
        self.entries
            .iter_mut()
            .enumerate()
            .filter_map(|(at, (id, value))| Some((*id, at, value.as_mut()?)))
    }

    /// Slots held, running or not (for the memory check).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_come_out_in_id_order_and_holes_are_squeezed_out() {
        let mut running = Running::default();
        for id in 0..100 {
            running.push(TaskId(id), id * 10);
        }
        for id in (0..100).filter(|id| id % 3 != 0) {
            // A stale hint (the vector was squeezed) is only a hint.
            let hint = Some(id as usize);
            assert_eq!(running.remove(TaskId(id), hint), Some(id * 10));
            assert_eq!(running.remove(TaskId(id), hint), None, "closed once");
        }
        assert_eq!(running.len(), 34);
        assert!(running.slots() < 2 * 34 + 2, "{} slots", running.slots());
        let ids: Vec<u64> = running.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, (0..100).filter(|id| id % 3 == 0).collect::<Vec<_>>());
        assert_eq!(running.get(TaskId(3)), Some(&30));
        assert_eq!(running.get(TaskId(4)), None);
        running.push(TaskId(100), 1000);
        assert_eq!(running.iter().last(), Some((TaskId(100), &1000)));
    }

    #[test]
    fn one_or_many_holds_one_inline_and_grows() {
        let mut list = OneOrMany::One(1);
        assert!(list.contains(&1) && !list.contains(&2));
        list.push(2);
        list.push(3);
        assert_eq!(list.as_slice(), [1, 2, 3]);
        assert!(!list.remove(&2));
        assert_eq!(list.as_slice(), [1, 3]);
        assert!(!list.remove(&1));
        assert!(list.remove(&3), "empty");
        assert!(OneOrMany::One(5).remove(&5));
        assert!(!OneOrMany::One(5).remove(&6));
    }
}
