//! The fleet's books: the real script (src/tier/fleet/books.lua) on a real
//! Valkey against the reference model (models/src/fleet_reference.rs), one
//! random sequence of operations at a time, every answer compared. Leases
//! are 0 (over at once) or an hour, so the server's clock decides nothing
//! the model does not; lease expiry in between is the model test's.
//!
//! Needs a Valkey (tests/common/valkey.rs); skips with the reason without.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

#[path = "../../tests/common/valkey.rs"]
mod valkey;

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier::tier::fleet::{FleetBooks, IndexTimeouts, Op, Reply};
use kvtier_models::fleet_reference::FleetReference;
use proptest::prelude::*;

const HOUR: u64 = 3_600_000;
const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
const TOKENS: [&str; 3] = ["t0", "t1", "t2"];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(str::to_string)
}

fn keys() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(key(), 0..4)
}

fn token() -> impl Strategy<Value = String> {
    prop::sample::select(&TOKENS[..]).prop_map(str::to_string)
}

fn lease() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(HOUR), 1 => Just(0)]
}

fn bytes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(100u64), Just(200), Just(300), Just(700)]
}

/// One step: the operation (`None`: the server loses the books, as a
/// restart without persistence or a flush does) and whether the caller's
/// epoch is the books' (false: a stale host's).
fn step() -> impl Strategy<Value = (Option<Op>, bool)> {
    let op = prop_oneof![
        1 => Just(Op::Status),
        1 => (prop::sample::select(&["h0", "h1"][..]), prop_oneof![Just(400u64), Just(600)])
            .prop_map(|(holder, capacity)| Op::BeginRebuild {
                holder: holder.to_string(),
                lease_ms: HOUR,
                epoch: "e-next".to_string(),
                capacity,
            }),
        1 => (prop::sample::select(&["h0", "h1"][..]), prop::collection::vec((key(), bytes()), 0..4))
            .prop_map(|(holder, blocks)| Op::RebuildAdd { holder: holder.to_string(), blocks }),
        1 => prop::sample::select(&["h0", "h1"][..])
            .prop_map(|holder| Op::RebuildEnd { holder: holder.to_string() }),
        3 => keys().prop_map(|keys| Op::Lookup { keys }),
        2 => keys().prop_map(|keys| Op::Touch { keys }),
        1 => keys().prop_map(|keys| Op::Unlisted { keys }),
        6 => (key(), bytes(), token(), lease())
            .prop_map(|(key, bytes, token, lease_ms)| Op::Reserve { key, bytes, token, lease_ms }),
        4 => (key(), token()).prop_map(|(key, token)| Op::Commit { key, token }),
        3 => (token(), keys()).prop_map(|(token, keys)| Op::Release { token, keys }),
        1 => (token(), lease(), keys())
            .prop_map(|(token, lease_ms, keys)| Op::Renew { token, lease_ms, keys }),
        2 => (key(), token(), lease())
            .prop_map(|(key, token, lease_ms)| Op::Pin { key, token, lease_ms }),
        1 => (key(), token()).prop_map(|(key, token)| Op::Unpin { key, token }),
        1 => key().prop_map(|key| Op::Forget { key }),
        1 => (token(), lease()).prop_map(|(token, lease_ms)| Op::ClaimExpired { token, lease_ms, limit: 100 }),
        1 => (prop_oneof![Just(300u64), Just(500), Just(1000)], token(), lease())
            .prop_map(|(capacity, token, lease_ms)| Op::SetCapacity { capacity, token, lease_ms }),
    ];
    (
        prop_oneof![1 => Just(None), 80 => op.prop_map(Some)],
        prop::bool::weighted(0.9),
    )
}

/// Claims compared as sets: the server orders entries that expired in the
/// same sequence by their (real) deadlines, the model's clock stands still.
fn normalized(reply: Reply) -> Reply {
    match reply {
        Reply::Claimed(mut claimed) => {
            claimed.sort();
            Reply::Claimed(claimed)
        }
        other => other,
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

#[test]
fn the_script_on_valkey_answers_as_the_reference_model() {
    let Some(server) = valkey::ValkeyServer::start("fleet_differential") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let books = runtime
        .block_on(FleetBooks::connect(
            &server.url,
            "differential",
            IndexTimeouts::default(),
        ))
        .unwrap();
    // A fixed seed: the same sequences every run, so a mutation's verdict
    // does not depend on the draw (PROPTEST_RNG_SEED picks others).
    let config = ProptestConfig {
        cases: 600,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            std::env::var("PROPTEST_RNG_SEED")
                .ok()
                .and_then(|seed| seed.parse().ok())
                .unwrap_or(43),
        ),
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in prop::collection::vec(step(), 1..60))| {
        CASE.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(books.wipe()).unwrap();
        let mut model = FleetReference::default();
        // Every case starts as hosts find empty books: one rebuilds them.
        let start = Op::BeginRebuild {
            holder: "h0".into(), lease_ms: HOUR, epoch: "e0".into(), capacity: 600,
        };
        let mut epoch = "e0".to_string();
        for op in [start, Op::RebuildEnd { holder: "h0".into() }] {
            let real = runtime.block_on(books.call(&epoch, &op)).unwrap();
            prop_assert_eq!(&real, &model.apply(&epoch, &op, 1_000));
        }
        for (i, (op, current)) in steps.iter().enumerate() {
            let Some(op) = op else {
                runtime.block_on(books.wipe()).unwrap();
                model = FleetReference::default();
                continue;
            };
            let caller = if *current { epoch.clone() } else { "e-stale".to_string() };
            let real = normalized(runtime.block_on(books.call(&caller, op)).unwrap());
            let expected = normalized(model.apply(&caller, op, 1_000));
            prop_assert_eq!(&real, &expected, "step {} {:?} (epoch {})", i, op, caller);
            if let Reply::Rebuild(new) = &real {
                epoch = new.clone();
            }
        }
        let status = runtime.block_on(books.call(&epoch, &Op::Status)).unwrap();
        prop_assert_eq!(status, model.apply(&epoch, &Op::Status, 1_000));
    });
    assert!(CASE.load(Ordering::Relaxed) >= 600);
}
