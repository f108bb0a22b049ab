//! The fleet's books as a short sequential specification: the state one
//! bucket prefix's books hold in Valkey, and what each [`Op`] does to it,
//! with the server's clock an argument. models/tests/fleet_differential.rs
//! runs the real script (src/tier/fleet/books.lua) on a real Valkey against
//! it; models/tests/fleet_model.rs explores hosts, crashes, lease expiry,
//! the object store beside the books and epochs with it.
//!
//! The rules, each a guard of the script:
//! - committed plus held bytes never exceed the capacity (reserve grants
//!   only what fits; victims stay held until their object is deleted);
//! - a victim is committed and has no live pin;
//! - a commit is refused once its reservation's lease ended or another
//!   holder claimed it;
//! - a held entry keeps its bytes until its holder releases it: a dead
//!   holder's entry is claimed by a sweeper after its lease, which deletes
//!   the object and releases it;
//! - every step but the rebuild's and `status` answers `Epoch` to a caller
//!   of another epoch, `Lost` when there are no books, and `Rebuilding`
//!   while a rebuild is under way.

use std::collections::BTreeMap;

use kvtier::tier::fleet::{BooksStatus, HeldKind, Op, Reply};

/// A held entry: a reservation or an eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub kind: HeldKind,
    pub bytes: u64,
    pub token: String,
    pub deadline: u64,
}

/// One namespace's books (`None`: lost, or never made).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetReference {
    pub books: Option<Books>,
    /// The rebuild lock: holder and expiry (it outlives the books, as a
    /// key of its own does).
    pub lock: Option<(String, u64)>,
}

/// The books' contents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Books {
    pub ready: bool,
    pub epoch: String,
    pub capacity: u64,
    pub committed: u64,
    pub held_bytes: u64,
    pub tick: u64,
    /// Committed blocks: bytes and recency tick.
    pub blocks: BTreeMap<String, (u64, u64)>,
    pub held: BTreeMap<String, Held>,
    /// Pins per key: token -> deadline.
    pub pins: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Books {
    fn touch(&mut self, key: &str) {
        self.tick += 1;
        if let Some(block) = self.blocks.get_mut(key) {
            block.1 = self.tick;
        }
    }

    fn pinned(&self, key: &str, now: u64) -> bool {
        self.pins
            .get(key)
            .is_some_and(|pins| pins.values().any(|deadline| *deadline > now))
    }

    fn live_pins(&mut self, key: &str, now: u64) -> BTreeMap<String, u64> {
        let pins = self.pins.remove(key).unwrap_or_default();
        pins.into_iter()
            .filter(|(_, deadline)| *deadline > now)
            .collect()
    }

    fn write_pins(&mut self, key: &str, pins: BTreeMap<String, u64>) {
        if !pins.is_empty() {
            self.pins.insert(key.to_string(), pins);
        }
    }

    /// Least recent first, unpinned; `None` if they cannot free `needed`.
    fn choose(&self, needed: u64, now: u64) -> Option<Vec<(String, u64)>> {
        let mut order: Vec<(&String, &(u64, u64))> = self.blocks.iter().collect();
        order.sort_by_key(|(key, (_, tick))| (*tick, (*key).clone()));
        let mut chosen = Vec::new();
        let mut freed = 0;
        for (key, (bytes, _)) in order {
            if freed >= needed {
                break;
            }
            if !self.pinned(key, now) {
                chosen.push((key.clone(), *bytes));
                freed += bytes;
            }
        }
        (freed >= needed).then_some(chosen)
    }

    fn evict(&mut self, victims: Vec<(String, u64)>, token: &str, deadline: u64) -> Reply {
        for (key, bytes) in &victims {
            self.blocks.remove(key);
            self.pins.remove(key);
            self.committed -= bytes;
            self.held_bytes += bytes;
            self.held.insert(
                key.clone(),
                Held {
                    kind: HeldKind::Evicting,
                    bytes: *bytes,
                    token: token.to_string(),
                    deadline,
                },
            );
        }
        Reply::Evict(victims)
    }

    fn unhold(&mut self, key: &str) {
        if let Some(held) = self.held.remove(key) {
            self.held_bytes -= held.bytes;
        }
    }
}

impl FleetReference {
    /// What the script answers to `op` from a caller of `epoch`, the
    /// server's clock reading `now` (milliseconds).
    pub fn apply(&mut self, epoch: &str, op: &Op, now: u64) -> Reply {
        match op {
            Op::Status => {
                return match &self.books {
                    None => Reply::Lost,
                    Some(books) => Reply::Status(BooksStatus {
                        ready: books.ready,
                        epoch: books.epoch.clone(),
                        capacity: books.capacity,
                        committed: books.committed,
                        held: books.held_bytes,
                        blocks: books.blocks.len() as u64,
                        held_entries: books.held.len() as u64,
                    }),
                };
            }
            Op::BeginRebuild {
                holder,
                lease_ms,
                epoch,
                capacity,
            } => {
                if let Some(books) = self.books.as_ref().filter(|books| books.ready) {
                    return Reply::Ready(books.epoch.clone());
                }
                if self.lock.as_ref().is_some_and(|(_, expiry)| *expiry > now) {
                    return Reply::Rebuilding;
                }
                self.lock = Some((holder.clone(), now + (*lease_ms).max(1)));
                self.books = Some(Books {
                    epoch: epoch.clone(),
                    capacity: *capacity,
                    ..Books::default()
                });
                return Reply::Rebuild(epoch.clone());
            }
            _ => {}
        }
        let lock_holder = self
            .lock
            .as_ref()
            .filter(|(_, expiry)| *expiry > now)
            .map(|(holder, _)| holder.clone());
        let Some(books) = self.books.as_mut() else {
            return Reply::Lost;
        };
        if books.epoch != epoch {
            return Reply::Epoch(books.epoch.clone());
        }
        match op {
            Op::RebuildAdd { holder, blocks } => {
                if books.ready || lock_holder.as_ref() != Some(holder) {
                    return Reply::NotHolder;
                }
                let mut left = Vec::new();
                for (key, bytes) in blocks {
                    if books.blocks.contains_key(key) {
                        continue;
                    }
                    if books.committed + bytes <= books.capacity {
                        books.blocks.insert(key.clone(), (*bytes, 0));
                        books.committed += bytes;
                        books.touch(key);
                    } else {
                        left.push(key.clone());
                    }
                }
                return Reply::Added(left);
            }
            Op::RebuildEnd { holder } => {
                if books.ready || lock_holder.as_ref() != Some(holder) {
                    return Reply::NotHolder;
                }
                books.ready = true;
                self.lock = None;
                return Reply::Ready(books.epoch.clone());
            }
            _ => {}
        }
        if !books.ready {
            return Reply::Rebuilding;
        }
        match op {
            Op::Lookup { keys } => Reply::Verdicts(
                keys.iter()
                    .map(|key| books.blocks.contains_key(key))
                    .collect(),
            ),
            Op::Unlisted { keys } => Reply::Verdicts(
                keys.iter()
                    .map(|key| !books.blocks.contains_key(key) && !books.held.contains_key(key))
                    .collect(),
            ),
            Op::Touch { keys } => {
                let mut touched = 0;
                for key in keys {
                    if books.blocks.contains_key(key) {
                        books.touch(key);
                        touched += 1;
                    }
                }
                Reply::Touched(touched)
            }
            Op::Reserve {
                key,
                bytes,
                token,
                lease_ms,
            } => {
                if *bytes > books.capacity {
                    return Reply::TooLarge;
                }
                if books.blocks.contains_key(key) {
                    books.touch(key);
                    return Reply::Present;
                }
                if books.held.contains_key(key) {
                    return Reply::Busy;
                }
                let used = books.committed + books.held_bytes;
                if used + bytes <= books.capacity {
                    books.held.insert(
                        key.clone(),
                        Held {
                            kind: HeldKind::Reserved,
                            bytes: *bytes,
                            token: token.clone(),
                            deadline: now + lease_ms,
                        },
                    );
                    books.held_bytes += bytes;
                    return Reply::Granted;
                }
                match books.choose(used + bytes - books.capacity, now) {
                    None => Reply::NoRoom,
                    Some(victims) => books.evict(victims, token, now + lease_ms),
                }
            }
            Op::Commit { key, token } => {
                let live = books.held.get(key).is_some_and(|held| {
                    held.kind == HeldKind::Reserved && held.token == *token && held.deadline > now
                });
                if !live {
                    return Reply::Refused;
                }
                let bytes = books.held[key].bytes;
                books.unhold(key);
                books.blocks.insert(key.clone(), (bytes, 0));
                books.committed += bytes;
                books.touch(key);
                Reply::Committed
            }
            Op::Release { token, keys } => {
                let mut released = 0;
                for key in keys {
                    if books.held.get(key).is_some_and(|held| held.token == *token) {
                        books.unhold(key);
                        released += 1;
                    }
                }
                Reply::Released(released)
            }
            Op::Renew {
                token,
                lease_ms,
                keys,
            } => {
                let deadline = now + lease_ms;
                let mut renewed = 0;
                for key in keys {
                    if let Some(held) = books.held.get_mut(key)
                        && held.token == *token
                        && held.deadline > now
                    {
                        held.deadline = deadline;
                        renewed += 1;
                    }
                    let live = books
                        .pins
                        .get(key)
                        .and_then(|pins| pins.get(token))
                        .is_some_and(|pin| *pin > now);
                    if live {
                        let mut pins = books.live_pins(key, now);
                        pins.insert(token.clone(), deadline);
                        books.write_pins(key, pins);
                        renewed += 1;
                    }
                }
                Reply::Renewed(renewed)
            }
            Op::Pin {
                key,
                token,
                lease_ms,
            } => {
                if !books.blocks.contains_key(key) {
                    return Reply::Miss;
                }
                let mut pins = books.live_pins(key, now);
                pins.insert(token.clone(), now + lease_ms);
                books.write_pins(key, pins);
                books.touch(key);
                Reply::Pinned
            }
            Op::Unpin { key, token } => {
                let mut pins = books.live_pins(key, now);
                let had = pins.remove(token).is_some();
                books.write_pins(key, pins);
                Reply::Unpinned(had)
            }
            Op::Forget { key } => match books.blocks.remove(key) {
                None => Reply::Unknown,
                Some((bytes, _)) => {
                    books.pins.remove(key);
                    books.committed -= bytes;
                    Reply::Forgotten
                }
            },
            Op::ClaimExpired {
                token,
                lease_ms,
                limit,
            } => {
                let mut expired: Vec<(u64, String)> = books
                    .held
                    .iter()
                    .filter(|(_, held)| held.deadline <= now)
                    .map(|(key, held)| (held.deadline, key.clone()))
                    .collect();
                expired.sort();
                let mut claimed = Vec::new();
                for (_, key) in expired.into_iter().take(*limit as usize) {
                    let held = books.held.get_mut(&key).expect("listed above");
                    held.token = token.clone();
                    held.deadline = now + lease_ms;
                    claimed.push((key, held.kind, held.bytes));
                }
                Reply::Claimed(claimed)
            }
            Op::SetCapacity {
                capacity,
                token,
                lease_ms,
            } => {
                books.capacity = *capacity;
                let used = books.committed + books.held_bytes;
                if used <= *capacity {
                    return Reply::Evict(Vec::new());
                }
                let victims = books.choose(used - capacity, now).unwrap_or_else(|| {
                    let mut all: Vec<(u64, String, u64)> = books
                        .blocks
                        .iter()
                        .filter(|(key, _)| !books.pinned(key, now))
                        .map(|(key, (bytes, tick))| (*tick, key.clone(), *bytes))
                        .collect();
                    all.sort();
                    all.into_iter()
                        .map(|(_, key, bytes)| (key, bytes))
                        .collect()
                });
                books.evict(victims, token, now + lease_ms)
            }
            Op::Status
            | Op::BeginRebuild { .. }
            | Op::RebuildAdd { .. }
            | Op::RebuildEnd { .. } => unreachable!("answered above"),
        }
    }
}
