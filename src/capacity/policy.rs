//! Eviction orders: which resident block goes first.
//!
//! An order knows the blocks the ledger lets it evict (resident ones), not
//! their state: the ledger passes an `evictable` predicate when it asks for
//! a victim, and a block it refuses (pinned) keeps its place.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// An eviction policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Policy {
    /// Least recently used first: a block read or written moves to the
    /// back of the line.
    #[default]
    Lru,
    /// S3-FIFO (Yang et al., SOSP 2023): a new block waits in a small FIFO
    /// queue (a tenth of the capacity); read again there, it moves to the
    /// main queue, otherwise it is evicted and remembered in a ghost list
    /// (a block written again while remembered goes straight to the main
    /// queue). The main queue gives each block as many second chances as
    /// it was read (up to 3). Blocks read once, as a scan reads them, leave
    /// through the small queue without displacing the main queue.
    S3Fifo,
}

impl Policy {
    /// The policy a configuration names: `"lru"` or `"s3fifo"`, exactly
    /// as [`name`](Self::name) gives them (one spelling everywhere, so an
    /// error that lists them lists every name accepted).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "lru" => Some(Self::Lru),
            "s3fifo" => Some(Self::S3Fifo),
            _ => None,
        }
    }

    /// The policy's configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::S3Fifo => "s3fifo",
        }
    }
}

/// The order of one ledger's resident blocks.
pub(super) enum Order<K> {
    Lru(Lru<K>),
    S3Fifo(S3Fifo<K>),
}

impl<K: Clone + Eq + Hash> Order<K> {
    pub(super) fn new(policy: Policy, capacity: u64) -> Self {
        match policy {
            Policy::Lru => Self::Lru(Lru::default()),
            Policy::S3Fifo => Self::S3Fifo(S3Fifo::new(capacity)),
        }
    }

    /// A block became resident (a store committed it).
    pub(super) fn insert(&mut self, key: &K, bytes: u64) {
        match self {
            Self::Lru(o) => o.insert(key, false),
            Self::S3Fifo(o) => o.insert(key, bytes, false),
        }
    }

    /// A block found at startup, older than every block inserted so far:
    /// it goes before them.
    pub(super) fn insert_cold(&mut self, key: &K, bytes: u64) {
        match self {
            Self::Lru(o) => o.insert(key, true),
            Self::S3Fifo(o) => o.insert(key, bytes, true),
        }
    }

    /// A read of a resident block.
    pub(super) fn touch(&mut self, key: &K) {
        match self {
            Self::Lru(o) => o.touch(key),
            Self::S3Fifo(o) => o.touch(key),
        }
    }

    /// The block leaves the order (lost, or evicted by the ledger).
    pub(super) fn remove(&mut self, key: &K) {
        match self {
            Self::Lru(o) => o.remove(key),
            Self::S3Fifo(o) => o.remove(key),
        }
    }

    /// The next block to evict among those `evictable` accepts, taken out
    /// of the order; `None` when none is accepted.
    pub(super) fn next_victim(&mut self, evictable: impl Fn(&K) -> bool) -> Option<K> {
        match self {
            Self::Lru(o) => o.next_victim(evictable),
            Self::S3Fifo(o) => o.next_victim(evictable),
        }
    }

    pub(super) fn set_capacity(&mut self, capacity: u64) {
        if let Self::S3Fifo(o) = self {
            o.small_target = capacity / 10;
        }
    }
}

/// Least recently used: blocks by the tick of their last use.
pub(super) struct Lru<K> {
    by_tick: BTreeMap<i64, K>,
    tick_of: HashMap<K, i64>,
    /// Ticks of uses count up from 0; blocks found at startup count down
    /// from -1, so each is older than everything before it.
    hot: i64,
    cold: i64,
}

impl<K> Default for Lru<K> {
    fn default() -> Self {
        Self {
            by_tick: BTreeMap::new(),
            tick_of: HashMap::new(),
            hot: 0,
            cold: -1,
        }
    }
}

impl<K: Clone + Eq + Hash> Lru<K> {
    fn insert(&mut self, key: &K, cold: bool) {
        self.remove(key);
        let tick = if cold {
            self.cold -= 1;
            self.cold + 1
        } else {
            self.hot += 1;
            self.hot - 1
        };
        self.by_tick.insert(tick, key.clone());
        self.tick_of.insert(key.clone(), tick);
    }

    fn touch(&mut self, key: &K) {
        if self.tick_of.contains_key(key) {
            self.insert(key, false);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(tick) = self.tick_of.remove(key) {
            self.by_tick.remove(&tick);
        }
    }

    fn next_victim(&mut self, evictable: impl Fn(&K) -> bool) -> Option<K> {
        // guard: E3-lru-evicts-the-least-recently-used
        let (&tick, key) = self.by_tick.iter().find(|(_, key)| evictable(key))?;
        let key = key.clone();
        self.by_tick.remove(&tick);
        self.tick_of.remove(&key);
        Some(key)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

struct Meta {
    queue: Queue,
    /// Which queue item is this block's: items of earlier placements are
    /// stale and skipped.
    seq: u64,
    freq: u8,
    bytes: u64,
}

/// S3-FIFO's queues. Removal from the middle leaves a stale item behind,
/// skipped when reached and swept once stale items outnumber live ones.
pub(super) struct S3Fifo<K> {
    small: VecDeque<(K, u64)>,
    main: VecDeque<(K, u64)>,
    meta: HashMap<K, Meta>,
    ghost: VecDeque<K>,
    ghosts: HashSet<K>,
    small_bytes: u64,
    /// Blocks in the small queue (the rest of `meta` is in the main one).
    small_live: usize,
    small_target: u64,
    next_seq: u64,
}

/// Reads a block is credited with at most (second chances in the main
/// queue).
const MAX_FREQ: u8 = 3;

impl<K: Clone + Eq + Hash> S3Fifo<K> {
    fn new(capacity: u64) -> Self {
        Self {
            small: VecDeque::new(),
            main: VecDeque::new(),
            meta: HashMap::new(),
            ghost: VecDeque::new(),
            ghosts: HashSet::new(),
            small_bytes: 0,
            small_live: 0,
            small_target: capacity / 10,
            next_seq: 0,
        }
    }

    fn place(&mut self, key: &K, queue: Queue, freq: u8, bytes: u64, front: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let line = match queue {
            Queue::Small => {
                self.small_bytes += bytes;
                self.small_live += 1;
                &mut self.small
            }
            Queue::Main => &mut self.main,
        };
        if front {
            line.push_front((key.clone(), seq));
        } else {
            line.push_back((key.clone(), seq));
        }
        self.meta.insert(
            key.clone(),
            Meta {
                queue,
                seq,
                freq,
                bytes,
            },
        );
    }

    fn insert(&mut self, key: &K, bytes: u64, cold: bool) {
        self.remove(key);
        if cold {
            // Found at startup: on the main queue's eviction end.
            self.place(key, Queue::Main, 0, bytes, true);
        } else if self.ghosts.remove(key) {
            // Evicted from probation recently and written again: a block
            // worth keeping.
            self.place(key, Queue::Main, 0, bytes, false);
        } else {
            self.place(key, Queue::Small, 0, bytes, false);
        }
    }

    fn touch(&mut self, key: &K) {
        if let Some(meta) = self.meta.get_mut(key) {
            meta.freq = (meta.freq + 1).min(MAX_FREQ);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(meta) = self.meta.remove(key) {
            if meta.queue == Queue::Small {
                self.small_bytes -= meta.bytes;
                self.small_live -= 1;
            }
            self.sweep();
        }
    }

    /// Drops stale items once they outnumber the live ones (and a few), so
    /// the queues stay within twice the blocks they hold.
    fn sweep(&mut self) {
        let live = self.meta.len();
        if self.small.len() + self.main.len() <= 2 * live + 64 {
            return;
        }
        let meta = &self.meta;
        let current = |(key, seq): &(K, u64)| meta.get(key).is_some_and(|m| m.seq == *seq);
        self.small.retain(current);
        self.main.retain(current);
    }

    fn remember(&mut self, key: K) {
        // The ghost list remembers about as many blocks as are resident.
        let limit = self.meta.len().max(64);
        while self.ghost.len() >= limit {
            if let Some(old) = self.ghost.pop_front() {
                self.ghosts.remove(&old);
            }
        }
        if self.ghosts.insert(key.clone()) {
            self.ghost.push_back(key);
        }
    }

    /// The live item at the head of `queue`, popped; stale items are
    /// dropped on the way.
    fn pop(&mut self, queue: Queue) -> Option<(K, u64)> {
        loop {
            let line = match queue {
                Queue::Small => &mut self.small,
                Queue::Main => &mut self.main,
            };
            let (key, seq) = line.pop_front()?;
            if self.meta.get(&key).is_some_and(|m| m.seq == seq) {
                return Some((key, seq));
            }
        }
    }

    fn next_victim(&mut self, evictable: impl Fn(&K) -> bool) -> Option<K> {
        let main_live = self.meta.len() - self.small_live;
        let small_first = self.small_bytes > self.small_target || main_live == 0;
        let order = if small_first {
            [Queue::Small, Queue::Main]
        } else {
            [Queue::Main, Queue::Small]
        };
        // A pass over the small queue may promote its blocks to the main
        // queue without evicting one: the main queue is looked at after it.
        for queue in [order[0], order[1], Queue::Main] {
            if let Some(key) = self.evict_from(queue, &evictable) {
                return Some(key);
            }
        }
        None
    }

    /// One victim from `queue`: each item is looked at a bounded number of
    /// times (a pinned block is passed over and keeps its place in line; a
    /// block read on probation moves to the main queue; one in the main
    /// queue spends a read and goes to the back).
    fn evict_from(&mut self, queue: Queue, evictable: &impl Fn(&K) -> bool) -> Option<K> {
        let items = match queue {
            Queue::Small => self.small.len(),
            Queue::Main => self.main.len(),
        };
        let mut passed = Vec::new();
        let mut found = None;
        for _ in 0..items.saturating_mul(usize::from(MAX_FREQ) + 1) {
            let Some((key, seq)) = self.pop(queue) else {
                break;
            };
            if !evictable(&key) {
                passed.push((key, seq));
                continue;
            }
            let meta = self.meta.get_mut(&key).expect("a live item has its meta");
            // guard: E9-s3fifo-gives-read-blocks-another-chance
            if meta.freq == 0 {
                found = Some(key);
                break;
            }
            let bytes = meta.bytes;
            match queue {
                Queue::Small => {
                    // Read on probation: promoted, its reads spent.
                    self.small_bytes -= bytes;
                    self.small_live -= 1;
                    self.meta.remove(&key);
                    self.place(&key, Queue::Main, 0, bytes, false);
                }
                Queue::Main => {
                    meta.freq -= 1;
                    self.main.push_back((key, seq));
                }
            }
        }
        // Passed-over blocks go back to the head, in their order.
        let line = match queue {
            Queue::Small => &mut self.small,
            Queue::Main => &mut self.main,
        };
        for item in passed.into_iter().rev() {
            line.push_front(item);
        }
        let key = found?;
        let meta = self.meta.remove(&key).expect("a live item has its meta");
        if meta.queue == Queue::Small {
            self.small_bytes -= meta.bytes;
            self.small_live -= 1;
            self.remember(key.clone());
        }
        self.sweep();
        Some(key)
    }
}
