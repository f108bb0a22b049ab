//! What one host keeps beside the fleet's books (`tier::fleet`, feature
//! `fleet`), shared by its transfers' tasks: the keys it holds entries or pins of (renewed until let go), the
//! hits it has not touched yet, and the changes it made to the books for
//! its lookups and vLLM's KV events. No I/O: built everywhere, and checked
//! under loom (models/tests/loom_fleet_host.rs).

use std::collections::{HashMap, VecDeque};

use super::changes::MAX_CHANGES;
use crate::sync::Mutex;

/// Hits kept for the next touch at most (the rest of a burst is not
/// touched: its blocks only age a little sooner).
pub const MAX_TOUCHES: usize = 1 << 16;

/// One host's registry of holds, touches and changes.
#[derive(Debug)]
pub struct FleetHost {
    /// Keys this host holds an entry or pins of, with how many holds.
    held: Mutex<HashMap<String, u32>>,
    /// Hits since the last [`take_touches`](Self::take_touches).
    touches: Mutex<Vec<String>>,
    /// Blocks this host committed (`true`) or took out of the books
    /// (`false`), oldest first; `None` while nobody takes them.
    changes: Mutex<Option<VecDeque<(String, bool)>>>,
}

impl Default for FleetHost {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetHost {
    /// An empty registry, recording no changes.
    pub fn new() -> Self {
        Self {
            held: Mutex::new(HashMap::new()),
            touches: Mutex::new(Vec::new()),
            changes: Mutex::new(None),
        }
    }

    /// One more hold of `key` (a reservation, an eviction or a pin).
    pub fn hold(&self, key: &str) {
        *self.held.lock().entry(key.to_string()).or_default() += 1;
    }

    /// Drops one hold of `key`; true when it was the last (the key is no
    /// longer renewed).
    pub fn unhold(&self, key: &str) -> bool {
        let mut held = self.held.lock();
        match held.get_mut(key) {
            // guard: G23-a-key-is-renewed-until-its-last-hold-goes
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                held.remove(key);
                true
            }
            None => false,
        }
    }

    /// The keys to renew: every key with a hold.
    pub fn held_keys(&self) -> Vec<String> {
        self.held.lock().keys().cloned().collect()
    }

    /// Forgets every hold (the books they were in are gone).
    pub fn clear_holds(&self) {
        self.held.lock().clear();
    }

    /// Notes hits for the next touch, at most [`MAX_TOUCHES`] waiting.
    pub fn note_hits(&self, keys: impl IntoIterator<Item = String>) {
        let mut touches = self.touches.lock();
        let room = MAX_TOUCHES.saturating_sub(touches.len());
        touches.extend(keys.into_iter().take(room));
    }

    /// The hits noted since the last call.
    pub fn take_touches(&self) -> Vec<String> {
        std::mem::take(&mut *self.touches.lock())
    }

    /// Starts (or stops, dropping what was logged) recording changes.
    pub fn record_changes(&self, on: bool) {
        *self.changes.lock() = on.then(VecDeque::new);
    }

    /// Logs `keys` committed (`present`) or taken out of the books, when
    /// recording; past [`MAX_CHANGES`] the oldest are dropped.
    pub fn note_changes<'a>(&self, keys: impl IntoIterator<Item = &'a str>, present: bool) {
        let mut changes = self.changes.lock();
        let Some(log) = changes.as_mut() else {
            return;
        };
        for key in keys {
            if log.len() == MAX_CHANGES {
                log.pop_front();
            }
            log.push_back((key.to_string(), present));
        }
    }

    /// Moves the changes logged since the last call into `into`, oldest
    /// first.
    pub fn take_changes(&self, into: &mut Vec<(String, bool)>) {
        if let Some(log) = self.changes.lock().as_mut() {
            into.extend(log.drain(..));
        }
    }
}

#[cfg(all(test, not(any(kvtier_loom, kvtier_shuttle))))]
mod tests {
    use super::*;

    #[test]
    fn holds_count_and_the_last_one_lets_go() {
        let host = FleetHost::new();
        host.hold("a");
        host.hold("a");
        assert!(!host.unhold("a"));
        assert_eq!(host.held_keys(), vec!["a".to_string()]);
        assert!(host.unhold("a"));
        assert!(host.held_keys().is_empty());
        assert!(!host.unhold("a"), "a key not held lets nothing go");
    }

    #[test]
    fn touches_are_bounded_and_taken_once() {
        let host = FleetHost::new();
        host.note_hits((0..MAX_TOUCHES + 10).map(|n| n.to_string()));
        host.note_hits(["late".to_string()]);
        assert_eq!(host.take_touches().len(), MAX_TOUCHES);
        assert!(host.take_touches().is_empty());
    }

    #[test]
    fn changes_are_logged_only_while_recording_and_bounded() {
        let host = FleetHost::new();
        host.note_changes(["a"], true);
        let mut taken = Vec::new();
        host.take_changes(&mut taken);
        assert!(taken.is_empty(), "nothing is kept for nobody");
        host.record_changes(true);
        host.note_changes(["a", "b"], true);
        host.note_changes(["a"], false);
        host.take_changes(&mut taken);
        assert_eq!(
            taken,
            vec![("a".into(), true), ("b".into(), true), ("a".into(), false)]
        );
        let keys: Vec<String> = (0..MAX_CHANGES + 1).map(|n| n.to_string()).collect();
        host.note_changes(keys.iter().map(String::as_str), true);
        taken.clear();
        host.take_changes(&mut taken);
        assert_eq!(taken.len(), MAX_CHANGES);
        assert_eq!(taken[0].0, "1", "the oldest is dropped");
    }
}
