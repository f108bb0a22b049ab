//! loom models of what a host keeps beside the fleet's books
//! (`kvtier::capacity::FleetHost`), shared by its transfers' tasks: a
//! key is renewed while any of its holds remains, and every change logged
//! is taken exactly once, however the tasks interleave.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_fleet_host -- --nocapture`
#![cfg(kvtier_loom)]

use kvtier::capacity::FleetHost;
use kvtier_models::checkers::explore;
use loom::sync::Arc;
use loom::thread;

/// A read holds block "k" (a pin) while another read of it comes and goes
/// and the upkeep takes the keys to renew: "k" is among them, and the
/// first read's release is the one that lets go.
#[test]
fn a_key_is_renewed_while_any_hold_of_it_remains() {
    explore("a_key_is_renewed_while_any_hold_of_it_remains", || {
        let host = Arc::new(FleetHost::new());
        host.hold("k");
        let other = {
            let host = host.clone();
            thread::spawn(move || {
                host.hold("k");
                host.unhold("k")
            })
        };
        let renewed = host.held_keys();
        let other_let_go = other.join().unwrap();
        assert_eq!(renewed, vec!["k".to_string()], "a held key is renewed");
        assert!(!other_let_go, "the other read's release is not the last");
        assert!(host.unhold("k"), "the last release lets go");
        assert!(host.held_keys().is_empty());
    });
}

/// A commit and an eviction logged by two tasks while the scheduler takes
/// the changes twice: each change is taken once, and each task's own
/// changes keep their order.
#[test]
fn every_change_is_taken_once_in_each_tasks_order() {
    explore("every_change_is_taken_once_in_each_tasks_order", || {
        let host = Arc::new(FleetHost::new());
        host.record_changes(true);
        let tasks: Vec<_> = [("a", "b"), ("c", "d")]
            .into_iter()
            .map(|(first, second)| {
                let host = host.clone();
                thread::spawn(move || {
                    host.note_changes([first], true);
                    host.note_changes([second], false);
                })
            })
            .collect();
        let mut taken = Vec::new();
        host.take_changes(&mut taken);
        for task in tasks {
            task.join().unwrap();
        }
        host.take_changes(&mut taken);
        let position = |key: &str| taken.iter().position(|(k, _)| k == key).unwrap();
        assert_eq!(taken.len(), 4, "{taken:?}");
        assert!(position("a") < position("b") && position("c") < position("d"));
        assert!(
            taken
                .iter()
                .all(|(key, present)| *present == (key == "a" || key == "c"))
        );
    });
}
