//! proptest: random operation sequences on the real save-completion halves
//! (one scheduler, one to three workers, blocking and non-blocking) compared
//! with the specification after every operation, S1–S6 checked against the
//! scripted store's log; see `kvtier_models::save_lockstep`. A failure
//! shrinks to a minimal sequence.
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_save`;
//! more cases: `PROPTEST_CASES=100000`.

use kvtier::save::CompletionMode;
use kvtier_models::save_lockstep::{SLOTS, SaveLockstep, SaveOp};
use kvtier_models::save_scripted::Ending;
use kvtier_models::scripted::quiet_scripted_panics;
use proptest::prelude::*;

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        8 => Just(Ending::Ok),
        1 => Just(Ending::Fails),
        1 => Just(Ending::TimesOut),
        1 => Just(Ending::Abandoned),
        1 => Just(Ending::PanicsInWait),
        1 => Just(Ending::PanicsInCheck),
    ]
}

fn op() -> impl Strategy<Value = SaveOp> {
    let slot = 0..SLOTS as u8;
    prop_oneof![
        3 => prop::collection::vec((slot, 0..3u8), 0..5).prop_map(|saves| SaveOp::Step { saves }),
        4 => (any::<u8>(), any::<u8>(), prop::bool::weighted(0.05), ending())
            .prop_map(|(worker, pick, stray, ending)| SaveOp::Submit { worker, pick, stray, ending }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(worker, pick)| SaveOp::Refuse { worker, pick }),
        4 => any::<u8>().prop_map(|task| SaveOp::IoEnds { task }),
        2 => any::<u8>().prop_map(|worker| SaveOp::Poll { worker }),
        3 => (1..64u8).prop_map(|pick| SaveOp::Finish { pick }),
        2 => any::<u8>().prop_map(|worker| SaveOp::GetFinished { worker }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(worker, which)| SaveOp::Repeat { worker, which }),
        1 => (1..64u8).prop_map(|pick| SaveOp::Preempt { pick }),
    ]
}

fn mode() -> impl Strategy<Value = CompletionMode> {
    prop_oneof![
        Just(CompletionMode::NonBlocking),
        Just(CompletionMode::Blocking)
    ]
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn save_tracking_matches_the_specification(
        mode in mode(),
        workers in 1..=3usize,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        quiet_scripted_panics();
        let mut run = SaveLockstep::new(mode, workers);
        for (index, op) in ops.iter().enumerate() {
            if let Err(why) = run.apply(op) {
                return Err(TestCaseError::fail(format!("operation {index} ({op:?}): {why}")));
            }
        }
        if let Err(why) = run.finish_run() {
            return Err(TestCaseError::fail(format!("at the end: {why}")));
        }
    }
}
