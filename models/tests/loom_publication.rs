//! loom model of the publication stack (`src/publish.rs`) with two
//! producers: the drivers have one producer each, so only this model makes
//! a push's compare-and-swap fail and retry (L7). The model's body is the
//! library's (`publish::two_producers_racing_their_pushes`), which reaches
//! the stack's private type.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_publication -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5` (the default bound here is 3), or
//! `KVTIER_LOOM_EXHAUSTIVE=1` for no bound at all.
#![cfg(kvtier_loom)]

use kvtier_models::checkers::explore;

/// Two producers race their pushes while the consumer takes: every value
/// is taken exactly once, each producer's in its push order, and the
/// consumer's reads of the nodes see the producers' writes.
#[test]
fn two_producers_racing_their_pushes_lose_nothing() {
    explore(
        "two_producers_racing_their_pushes_lose_nothing",
        kvtier::loom_publication_two_producers,
    );
}
