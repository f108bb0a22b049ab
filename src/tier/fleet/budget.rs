//! A host's side of the fleet's books: the steps a tier takes around its
//! object store's requests (room before a put, a commit after it, a pin
//! around a get, lookups), the leases it holds and renews, the hits it
//! touches in batches, the expired entries it sweeps and the rebuild it
//! runs when the books are lost. docs/design.md, "The fleet's books in
//! Valkey".

use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::books::{FleetBooks, FleetError, IndexTimeouts};
use super::ops::{Op, Reply};
use crate::capacity::FleetHost;
use crate::capacity::Rejection;
use crate::sync::{Arc, Mutex};
use crate::tier::error::TierError;

/// How many times a store asks for room, deleting victims in between.
const ADMIT_ROUNDS: usize = 8;

/// What a store got from the books.
#[derive(Debug)]
pub enum Admission {
    /// The block is committed already: nothing to write.
    Present,
    /// Room is reserved: write the object, then [`FleetWrite::commit`].
    Write(FleetWrite),
}

/// This host's connection to one prefix's books.
#[derive(Clone, Debug)]
pub struct FleetBudget {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) books: FleetBooks,
    /// This host's token: its reservations, evictions and pins.
    pub(super) token: String,
    pub(super) capacity: u64,
    pub(super) lease: Duration,
    /// The books' epoch as this host knows it (`None`: lost or never
    /// attached: steps answer misses and refuse stores).
    pub(super) epoch: Mutex<Option<String>>,
    /// Its holds (renewed by [`FleetBudget::maintain`]), the hits it has
    /// not touched yet and the changes it made.
    pub(super) host: FleetHost,
    /// The books' state as the last [`FleetBudget::maintain`] read it.
    pub(super) last_status: Mutex<Option<super::ops::BooksStatus>>,
}

/// A reservation: commit it once the object is written.
#[derive(Debug)]
pub struct FleetWrite {
    budget: FleetBudget,
    key: String,
    bytes: u64,
    /// The books the room was reserved in.
    epoch: Option<String>,
    done: bool,
}

/// A read's pin: release it once the object is read.
#[derive(Debug)]
pub struct FleetPin {
    budget: FleetBudget,
    key: String,
    done: bool,
}

pub(crate) fn index_error(op: &'static str, error: FleetError) -> TierError {
    TierError::Index {
        op,
        detail: error.to_string(),
    }
}

fn no_room(key: &str, bytes: u64, capacity: u64, reason: Rejection) -> TierError {
    TierError::NoRoom {
        path: key.to_string(),
        bytes,
        capacity,
        reason,
    }
}

impl FleetBudget {
    /// This host's side of `books`, for blocks under a budget of
    /// `capacity` bytes (used when this host makes the books), with leases
    /// of `lease`. Attaches at once when the books are ready; otherwise
    /// [`maintain`](Self::maintain) rebuilds or waits for them.
    pub async fn open(books: FleetBooks, capacity: u64, lease: Duration) -> Self {
        let token = format!("h{:016x}", crate::sync::unique_id() ^ random_bits());
        let budget = Self {
            inner: Arc::new(Inner {
                books,
                token,
                capacity,
                lease,
                epoch: Mutex::new(None),
                host: FleetHost::new(),
                last_status: Mutex::new(None),
            }),
        };
        let _ = budget.attach().await;
        budget
    }

    /// Connects to the books of `namespace` at `index` (an unreachable
    /// index is an error) and opens this host's side of them, as
    /// [`open`](Self::open) does.
    pub async fn connect(
        index: &crate::settings::IndexConfig,
        namespace: &str,
        capacity: u64,
    ) -> Result<Self, TierError> {
        let books = FleetBooks::connect(index.url(), namespace, IndexTimeouts::default())
            .await
            .map_err(|error| index_error("connect", error))?;
        Ok(Self::open(books, capacity, index.lease()).await)
    }

    pub(super) fn lease_ms(&self) -> u64 {
        u64::try_from(self.inner.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// The epoch this host works under, if the books are ready.
    pub fn epoch(&self) -> Option<String> {
        self.inner.epoch.lock().clone()
    }

    /// Learns the books' state: ready (adopts their epoch), or not.
    pub(super) async fn attach(&self) -> Result<Reply, TierError> {
        let reply = self
            .inner
            .books
            .call("", &Op::Status)
            .await
            .map_err(|error| index_error("status", error))?;
        let epoch = match &reply {
            Reply::Status(status) if status.ready => Some(status.epoch.clone()),
            _ => None,
        };
        self.adopt(epoch);
        *self.inner.last_status.lock() = match &reply {
            Reply::Status(status) => Some(status.clone()),
            _ => None,
        };
        Ok(reply)
    }

    /// The books' state as the last upkeep ([`maintain`](Self::maintain))
    /// read it, without asking the server: for figures read every
    /// scheduler step. `None` before the first, or when they were lost.
    pub fn last_status(&self) -> Option<super::ops::BooksStatus> {
        self.inner.last_status.lock().clone()
    }

    pub(super) fn adopt(&self, epoch: Option<String>) {
        let mut current = self.inner.epoch.lock();
        if *current != epoch {
            // Entries of other books are void: stop renewing them.
            self.inner.host.clear_holds();
            *current = epoch;
        }
    }

    /// Runs `op` under this host's epoch. Another epoch, lost books or a
    /// rebuild are errors (the caller answers a miss or refuses a store),
    /// and the epoch is learned again.
    pub(super) async fn step(&self, op: &Op) -> Result<Reply, TierError> {
        let Some(epoch) = self.epoch() else {
            return Err(TierError::Index {
                op: op.name(),
                detail: "the books are not ready (lost or being rebuilt)".into(),
            });
        };
        let reply = self
            .inner
            .books
            .call(&epoch, op)
            .await
            .map_err(|error| index_error(op.name(), error))?;
        match reply {
            Reply::Epoch(new) => {
                self.adopt(Some(new));
                Err(TierError::Index {
                    op: op.name(),
                    detail: "the books were rebuilt".into(),
                })
            }
            Reply::Lost | Reply::Rebuilding => {
                self.adopt(None);
                Err(TierError::Index {
                    op: op.name(),
                    detail: "the books are lost or being rebuilt".into(),
                })
            }
            reply => Ok(reply),
        }
    }

    /// The books' state: capacity, committed and held bytes, entries.
    pub async fn status(&self) -> Result<super::ops::BooksStatus, TierError> {
        match self.inner.books.call("", &Op::Status).await {
            Ok(Reply::Status(status)) => Ok(status),
            Ok(other) => Err(unexpected("status", &other)),
            Err(error) => Err(index_error("status", error)),
        }
    }

    /// One verdict per location: committed in the books (one round trip).
    pub async fn lookup(&self, locations: &[ObjectPath]) -> Result<Vec<bool>, TierError> {
        let keys = locations.iter().map(ToString::to_string).collect();
        match self.step(&Op::Lookup { keys }).await? {
            Reply::Verdicts(verdicts) => Ok(verdicts),
            other => Err(unexpected("lookup", &other)),
        }
    }

    /// Notes hits to touch at the next [`maintain`](Self::maintain).
    pub fn note_hits(&self, locations: impl IntoIterator<Item = ObjectPath>) {
        let keys = locations.into_iter().map(|location| location.to_string());
        self.inner.host.note_hits(keys);
    }

    /// Room for `bytes` at `location`: the books' answer, after deleting
    /// the victims they name (each released once its object is gone).
    pub async fn admit(
        &self,
        store: &dyn ObjectStore,
        location: &ObjectPath,
        bytes: u64,
    ) -> Result<Admission, TierError> {
        let key = location.to_string();
        let capacity = self.inner.capacity;
        for _ in 0..ADMIT_ROUNDS {
            let op = Op::Reserve {
                key: key.clone(),
                bytes,
                token: self.inner.token.clone(),
                lease_ms: self.lease_ms(),
            };
            let epoch = self.epoch();
            match self.step(&op).await? {
                Reply::Granted => {
                    self.hold(&key);
                    return Ok(Admission::Write(FleetWrite {
                        budget: self.clone(),
                        key,
                        bytes,
                        epoch,
                        done: false,
                    }));
                }
                Reply::Present => return Ok(Admission::Present),
                Reply::Busy => return Err(no_room(&key, bytes, capacity, Rejection::Busy)),
                Reply::NoRoom => return Err(no_room(&key, bytes, capacity, Rejection::NoRoom)),
                Reply::TooLarge => {
                    return Err(no_room(&key, bytes, capacity, Rejection::TooLarge));
                }
                Reply::Evict(victims) => {
                    let keys: Vec<String> = victims.into_iter().map(|(key, _)| key).collect();
                    for victim in &keys {
                        self.hold(victim);
                    }
                    // A victim whose object cannot be deleted stays held:
                    // its lease ends and a sweeper settles it.
                    let deleted = self.delete_in_epoch(store, &keys, &epoch).await;
                    self.note_gone(&deleted);
                    // guard: G12-only-deleted-victims-are-released
                    self.release(&deleted).await?;
                    if deleted.len() < keys.len() {
                        return Err(TierError::Index {
                            op: "evict",
                            detail: format!(
                                "{} of {} victims could not be deleted",
                                keys.len() - deleted.len(),
                                keys.len()
                            ),
                        });
                    }
                }
                other => return Err(unexpected("reserve", &other)),
            }
        }
        Err(no_room(&key, bytes, capacity, Rejection::Busy))
    }

    /// Deletes the objects of `keys` (victims or expired entries the books
    /// of `epoch` named) while this host knows no other books: once it has
    /// seen them replaced, the new books may count those objects (a
    /// rebuild listed them), and the rest are left alone. Returns those
    /// deleted.
    pub(super) async fn delete_in_epoch(
        &self,
        store: &dyn ObjectStore,
        keys: &[String],
        epoch: &Option<String>,
    ) -> Vec<String> {
        let mut deleted = Vec::new();
        for key in keys {
            if self.epoch() != *epoch {
                break;
            }
            deleted.extend(delete_objects(store, std::slice::from_ref(key)).await);
        }
        deleted
    }

    /// Pins the block at `location` for a read: `None` when the books do
    /// not hold it.
    pub async fn pin(&self, location: &ObjectPath) -> Result<Option<FleetPin>, TierError> {
        let key = location.to_string();
        let op = Op::Pin {
            key: key.clone(),
            token: self.inner.token.clone(),
            lease_ms: self.lease_ms(),
        };
        // Pins of one key by this host share its token: the first takes
        // the books' pin, the last lets go of it.
        match self.step(&op).await? {
            Reply::Pinned => {
                self.hold(&key);
                Ok(Some(FleetPin {
                    budget: self.clone(),
                    key,
                    done: false,
                }))
            }
            Reply::Miss => Ok(None),
            other => Err(unexpected("pin", &other)),
        }
    }

    /// A new capacity for the whole fleet: the books evict what no longer
    /// fits (as many unpinned blocks as need be), this host deletes their
    /// objects and releases them. Returns how many were deleted.
    pub async fn set_capacity(
        &self,
        store: &dyn ObjectStore,
        capacity: u64,
    ) -> Result<usize, TierError> {
        let op = Op::SetCapacity {
            capacity,
            token: self.inner.token.clone(),
            lease_ms: self.lease_ms(),
        };
        match self.step(&op).await? {
            Reply::Evict(victims) => {
                let keys: Vec<String> = victims.into_iter().map(|(key, _)| key).collect();
                for key in &keys {
                    self.hold(key);
                }
                let deleted = delete_objects(store, &keys).await;
                self.note_gone(&deleted);
                self.release(&deleted).await?;
                Ok(deleted.len())
            }
            other => Err(unexpected("set_capacity", &other)),
        }
    }

    /// The object at `location` was found missing: it leaves the books.
    pub async fn forget(&self, location: &ObjectPath) -> Result<(), TierError> {
        let key = location.to_string();
        self.note_gone(std::slice::from_ref(&key));
        self.step(&Op::Forget { key }).await.map(drop)
    }

    /// Starts (or stops) logging the blocks this host commits and those it
    /// takes out of the books (victims and expired evictions deleted,
    /// objects found missing), for [`take_changes`](Self::take_changes).
    pub fn record_changes(&self, on: bool) {
        self.inner.host.record_changes(on);
    }

    /// Moves the changes logged since the last call into `into`, oldest
    /// first: `true` for a block committed, `false` for one gone. Blocks
    /// other hosts add or evict are not in it (their lookups and loads
    /// learn of them from the books).
    pub fn take_changes(&self, into: &mut Vec<(ObjectPath, bool)>) {
        let mut keys = Vec::new();
        self.inner.host.take_changes(&mut keys);
        into.extend(
            keys.into_iter()
                .map(|(key, present)| (ObjectPath::from(key), present)),
        );
    }

    pub(super) fn note_gone(&self, keys: &[String]) {
        self.inner
            .host
            .note_changes(keys.iter().map(String::as_str), false);
    }

    pub(super) fn hold(&self, key: &str) {
        self.inner.host.hold(key);
    }

    /// Drops one hold of `key`; true when it was the last.
    pub(super) fn unhold(&self, key: &str) -> bool {
        self.inner.host.unhold(key)
    }

    pub(super) async fn release(&self, keys: &[String]) -> Result<(), TierError> {
        if keys.is_empty() {
            return Ok(());
        }
        for key in keys {
            self.unhold(key);
        }
        let op = Op::Release {
            token: self.inner.token.clone(),
            keys: keys.to_vec(),
        };
        self.step(&op).await.map(drop)
    }
}

impl FleetBudget {
    /// Learns the books' epoch when this host has none (they were lost).
    async fn attach_if_lost(&self) -> Result<(), TierError> {
        if self.epoch().is_none() {
            self.attach().await?;
        }
        Ok(())
    }

    /// An object written under books that were lost since: admitted again
    /// in the books there are now. Present (the rebuild listed it, or
    /// another host wrote it): kept. Room: committed if the object is still
    /// there (held now, nobody else deletes it; an eviction in the rebuilt
    /// books may have taken it meanwhile: then the room goes back). Another
    /// holder writing it: left to that holder (the same bytes). No room:
    /// deleted again.
    async fn readmit(
        &self,
        store: &dyn ObjectStore,
        key: &str,
        bytes: u64,
    ) -> Result<(), TierError> {
        let location = ObjectPath::from(key);
        let gone = || TierError::Index {
            op: "commit",
            detail: format!("{key} was evicted while its books were rebuilt"),
        };
        // Gone already (evicted in the rebuilt books): no room to make.
        // guard: G21-a-readmitted-write-needs-its-object
        if store.head(&location).await.is_err() {
            return Err(gone());
        }
        let refused = match self.admit(store, &location, bytes).await {
            Ok(Admission::Present) => {
                self.inner.host.note_changes([key], true);
                return Ok(());
            }
            Ok(Admission::Write(write)) => {
                return match store.head(&location).await {
                    Ok(_) => Box::pin(write.commit(store)).await,
                    Err(_) => {
                        write.abort().await?;
                        Err(gone())
                    }
                };
            }
            Err(TierError::NoRoom {
                reason: Rejection::Busy,
                ..
            }) => return Ok(()),
            Err(error) => error,
        };
        delete_objects(store, &[key.to_string()]).await;
        Err(refused)
    }
}

impl FleetWrite {
    /// The object is written: the block becomes committed. A commit the
    /// books refuse (the lease ended and a sweeper claimed it) deletes the
    /// object again and is an error.
    pub async fn commit(mut self, store: &dyn ObjectStore) -> Result<(), TierError> {
        self.done = true;
        let budget = self.budget.clone();
        budget.unhold(&self.key);
        let _ = budget.attach_if_lost().await;
        if budget.epoch() != self.epoch {
            // The books were lost and rebuilt while the object was written:
            // its reservation is gone with them.
            // guard: G19-a-write-of-lost-books-is-admitted-again
            return budget.readmit(store, &self.key, self.bytes).await;
        }
        let op = Op::Commit {
            key: self.key.clone(),
            token: budget.inner.token.clone(),
        };
        match budget.step(&op).await {
            Ok(Reply::Committed) => {
                // guard: G24-a-commit-is-a-change-for-the-lookups
                budget.inner.host.note_changes([self.key.as_str()], true);
                Ok(())
            }
            Ok(Reply::Refused) => {
                // guard: G11-a-refused-commit-deletes-its-object
                delete_objects(store, std::slice::from_ref(&self.key)).await;
                let _ = budget.release(std::slice::from_ref(&self.key)).await;
                Err(TierError::Index {
                    op: "commit",
                    detail: format!("the reservation of {} had expired", self.key),
                })
            }
            Ok(other) => Err(unexpected("commit", &other)),
            // Rebuilt books, seen just now: admitted again in them.
            // guard: G19-a-write-of-lost-books-is-admitted-again
            Err(_) if budget.epoch().is_some() && budget.epoch() != self.epoch => {
                budget.readmit(store, &self.key, self.bytes).await
            }
            // No books (lost, being rebuilt): the object is left to the
            // rebuild's listing, or to the orphan sweep if that has passed.
            Err(error) => Err(error),
        }
    }

    /// Nothing was written: the room goes back.
    pub async fn abort(mut self) -> Result<(), TierError> {
        self.done = true;
        self.budget.release(std::slice::from_ref(&self.key)).await
    }
}

impl Drop for FleetWrite {
    fn drop(&mut self) {
        // Neither committed nor aborted (the caller was cancelled): the
        // lease is no longer renewed, it ends, and a sweeper settles it.
        if !self.done {
            self.budget.unhold(&self.key);
        }
    }
}

impl FleetPin {
    /// The read is done.
    pub async fn release(mut self) -> Result<(), TierError> {
        self.done = true;
        if self.budget.unhold(&self.key) {
            let op = Op::Unpin {
                key: self.key.clone(),
                token: self.budget.inner.token.clone(),
            };
            self.budget.step(&op).await?;
        }
        Ok(())
    }
}

impl Drop for FleetPin {
    fn drop(&mut self) {
        if !self.done {
            self.budget.unhold(&self.key);
        }
    }
}

/// Deletes the objects of `keys`; returns those gone (a missing one
/// counts as gone).
pub(super) async fn delete_objects(store: &dyn ObjectStore, keys: &[String]) -> Vec<String> {
    let mut gone = Vec::new();
    for key in keys {
        let location = ObjectPath::from(key.as_str());
        match store.delete(&location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => gone.push(key.clone()),
            Err(error) => {
                tracing::warn!(%location, %error, "a fleet victim's object could not be deleted")
            }
        }
    }
    gone
}

fn unexpected(op: &'static str, reply: &Reply) -> TierError {
    TierError::Index {
        op,
        detail: format!("unexpected answer {reply:?}"),
    }
}

pub(super) fn random_bits() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(crate::sync::unique_id());
    hasher.finish()
}
