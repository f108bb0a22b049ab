//! The real [`kvtier::capacity::CapacityLedger`] and the specification of
//! [`crate::capacity_reference`] driven with one operation sequence,
//! compared after every operation (`models/tests/proptest_capacity.rs`).

use std::collections::BTreeSet;

use kvtier::capacity::{
    Admission, CapacityLedger, CapacityStats, Listing, Pin, Policy, Reservation, Victim,
};

use crate::capacity_reference::{CapacityOp, CapacitySpec, SpecBlock, SpecState, listed_bytes};

/// An open listing: what it must judge and what it must not adopt.
struct OpenListing {
    token: Listing,
    /// Blocks resident (or being evicted) when it began and neither
    /// committed, adopted nor gone since.
    judged: BTreeSet<u8>,
    /// Blocks that left the books since it began.
    left: BTreeSet<u8>,
}

/// The real ledger and the specification, side by side.
pub struct CapacityLockstep {
    policy: Policy,
    real: CapacityLedger<u8>,
    spec: CapacitySpec,
    reservations: Vec<Reservation<u8>>,
    pins: Vec<Pin<u8>>,
    victims: Vec<Victim<u8>>,
    listings: Vec<OpenListing>,
    /// The counters the specification expects.
    expected: CapacityStats,
}

fn pick<T>(items: &mut Vec<T>, pick: u8) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    let index = usize::from(pick) % items.len();
    Some(items.remove(index))
}

impl CapacityLockstep {
    /// Both sides, empty, of `capacity` bytes; `seeds` (key, bytes), newest
    /// first, are found on disk at startup.
    pub fn new(capacity: u64, policy: Policy, seeds: &[(u8, u8)]) -> Self {
        let mut this = Self {
            policy,
            real: CapacityLedger::new(capacity, policy),
            spec: CapacitySpec {
                capacity,
                ..CapacitySpec::default()
            },
            reservations: Vec::new(),
            pins: Vec::new(),
            victims: Vec::new(),
            listings: Vec::new(),
            expected: CapacityStats::default(),
        };
        this.expected.capacity_bytes = capacity;
        for &(key, bytes) in seeds {
            let bytes = u64::from(bytes);
            let trimmed = this.real.seed(key, bytes);
            let known = this.spec.find(key).is_some();
            let fits = bytes <= capacity - this.spec.resident();
            match (known, fits, trimmed) {
                (true, _, None) => {}
                (false, true, None) => this.spec.blocks.insert(
                    0,
                    SpecBlock {
                        key,
                        bytes,
                        state: SpecState::Resident {
                            pins: 0,
                            lost: false,
                        },
                    },
                ),
                (false, false, Some(victim)) => {
                    assert_eq!((*victim.key(), victim.bytes()), (key, bytes));
                    this.expected.victims += 1;
                    this.expected.startup_trims += 1;
                    this.expected.evictions += 1;
                    this.expected.evicted_bytes += bytes;
                    this.real
                        .evicted(victim)
                        .expect("a startup trim is released once");
                }
                (known, fits, trimmed) => {
                    panic!(
                        "seed {key}: known {known}, fits {fits}, but the ledger trimmed {trimmed:?}"
                    )
                }
            }
        }
        this.compare();
        this
    }

    /// Runs `op` on both sides and compares them.
    pub fn apply(&mut self, op: &CapacityOp) {
        match *op {
            CapacityOp::Reserve { key, bytes } => self.reserve(key, u64::from(bytes)),
            CapacityOp::Commit { pick: p } => {
                if let Some(r) = pick(&mut self.reservations, p) {
                    let i = self
                        .spec
                        .find(*r.key())
                        .expect("a reservation's block is known");
                    assert_eq!(self.spec.blocks[i].state, SpecState::Reserved);
                    self.spec.blocks[i].state = SpecState::Resident {
                        pins: 0,
                        lost: false,
                    };
                    self.spec.touch(i);
                    self.arrived(*r.key());
                    self.expected.committed += 1;
                    self.real
                        .commit(r)
                        .expect("an outstanding reservation commits");
                }
            }
            CapacityOp::Abort { pick: p } => {
                if let Some(r) = pick(&mut self.reservations, p) {
                    let i = self
                        .spec
                        .find(*r.key())
                        .expect("a reservation's block is known");
                    self.spec.blocks.remove(i);
                    self.expected.aborted += 1;
                    self.real
                        .abort(r)
                        .expect("an outstanding reservation aborts");
                }
            }
            CapacityOp::Pin { key } => self.pin(key),
            CapacityOp::Unpin { pick: p } => {
                if let Some(pin) = pick(&mut self.pins, p) {
                    let i = self.spec.find(*pin.key()).expect("a pinned block is known");
                    let SpecState::Resident { pins, lost } = self.spec.blocks[i].state else {
                        panic!("a pinned block is resident");
                    };
                    if pins == 1 && lost {
                        self.spec.blocks.remove(i);
                    } else {
                        self.spec.blocks[i].state = SpecState::Resident {
                            pins: pins - 1,
                            lost,
                        };
                    }
                    self.real.unpin(pin).expect("an outstanding pin unpins");
                }
            }
            CapacityOp::Evicted { pick: p } => {
                if let Some(victim) = pick(&mut self.victims, p) {
                    let i = self.spec.find(*victim.key()).expect("a victim is known");
                    assert_eq!(self.spec.blocks[i].state, SpecState::Evicting);
                    self.spec.blocks.remove(i);
                    self.departed(*victim.key());
                    self.expected.evictions += 1;
                    self.expected.evicted_bytes += victim.bytes();
                    if victim.cause() == kvtier::capacity::Cause::Trim {
                        self.expected.trims += 1;
                    }
                    self.real
                        .evicted(victim)
                        .expect("an outstanding victim is evicted");
                }
            }
            CapacityOp::EvictionFailed { pick: p } => {
                if let Some(victim) = pick(&mut self.victims, p) {
                    let i = self.spec.find(*victim.key()).expect("a victim is known");
                    self.spec.blocks[i].state = SpecState::Resident {
                        pins: 0,
                        lost: false,
                    };
                    self.spec.touch(i);
                    self.expected.eviction_failures += 1;
                    self.real
                        .eviction_failed(victim)
                        .expect("an outstanding victim fails");
                }
            }
            CapacityOp::Lose { key } => {
                let lost = match self.spec.find(key) {
                    Some(i) => match self.spec.blocks[i].state {
                        SpecState::Resident {
                            pins: 0,
                            lost: false,
                        } => {
                            self.spec.blocks.remove(i);
                            true
                        }
                        SpecState::Resident { pins, lost: false } => {
                            self.spec.blocks[i].state = SpecState::Resident { pins, lost: true };
                            true
                        }
                        _ => false,
                    },
                    None => false,
                };
                self.expected.lost += u64::from(lost);
                if lost {
                    self.departed(key);
                }
                assert_eq!(self.real.lose(&key), lost, "lose {key}");
            }
            CapacityOp::SetCapacity { capacity } => self.set_capacity(u64::from(capacity)),
            CapacityOp::BeginListing => {
                let judged = self
                    .spec
                    .blocks
                    .iter()
                    .filter(|b| b.state != SpecState::Reserved)
                    .map(|b| b.key)
                    .collect();
                let token = self.real.begin_listing();
                self.listings.push(OpenListing {
                    token,
                    judged,
                    left: BTreeSet::new(),
                });
            }
            CapacityOp::Reconcile { pick: p, listed } => {
                if let Some(listing) = pick(&mut self.listings, p) {
                    self.reconcile(listing, listed);
                }
            }
            CapacityOp::AbandonListing { pick: p } => {
                if let Some(listing) = pick(&mut self.listings, p) {
                    self.real.abandon(listing.token);
                }
            }
        }
        self.compare();
    }

    /// A block became resident (committed or adopted): no open listing
    /// judges it.
    fn arrived(&mut self, key: u8) {
        for listing in &mut self.listings {
            listing.judged.remove(&key);
        }
    }

    /// A block left the books: no open listing judges or adopts it.
    fn departed(&mut self, key: u8) {
        for listing in &mut self.listings {
            listing.judged.remove(&key);
            listing.left.insert(key);
        }
    }

    fn reconcile(&mut self, listing: OpenListing, listed: u16) {
        let keys: Vec<u8> = (0..16).filter(|k| listed & (1 << k) != 0).collect();
        let mut adopted = Vec::new();
        for &key in &keys {
            if self.spec.find(key).is_none() && !listing.left.contains(&key) {
                self.spec.blocks.push(SpecBlock {
                    key,
                    bytes: listed_bytes(key),
                    state: SpecState::Resident {
                        pins: 0,
                        lost: false,
                    },
                });
                adopted.push(key);
            }
        }
        let mut forgotten = Vec::new();
        for block in &mut self.spec.blocks {
            if let SpecState::Resident { pins, lost: false } = block.state
                && listing.judged.contains(&block.key)
                && !keys.contains(&block.key)
            {
                block.state = SpecState::Resident { pins, lost: true };
                forgotten.push(block.key);
            }
        }
        // Unpinned forgotten blocks leave now, pinned ones at their last unpin.
        self.spec.blocks.retain(|b| {
            b.state
                != SpecState::Resident {
                    pins: 0,
                    lost: true,
                }
        });
        let used = self.spec.resident() + self.spec.reserved();
        let evicting = self.spec.sum(|b| b.state == SpecState::Evicting);
        let evictable = self.spec.sum(CapacitySpec::evictable);
        let values = keys.iter().map(|&k| (k, listed_bytes(k)));
        let done = self.real.reconcile(listing.token, values);
        for &key in &adopted {
            self.arrived(key);
        }
        for &key in &forgotten {
            self.departed(key);
        }
        assert_eq!(
            (done.adopted, done.forgotten),
            (adopted.len() as u64, forgotten.len() as u64),
            "reconcile with {keys:?}"
        );
        let over = used.saturating_sub(self.spec.capacity);
        // Over the capacity until the victims (and evictions under way)
        // are done, as after a lowered capacity.
        self.spec.lowered |= over > 0;
        if over > evicting {
            let needed = over - evicting;
            self.check_chosen(needed, &done.victims, evictable >= needed);
        } else {
            assert!(
                done.victims.is_empty(),
                "victims {:?} with nothing over",
                done.victims
            );
        }
        self.expected.reconciles += 1;
        self.expected.adopted += adopted.len() as u64;
        self.expected.forgotten += forgotten.len() as u64;
        self.expected.victims += done.victims.len() as u64;
        self.victims.extend(done.victims);
    }

    fn reserve(&mut self, key: u8, bytes: u64) {
        let spec = &self.spec;
        let used = spec.resident() + spec.reserved();
        let expected = if bytes > spec.capacity {
            self.expected.rejected_too_large += 1;
            "Rejected(TooLarge)"
        } else if let Some(i) = spec.find(key) {
            if matches!(
                spec.blocks[i].state,
                SpecState::Resident { lost: false, .. }
            ) {
                self.expected.already_resident += 1;
                "Present"
            } else {
                self.expected.rejected_busy += 1;
                "Rejected(Busy)"
            }
        } else if used + bytes <= spec.capacity {
            "Granted"
        } else {
            let needed = used + bytes - spec.capacity;
            let evictable = spec.sum(CapacitySpec::evictable);
            let evicting = spec.sum(|b| b.state == SpecState::Evicting);
            if evictable >= needed {
                "Evict"
            } else if evictable + evicting >= needed {
                self.expected.rejected_busy += 1;
                "Rejected(Busy)"
            } else {
                self.expected.rejected_no_room += 1;
                "Rejected(NoRoom)"
            }
        };
        let got = self.real.reserve(key, bytes);
        match got {
            Admission::Granted(r) => {
                assert_eq!(expected, "Granted", "reserve {key} {bytes}");
                assert_eq!((*r.key(), r.bytes()), (key, bytes));
                self.spec.blocks.push(SpecBlock {
                    key,
                    bytes,
                    state: SpecState::Reserved,
                });
                self.expected.admitted += 1;
                self.reservations.push(r);
            }
            Admission::Evict(victims) => {
                assert_eq!(expected, "Evict", "reserve {key} {bytes}");
                self.check_victims(bytes, &victims);
                self.expected.victims += victims.len() as u64;
                self.victims.extend(victims);
            }
            other => assert_eq!(format!("{other:?}"), expected, "reserve {key} {bytes}"),
        }
    }

    /// The victims are evictable, enough and no more than needed; under
    /// LRU, the least recently used evictable blocks in order.
    fn check_victims(&mut self, bytes: u64, victims: &[Victim<u8>]) {
        let used = self.spec.resident() + self.spec.reserved();
        let needed = used + bytes - self.spec.capacity;
        self.check_chosen(needed, victims, true);
    }

    /// `minimal`: the victims cover `needed` and no fewer would; otherwise
    /// they are every evictable block.
    fn check_chosen(&mut self, needed: u64, victims: &[Victim<u8>], minimal: bool) {
        let total: u64 = victims.iter().map(|v| v.bytes()).sum();
        let last = victims.last().map_or(0, |v| v.bytes());
        if minimal {
            assert!(
                total >= needed,
                "victims of {total} bytes for a shortfall of {needed}"
            );
            assert!(
                total - last < needed,
                "more victims than needed: {victims:?} for {needed}"
            );
        } else {
            let all = self
                .spec
                .blocks
                .iter()
                .filter(|b| CapacitySpec::evictable(b))
                .count();
            assert_eq!(victims.len(), all, "not every evictable block was trimmed");
        }
        if self.policy == Policy::Lru {
            let lru: Vec<u8> = self
                .spec
                .blocks
                .iter()
                .filter(|b| CapacitySpec::evictable(b))
                .map(|b| b.key)
                .take(victims.len())
                .collect();
            let chosen: Vec<u8> = victims.iter().map(|v| *v.key()).collect();
            assert_eq!(chosen, lru, "LRU victims");
        }
        for victim in victims {
            let i = self.spec.find(*victim.key()).expect("a victim is known");
            let block = &mut self.spec.blocks[i];
            assert!(
                CapacitySpec::evictable(block),
                "victim {block:?} was not evictable"
            );
            assert_eq!(block.bytes, victim.bytes());
            block.state = SpecState::Evicting;
        }
    }

    fn pin(&mut self, key: u8) {
        let expected = self.spec.find(key).filter(|&i| {
            matches!(
                self.spec.blocks[i].state,
                SpecState::Resident { lost: false, .. }
            )
        });
        let got = self.real.pin(&key);
        assert_eq!(got.is_some(), expected.is_some(), "pin {key}");
        match (expected, got) {
            (Some(i), Some(pin)) => {
                if let SpecState::Resident { pins, lost } = self.spec.blocks[i].state {
                    self.spec.blocks[i].state = SpecState::Resident {
                        pins: pins + 1,
                        lost,
                    };
                }
                self.spec.touch(i);
                self.expected.pins += 1;
                self.pins.push(pin);
            }
            _ => self.expected.pin_misses += 1,
        }
    }

    fn set_capacity(&mut self, capacity: u64) {
        if self.spec.resident() + self.spec.reserved() > capacity {
            self.spec.lowered = true;
        }
        self.spec.capacity = capacity;
        self.expected.capacity_bytes = capacity;
        let used = self.spec.resident() + self.spec.reserved();
        let evicting = self.spec.sum(|b| b.state == SpecState::Evicting);
        let victims = self.real.set_capacity(capacity);
        let over = used.saturating_sub(capacity);
        if over > evicting {
            let needed = over - evicting;
            let evictable = self.spec.sum(CapacitySpec::evictable);
            // Every evictable block goes when they are not enough.
            self.check_chosen(needed, &victims, evictable >= needed);
        } else {
            assert!(victims.is_empty(), "trimmed {victims:?} with nothing over");
        }
        self.expected.victims += victims.len() as u64;
        self.victims.extend(victims);
    }

    fn compare(&mut self) {
        let spec = &self.spec;
        let (resident, reserved) = (spec.resident(), spec.reserved());
        if resident + reserved <= spec.capacity {
            self.spec.lowered = false;
        }
        let spec = &self.spec;
        let mut expected = self.expected;
        expected.resident_bytes = resident;
        expected.reserved_bytes = reserved;
        expected.entries = spec.blocks.len() as u64;
        expected.pinned_entries = spec
            .blocks
            .iter()
            .filter(|b| matches!(b.state, SpecState::Resident { pins: 1.., .. }))
            .count() as u64;
        assert_eq!(self.real.stats(), expected);
        self.real
            .audit()
            .expect("the ledger's sums match its entries");
        // The budget: at every point, unless lowered and not yet met.
        if !spec.lowered {
            assert!(
                resident + reserved <= spec.capacity,
                "{resident} + {reserved} over {}",
                spec.capacity
            );
        }
        for block in &spec.blocks {
            let resident = matches!(block.state, SpecState::Resident { lost: false, .. });
            assert_eq!(self.real.is_resident(&block.key), resident, "{block:?}");
        }
    }

    /// Ends the sequence: every token released (victims deleted, pins
    /// released, reservations committed), then compared once more.
    pub fn finish(&mut self) {
        while !self.victims.is_empty() {
            self.apply(&CapacityOp::Evicted { pick: 0 });
        }
        while !self.pins.is_empty() {
            self.apply(&CapacityOp::Unpin { pick: 0 });
        }
        while !self.reservations.is_empty() {
            self.apply(&CapacityOp::Commit { pick: 0 });
        }
        let stats = self.real.stats();
        assert_eq!((stats.reserved_bytes, stats.pinned_entries), (0, 0));
    }
}
