//! The fleet model's world: the books (`fleet_reference`), the bucket, the
//! hosts and their operations step by step, and the checks F1-F3 (see
//! models/tests/fleet_model.rs).

use std::collections::BTreeMap;

use kvtier::tier::fleet::{Op, Reply};
use kvtier_models::fleet_reference::FleetReference;

pub const LEASE: u64 = 1_000;
pub const BLOCK: u64 = 1;
pub const CAPACITY: u64 = 2;
pub const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// A host's operation in progress.
#[derive(Clone, Debug, PartialEq)]
pub enum Doing {
    Idle,
    /// Reserved `key` in the books of `epoch`; `put`: its object is written.
    Storing {
        key: String,
        put: bool,
        epoch: String,
    },
    /// Victims (named by the books of `epoch`) to delete, then release.
    Evicting {
        victims: Vec<String>,
        epoch: String,
    },
    /// Claimed expired entries to delete, then release.
    Sweeping {
        claimed: Vec<String>,
        epoch: String,
    },
    /// Holds the rebuild lock: adds the listing, then ends.
    Rebuilding {
        listed: Vec<String>,
        added: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Host {
    pub token: String,
    pub epoch: String,
    pub alive: bool,
    pub doing: Doing,
}

pub struct World {
    pub books: FleetReference,
    /// Objects in the bucket, with the order they were written in.
    pub bucket: BTreeMap<String, u64>,
    pub writes: u64,
    pub now: u64,
    pub hosts: Vec<Host>,
    pub epochs: u64,
    /// Set while the books are lost or being rebuilt (F2, F3 wait).
    pub unsettled: bool,
    /// Objects a dead writer left uncounted (reserved in lost books): the
    /// orphan sweep's.
    pub orphans: std::collections::BTreeSet<String>,
    /// Committed blocks whose objects an eviction or sweep chosen in lost
    /// books deleted after the rebuild listed them: hits whose loads fail
    /// (and forget them).
    pub stale_deletes: std::collections::BTreeSet<String>,
    /// Every call and its answer, for a failure's message.
    pub log: Vec<String>,
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

impl World {
    pub fn new(hosts: usize) -> Self {
        let mut world = World {
            books: FleetReference::default(),
            bucket: BTreeMap::new(),
            writes: 0,
            now: 1_000_000,
            hosts: (0..hosts)
                .map(|i| Host {
                    token: format!("h{i}"),
                    epoch: String::new(),
                    alive: true,
                    doing: Doing::Idle,
                })
                .collect(),
            epochs: 0,
            unsettled: false,
            orphans: Default::default(),
            stale_deletes: Default::default(),
            log: Vec::new(),
        };
        world.start_rebuild(0);
        world.finish_rebuild(0);
        world
    }

    pub fn call(&mut self, host: usize, op: &Op) -> Reply {
        let epoch = self.hosts[host].epoch.clone();
        let reply = self.books.apply(&epoch, op, self.now);
        self.log
            .push(format!("h{host}@{epoch} {op:?} -> {reply:?}"));
        if let Reply::Epoch(new) = &reply {
            self.hosts[host].epoch = new.clone();
        }
        reply
    }

    fn put(&mut self, key: &str) {
        self.log.push(format!("put {key}"));
        self.writes += 1;
        self.bucket.insert(key.to_string(), self.writes);
    }

    pub fn start_rebuild(&mut self, host: usize) -> bool {
        self.epochs += 1;
        let op = Op::BeginRebuild {
            holder: self.hosts[host].token.clone(),
            lease_ms: 4 * LEASE,
            epoch: format!("e{}", self.epochs),
            capacity: CAPACITY,
        };
        match self.books.apply("", &op, self.now) {
            Reply::Rebuild(epoch) => {
                self.hosts[host].epoch = epoch;
                // The listing: oldest first.
                let mut listed: Vec<(u64, String)> =
                    self.bucket.iter().map(|(k, w)| (*w, k.clone())).collect();
                listed.sort();
                let listed = listed.into_iter().map(|(_, key)| key).collect();
                self.hosts[host].doing = Doing::Rebuilding {
                    listed,
                    added: false,
                };
                true
            }
            Reply::Ready(epoch) => {
                self.hosts[host].epoch = epoch;
                false
            }
            _ => false,
        }
    }

    /// Steps `host` until it is idle (at most 100 steps: its operation
    /// must end once the books are ready).
    pub fn finish_rebuild(&mut self, host: usize) {
        for _ in 0..100 {
            if self.hosts[host].doing == Doing::Idle {
                return;
            }
            self.step_host(host);
        }
        panic!("host {host} does not finish: {:?}", self.hosts[host]);
    }

    /// One step of `host`'s operation in progress.
    pub fn step_host(&mut self, host: usize) {
        let token = self.hosts[host].token.clone();
        match self.hosts[host].doing.clone() {
            Doing::Idle => {}
            Doing::Storing {
                key,
                put: false,
                epoch,
            } => {
                self.put(&key);
                self.hosts[host].doing = Doing::Storing {
                    key,
                    put: true,
                    epoch,
                };
            }
            Doing::Storing {
                key,
                put: true,
                epoch,
            } => {
                let op = Op::Commit {
                    key: key.clone(),
                    token: token.clone(),
                };
                // Reserved in books lost since (this host learned the new
                // epoch meanwhile): admitted again, as FleetWrite::commit.
                let reply = if self.hosts[host].epoch != epoch {
                    Reply::Epoch(self.hosts[host].epoch.clone())
                } else {
                    self.call(host, &op)
                };
                let settled = match reply {
                    Reply::Refused => {
                        self.bucket.remove(&key);
                        self.call(
                            host,
                            &Op::Release {
                                token,
                                keys: vec![key.clone()],
                            },
                        );
                        true
                    }
                    // Rebuilt books: the write is admitted again in them.
                    Reply::Epoch(_) => self.readmit(host, &key),
                    // No books yet: tried again at the host's next step.
                    Reply::Lost | Reply::Rebuilding => false,
                    _ => true,
                };
                if settled {
                    self.hosts[host].doing = Doing::Idle;
                }
            }
            Doing::Evicting { mut victims, epoch }
            | Doing::Sweeping {
                claimed: mut victims,
                epoch,
            } => {
                // Named by books this host has seen replaced: the new books
                // may count those objects; they are left alone (as
                // FleetBudget's deletions stop when the epoch changed).
                if self.hosts[host].epoch != epoch {
                    self.hosts[host].doing = Doing::Idle;
                    return;
                }
                match victims.pop() {
                    Some(victim) => {
                        // Books replaced without this host knowing yet: a
                        // rebuild may list the object (as committed) before
                        // or after this deletion.
                        let stale = self
                            .books
                            .books
                            .as_ref()
                            .is_none_or(|books| books.epoch != epoch);
                        if stale {
                            self.stale_deletes.insert(victim.clone());
                        }
                        self.bucket.remove(&victim);
                        self.call(
                            host,
                            &Op::Release {
                                token,
                                keys: vec![victim],
                            },
                        );
                        self.hosts[host].doing = match self.hosts[host].doing {
                            Doing::Evicting { .. } => Doing::Evicting { victims, epoch },
                            _ => Doing::Sweeping {
                                claimed: victims,
                                epoch,
                            },
                        };
                    }
                    None => self.hosts[host].doing = Doing::Idle,
                }
            }
            Doing::Rebuilding {
                listed,
                added: false,
            } => {
                let op = Op::RebuildAdd {
                    holder: token,
                    blocks: listed.iter().map(|key| (key.clone(), BLOCK)).collect(),
                };
                if let Reply::Added(left) = self.call(host, &op) {
                    for key in left {
                        self.bucket.remove(&key);
                    }
                }
                self.hosts[host].doing = Doing::Rebuilding {
                    listed,
                    added: true,
                };
            }
            Doing::Rebuilding { added: true, .. } => {
                if let Reply::Ready(_) = self.call(host, &Op::RebuildEnd { holder: token }) {
                    self.unsettled = false;
                }
                self.hosts[host].doing = Doing::Idle;
            }
        }
    }

    /// `key`'s object, written under lost books, admitted in the new ones
    /// (as `FleetWrite::commit` does): kept when present or another holder
    /// writes it, committed when there is room, deleted when there is none;
    /// tried again later (false) while there are no ready books.
    fn readmit(&mut self, host: usize, key: &str) -> bool {
        let token = self.hosts[host].token.clone();
        loop {
            let op = Op::Reserve {
                key: key.to_string(),
                bytes: BLOCK,
                token: token.clone(),
                lease_ms: LEASE,
            };
            match self.call(host, &op) {
                // Room: committed if its object is still there (held now,
                // nobody else deletes it), given back if an eviction in the
                // rebuilt books took it meanwhile.
                Reply::Granted => {
                    let op = if self.bucket.contains_key(key) {
                        Op::Commit {
                            key: key.to_string(),
                            token: token.clone(),
                        }
                    } else {
                        Op::Release {
                            token: token.clone(),
                            keys: vec![key.to_string()],
                        }
                    };
                    self.call(host, &op);
                    return true;
                }
                Reply::Evict(victims) => {
                    let keys: Vec<String> = victims.into_iter().map(|(key, _)| key).collect();
                    for victim in &keys {
                        self.bucket.remove(victim);
                    }
                    self.call(
                        host,
                        &Op::Release {
                            token: token.clone(),
                            keys,
                        },
                    );
                }
                Reply::Present | Reply::Busy => return true,
                Reply::Lost | Reply::Rebuilding | Reply::Epoch(_) => return false,
                _ => {
                    self.bucket.remove(key);
                    return true;
                }
            }
        }
    }

    /// An idle host starts something.
    pub fn start(&mut self, host: usize, rng: &mut Rng) {
        let token = self.hosts[host].token.clone();
        match rng.below(4) {
            0 | 1 => {
                let key = KEYS[rng.below(KEYS.len())].to_string();
                let op = Op::Reserve {
                    key: key.clone(),
                    bytes: BLOCK,
                    token,
                    lease_ms: LEASE,
                };
                match self.call(host, &op) {
                    Reply::Granted => {
                        let epoch = self.hosts[host].epoch.clone();
                        self.hosts[host].doing = Doing::Storing {
                            key,
                            put: false,
                            epoch,
                        };
                    }
                    Reply::Evict(victims) => {
                        self.hosts[host].doing = Doing::Evicting {
                            victims: victims.into_iter().map(|(key, _)| key).collect(),
                            epoch: self.hosts[host].epoch.clone(),
                        }
                    }
                    Reply::Lost => {
                        self.start_rebuild(host);
                    }
                    _ => {}
                }
            }
            2 => {
                let op = Op::ClaimExpired {
                    token,
                    lease_ms: LEASE,
                    limit: 10,
                };
                if let Reply::Claimed(claimed) = self.call(host, &op) {
                    self.hosts[host].doing = Doing::Sweeping {
                        claimed: claimed.into_iter().map(|(key, _, _)| key).collect(),
                        epoch: self.hosts[host].epoch.clone(),
                    };
                }
            }
            _ => {
                if self.books.apply("", &Op::Status, self.now) == Reply::Lost {
                    self.start_rebuild(host);
                } else if let Reply::Status(status) = self.books.apply("", &Op::Status, self.now)
                    && status.ready
                {
                    self.hosts[host].epoch = status.epoch;
                }
            }
        }
    }

    /// The clock moves past a lease; live hosts renew theirs first.
    pub fn advance(&mut self) {
        for host in 0..self.hosts.len() {
            if !self.hosts[host].alive {
                continue;
            }
            let keys = match &self.hosts[host].doing {
                Doing::Storing { key, .. } => vec![key.clone()],
                Doing::Evicting { victims, .. } => victims.clone(),
                Doing::Sweeping { claimed, .. } => claimed.clone(),
                _ => Vec::new(),
            };
            if !keys.is_empty() {
                let op = Op::Renew {
                    token: self.hosts[host].token.clone(),
                    lease_ms: 10 * LEASE,
                    keys,
                };
                self.call(host, &op);
            }
        }
        self.now += 2 * LEASE;
    }

    pub fn lose_books(&mut self) {
        self.log.push("books lost".into());
        self.books = FleetReference::default();
        self.unsettled = true;
    }

    pub fn check(&self, trace: &[String]) {
        let Some(books) = &self.books.books else {
            return;
        };
        // F1
        assert!(
            books.committed + books.held_bytes <= books.capacity,
            "F1: {books:?}\n{trace:#?}"
        );
        if self.unsettled || !books.ready {
            return;
        }
        // F2: uncounted only while its writer, reserved in lost books,
        // has yet to admit it again (or died first: an orphan for the sweep).
        for key in self.bucket.keys() {
            let in_flight = self.hosts.iter().any(|host| {
                matches!(&host.doing, Doing::Storing { key: writing, put: true, .. } if writing == key)
                    || self.orphans.contains(key)
            });
            assert!(
                books.blocks.contains_key(key) || books.held.contains_key(key) || in_flight,
                "F2: object {key} is not counted: {books:?}\n{:?}\n{:?}\n{trace:#?}",
                self.bucket,
                self.hosts
            );
        }
        // F3
        for key in books.blocks.keys() {
            assert!(
                self.bucket.contains_key(key) || self.stale_deletes.contains(key),
                "F3: {key} is committed without its object\n{books:?}\n{:?}\n{:?}\n{:#?}",
                self.bucket,
                self.hosts,
                &self.log[self.log.len().saturating_sub(40)..]
            );
        }
    }
}
