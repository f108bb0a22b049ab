//! The scheduler side every lookup driver shares: the table, and the one
//! path by which workers' answers reach it.
//!
//! Both [`AsyncLookup`](crate::AsyncLookup) (a worker thread, groups in
//! FIFO order) and [`TokioLookup`](crate::TokioLookup) (groups as concurrent
//! async tasks) own a [`Front`]. Workers push each finished group onto the
//! front's [`PublishStack`]; every scheduler call first applies what was
//! pushed. So publication, generation checks and stale-result filtering are
//! one piece of code whichever way the groups were probed.

use std::hash::Hash;

use super::stats::Stats;
use super::submission::{GroupOutcome, GroupResult, Submission};
use super::table::LookupTable;
use super::types::{Request, Ticket, Verdict};
use crate::publish::PublishStack;
use crate::sync::Arc;

/// A finished group on its way from a worker to the scheduler.
pub(crate) type Published<K> = PublishStack<GroupResult<K>>;

pub(crate) struct Front<K, R: Request> {
    table: LookupTable<K, R>,
    published: Arc<Published<K>>,
}

impl<K, R> Front<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    pub(crate) fn new() -> Self {
        Self {
            table: LookupTable::new(),
            published: Arc::new(PublishStack::new()),
        }
    }

    /// The stack workers publish to.
    pub(crate) fn publisher(&self) -> Arc<Published<K>> {
        self.published.clone()
    }

    /// The scheduler's only contact with the workers' answers.
    #[inline]
    pub(crate) fn apply_published(&mut self) -> usize {
        // L5: one atomic load when nothing was published.
        if self.published.is_empty() {
            return 0;
        }
        self.apply_all()
    }

    #[inline(never)]
    fn apply_all(&mut self) -> usize {
        let results = self.published.take_all();
        let applied = results.len();
        for result in results {
            self.table.apply(result);
        }
        applied
    }

    #[inline(always)]
    pub(crate) fn lookup(&mut self, key: &K, request: &R) -> Verdict<K> {
        self.apply_published();
        self.table.lookup(key, request)
    }

    pub(crate) fn take_submission(&mut self) -> Option<Submission<K, R>> {
        self.apply_published();
        self.table.take_submission()
    }

    pub(crate) fn mark_miss(&mut self, ticket: &Ticket<K>) -> bool {
        self.apply_published();
        self.table.mark_miss(ticket)
    }

    pub(crate) fn mark_miss_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> usize
    where
        K: 'k,
    {
        self.apply_published();
        self.table.mark_miss_keys(keys)
    }

    pub(crate) fn cleanup(&mut self, id: &R::Id) {
        self.apply_published();
        self.table.cleanup(id);
    }

    pub(crate) fn record_applied(&mut self, on: bool) {
        self.table.record_applied(on);
    }

    pub(crate) fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.table.take_applied()
    }

    pub(crate) fn stats(&self) -> Stats {
        self.table.stats()
    }
}

impl<K, R: Request> Front<K, R> {
    pub(crate) fn table(&self) -> &LookupTable<K, R> {
        &self.table
    }
}
