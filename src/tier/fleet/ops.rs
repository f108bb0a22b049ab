//! The fleet books' operations and their replies: what a client sends to
//! the server-side script (`books.lua`) and what it answers, apart from any
//! client library. The reference model (models/src/fleet_reference.rs)
//! answers the same operations with the same [`Reply`] values.

use std::fmt;

/// One step of the fleet protocol: one atomic script call on the server.
/// Keys are the blocks' object paths; tokens name a holder (a store, a
/// reader, a sweeper) and are made of `[0-9a-zA-Z_-]`; leases are in
/// milliseconds on the server's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are the ones each variant's docs name
pub enum Op {
    /// The books' state (no epoch needed).
    Status,
    /// Takes the rebuild lock for `lease_ms` and starts new books of
    /// `capacity` bytes under `epoch` (no epoch needed); refused while the
    /// books are ready or another holder rebuilds.
    BeginRebuild {
        holder: String,
        lease_ms: u64,
        epoch: String,
        capacity: u64,
    },
    /// Blocks found by the rebuild's listing, oldest first; those that do
    /// not fit come back to be deleted.
    RebuildAdd {
        holder: String,
        blocks: Vec<(String, u64)>,
    },
    /// The rebuild is done: the books are ready.
    RebuildEnd { holder: String },
    /// One verdict per key: committed or not.
    Lookup { keys: Vec<String> },
    /// Keys read since the last touch move to the recent end.
    Touch { keys: Vec<String> },
    /// Of keys a listing found, those the books neither commit nor hold
    /// (orphans for the sweep): one verdict per key, `true` for an orphan.
    Unlisted { keys: Vec<String> },
    /// Room for a block: granted, present, busy, victims to delete first,
    /// no room, or too large.
    Reserve {
        key: String,
        bytes: u64,
        token: String,
        lease_ms: u64,
    },
    /// The reserved block's object is written: it becomes committed.
    /// Refused once the reservation's lease ended.
    Commit { key: String, token: String },
    /// Releases the token's held entries of `keys` (an aborted store, a
    /// deleted victim's or refused commit's object, a settled claim).
    Release { token: String, keys: Vec<String> },
    /// Gives the token's live reservations, evictions and pins of `keys`
    /// a new lease; an expired one stays expired.
    Renew {
        token: String,
        lease_ms: u64,
        keys: Vec<String>,
    },
    /// Pins a committed block for a read.
    Pin {
        key: String,
        token: String,
        lease_ms: u64,
    },
    /// Lets go of a read's pin.
    Unpin { key: String, token: String },
    /// The block's object was found missing: it leaves the books.
    Forget { key: String },
    /// Held entries whose lease ended, at most `limit`, become the
    /// caller's (a sweeper's) with a new lease.
    ClaimExpired {
        token: String,
        lease_ms: u64,
        limit: u64,
    },
    /// A new capacity; what no longer fits is evicted (to the caller).
    SetCapacity {
        capacity: u64,
        token: String,
        lease_ms: u64,
    },
}

/// The kind of a held entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HeldKind {
    /// A store writing the block.
    Reserved,
    /// A victim whose object is being deleted.
    Evicting,
}

/// The books' state, as [`Op::Status`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // as the books' meta hash names them
pub struct BooksStatus {
    /// Whether the books are ready (false: a rebuild is under way).
    pub ready: bool,
    pub epoch: String,
    pub capacity: u64,
    /// Bytes of committed blocks.
    pub committed: u64,
    /// Bytes of held entries (reservations and evictions).
    pub held: u64,
    pub blocks: u64,
    pub held_entries: u64,
}

impl BooksStatus {
    /// The books' figures as a ledger's gauges (what `capacity_stats`
    /// reports with an index).
    pub fn capacity_stats(&self) -> crate::capacity::CapacityStats {
        crate::capacity::CapacityStats {
            capacity_bytes: self.capacity,
            resident_bytes: self.committed,
            reserved_bytes: self.held,
            entries: self.blocks + self.held_entries,
            ..crate::capacity::CapacityStats::default()
        }
    }
}

/// What the server (or the model) answered.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // each answer is the step's outcome of the same name
pub enum Reply {
    /// No books: the server lost them (a restart without persistence, a
    /// flush) or they were never made. Rebuild.
    Lost,
    /// The caller's epoch is not the books' (they were rebuilt): this one.
    Epoch(String),
    /// A rebuild is under way (or this caller is not its holder when it
    /// tried to begin one).
    Rebuilding,
    /// The books are ready, under this epoch.
    Ready(String),
    /// The caller holds the rebuild lock: new books under this epoch.
    Rebuild(String),
    /// A rebuild step from a caller that does not hold the lock.
    NotHolder,
    /// The rebuild's blocks that did not fit (delete them).
    Added(Vec<String>),
    Status(BooksStatus),
    /// One verdict per key.
    Verdicts(Vec<bool>),
    Touched(u64),
    TooLarge,
    Present,
    Busy,
    Granted,
    NoRoom,
    /// Victims (key, bytes) now held by the caller: delete each object,
    /// release them, then ask again.
    Evict(Vec<(String, u64)>),
    Committed,
    Refused,
    Released(u64),
    Renewed(u64),
    Pinned,
    Miss,
    Unpinned(bool),
    Forgotten,
    Unknown,
    /// Claimed expired entries (key, kind, bytes).
    Claimed(Vec<(String, HeldKind, u64)>),
}

/// One value of a script's answer, apart from the client library.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // RESP's integer, bulk string, array and nil
pub enum Frame {
    Int(i64),
    Text(Vec<u8>),
    Array(Vec<Frame>),
    Nil,
}

/// An answer that is not one the script gives: a bug, or another script
/// under the same name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the fleet books answered {op} with {found}")]
pub struct BadReply {
    /// The operation asked.
    pub op: &'static str,
    /// What came back.
    pub found: String,
}

impl Op {
    /// The operation's name in the script.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Status => "status",
            Op::BeginRebuild { .. } => "begin_rebuild",
            Op::RebuildAdd { .. } => "rebuild_add",
            Op::RebuildEnd { .. } => "rebuild_end",
            Op::Lookup { .. } => "lookup",
            Op::Touch { .. } => "touch",
            Op::Unlisted { .. } => "unlisted",
            Op::Reserve { .. } => "reserve",
            Op::Commit { .. } => "commit",
            Op::Release { .. } => "release",
            Op::Renew { .. } => "renew",
            Op::Pin { .. } => "pin",
            Op::Unpin { .. } => "unpin",
            Op::Forget { .. } => "forget",
            Op::ClaimExpired { .. } => "claim_expired",
            Op::SetCapacity { .. } => "set_capacity",
        }
    }

    /// The script's arguments after the operation and the epoch.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        match self {
            Op::Status => {}
            Op::BeginRebuild {
                holder,
                lease_ms,
                epoch,
                capacity,
            } => args.extend([
                holder.clone(),
                lease_ms.max(&1).to_string(),
                epoch.clone(),
                capacity.to_string(),
            ]),
            Op::RebuildAdd { holder, blocks } => {
                args.push(holder.clone());
                for (key, bytes) in blocks {
                    args.extend([key.clone(), bytes.to_string()]);
                }
            }
            Op::RebuildEnd { holder } => args.push(holder.clone()),
            Op::Lookup { keys } | Op::Touch { keys } | Op::Unlisted { keys } => {
                args.extend(keys.iter().cloned())
            }
            Op::Reserve {
                key,
                bytes,
                token,
                lease_ms,
            } => args.extend([
                key.clone(),
                bytes.to_string(),
                token.clone(),
                lease_ms.to_string(),
            ]),
            Op::Commit { key, token } | Op::Unpin { key, token } => {
                args.extend([key.clone(), token.clone()])
            }
            Op::Release { token, keys } => {
                args.push(token.clone());
                args.extend(keys.iter().cloned());
            }
            Op::Renew {
                token,
                lease_ms,
                keys,
            } => {
                args.extend([token.clone(), lease_ms.to_string()]);
                args.extend(keys.iter().cloned());
            }
            Op::Pin {
                key,
                token,
                lease_ms,
            } => args.extend([key.clone(), token.clone(), lease_ms.to_string()]),
            Op::Forget { key } => args.push(key.clone()),
            Op::ClaimExpired {
                token,
                lease_ms,
                limit,
            } => args.extend([token.clone(), lease_ms.to_string(), limit.to_string()]),
            Op::SetCapacity {
                capacity,
                token,
                lease_ms,
            } => args.extend([capacity.to_string(), token.clone(), lease_ms.to_string()]),
        }
        args
    }

    /// Reads the script's answer to this operation.
    pub fn parse(&self, frame: &Frame) -> Result<Reply, BadReply> {
        let bad = || BadReply {
            op: self.name(),
            found: format!("{frame:?}"),
        };
        let Frame::Array(items) = frame else {
            return Err(bad());
        };
        if let Op::Lookup { keys } | Op::Unlisted { keys } = self {
            // The one answer that is not headed by a word.
            if let Some(Frame::Text(word)) = items.first() {
                return common(word, items).ok_or_else(bad);
            }
            if items.len() != keys.len() {
                return Err(bad());
            }
            let verdicts = items.iter().map(|item| match item {
                Frame::Int(0) => Some(false),
                Frame::Int(1) => Some(true),
                _ => None,
            });
            return verdicts
                .collect::<Option<Vec<_>>>()
                .map(Reply::Verdicts)
                .ok_or_else(bad);
        }
        let Some(Frame::Text(word)) = items.first() else {
            return Err(bad());
        };
        let rest = &items[1..];
        if matches!(self, Op::Status) && rest.len() == 6 {
            return status(word, rest).ok_or_else(bad);
        }
        let reply = match word.as_slice() {
            b"added" => rest
                .iter()
                .map(text)
                .collect::<Option<Vec<_>>>()
                .map(Reply::Added),
            b"touched" => one_int(rest).map(Reply::Touched),
            b"too_large" => Some(Reply::TooLarge),
            b"present" => Some(Reply::Present),
            b"busy" => Some(Reply::Busy),
            b"granted" => Some(Reply::Granted),
            b"no_room" => Some(Reply::NoRoom),
            b"evict" => pairs(rest).map(Reply::Evict),
            b"committed" => Some(Reply::Committed),
            b"refused" => Some(Reply::Refused),
            b"released" => one_int(rest).map(Reply::Released),
            b"renewed" => one_int(rest).map(Reply::Renewed),
            b"pinned" => Some(Reply::Pinned),
            b"miss" => Some(Reply::Miss),
            b"unpinned" => one_int(rest).map(|n| Reply::Unpinned(n == 1)),
            b"forgotten" => Some(Reply::Forgotten),
            b"unknown" => Some(Reply::Unknown),
            b"claimed" => claimed(rest).map(Reply::Claimed),
            _ => common(word, items),
        };
        reply.ok_or_else(bad)
    }
}

/// The answers any operation may get: no books, another epoch, a rebuild.
fn common(word: &[u8], items: &[Frame]) -> Option<Reply> {
    match (word, &items[1..]) {
        (b"lost", []) => Some(Reply::Lost),
        (b"epoch", [epoch]) => text(epoch).map(Reply::Epoch),
        (b"rebuilding", []) => Some(Reply::Rebuilding),
        (b"ready", [epoch]) => text(epoch).map(Reply::Ready),
        (b"rebuild", [epoch]) => text(epoch).map(Reply::Rebuild),
        (b"not_holder", []) => Some(Reply::NotHolder),
        _ => None,
    }
}

fn status(word: &[u8], rest: &[Frame]) -> Option<Reply> {
    let ready = match word {
        b"ready" => true,
        b"rebuilding" => false,
        _ => return None,
    };
    let numbers = rest[1..].iter().map(int).collect::<Option<Vec<u64>>>()?;
    Some(Reply::Status(BooksStatus {
        ready,
        epoch: text(&rest[0])?,
        capacity: numbers[0],
        committed: numbers[1],
        held: numbers[2],
        blocks: numbers[3],
        held_entries: numbers[4],
    }))
}

fn text(frame: &Frame) -> Option<String> {
    match frame {
        Frame::Text(bytes) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    }
}

/// A whole number, as an integer or as its digits.
fn int(frame: &Frame) -> Option<u64> {
    match frame {
        Frame::Int(n) => u64::try_from(*n).ok(),
        Frame::Text(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn one_int(rest: &[Frame]) -> Option<u64> {
    match rest {
        [n] => int(n),
        _ => None,
    }
}

fn pairs(rest: &[Frame]) -> Option<Vec<(String, u64)>> {
    if !rest.len().is_multiple_of(2) {
        return None;
    }
    rest.chunks(2)
        .map(|pair| Some((text(&pair[0])?, int(&pair[1])?)))
        .collect()
}

fn claimed(rest: &[Frame]) -> Option<Vec<(String, HeldKind, u64)>> {
    if !rest.len().is_multiple_of(3) {
        return None;
    }
    rest.chunks(3)
        .map(|entry| {
            let kind = match text(&entry[1])?.as_str() {
                "r" => HeldKind::Reserved,
                "e" => HeldKind::Evicting,
                _ => return None,
            };
            Some((text(&entry[0])?, kind, int(&entry[2])?))
        })
        .collect()
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
