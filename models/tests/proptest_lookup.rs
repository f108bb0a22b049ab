//! proptest state-machine test: random operation sequences applied to the
//! real [`LookupTable`](kvtier::lookup::LookupTable) and to the specification,
//! compared after every step. A failure shrinks to a minimal sequence.
//!
//! The reference state machine is the specification plus the groups it has
//! submitted and not yet had answered, and the hit tickets it has handed out.
//! Answers arrive in any order, may be short, and carry any contents. Each
//! sequence runs under bounds drawn at its start (L13–L15): none, or a
//! budget of a few steps or ticks, room for a few keys and groups, unwanted
//! groups given up or not; flushes may say the time, and the prober may
//! claim any unanswered group at any point.
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_lookup`;
//! more cases: `PROPTEST_CASES=100000`.

use kvtier::{Ticket, Verdict, lookup::Group};
use kvtier_models::conformance::{Table, check_state, check_verdict};
use std::time::{Duration, Instant};

use kvtier_models::reference::{Expected, Key, ModelGroup, ModelLimits, Reference, Req};
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

/// Small domains, so keys are shared, reused and cleaned up often.
const KEYS: Key = 6;
const REQUESTS: Req = 4;

#[derive(Clone, Debug)]
enum Op {
    Lookup {
        key: Key,
        req: Req,
    },
    Flush,
    /// A flush that says the time: `advance` ticks after the last one.
    FlushAt {
        advance: u64,
    },
    /// The prober claims the `group`-th unanswered group; given up, it is
    /// answered `abandoned` at once.
    Claim {
        group: usize,
    },
    /// Answers the `group`-th unanswered group with `found` (short or long).
    Answer {
        group: usize,
        found: Vec<bool>,
    },
    /// `mark_miss` with the `ticket`-th hit ticket handed out.
    MarkMiss {
        ticket: usize,
    },
    MarkMissKeys {
        keys: Vec<Key>,
    },
    /// The tier's own news: a store of `keys` completed (`present`), or
    /// an eviction removed them.
    Settle {
        keys: Vec<Key>,
        present: bool,
    },
    Cleanup {
        req: Req,
    },
}

#[derive(Clone, Debug, Default)]
struct Model {
    spec: Reference,
    unanswered: Vec<ModelGroup>,
    /// (key, generation) of every hit handed out, in order.
    tickets: Vec<(Key, u64)>,
    /// What the last lookup answered.
    last_verdict: Option<Expected>,
    /// The time of the last timed flush, in ticks.
    now: u64,
}

/// Bounds for one sequence: the defaults, or tight ones.
fn limits() -> impl Strategy<Value = ModelLimits> {
    prop_oneof![
        Just(ModelLimits::default()),
        (
            prop::option::of(1..4u64),
            prop::option::of(1..5u64),
            1..7usize,
            1..4usize,
            any::<bool>(),
        )
            .prop_map(
                |(pending_steps, pending_time, max_keys, max_groups, skip_unwanted)| {
                    ModelLimits {
                        pending_steps,
                        pending_time,
                        max_keys,
                        max_groups,
                        skip_unwanted,
                    }
                }
            ),
    ]
}

struct LookupMachine;

impl ReferenceStateMachine for LookupMachine {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        limits()
            .prop_map(|limits| Model {
                spec: Reference::with_limits(limits),
                ..Model::default()
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        // Answers and mark_miss only when there is something to answer or a
        // ticket to use: generating them anyway would only be rejected.
        let mut choices: Vec<(u32, BoxedStrategy<Op>)> = vec![
            (
                6,
                (0..KEYS, 0..REQUESTS)
                    .prop_map(|(key, req)| Op::Lookup { key, req })
                    .boxed(),
            ),
            (1, Just(Op::Flush).boxed()),
            (
                1,
                (0..4u64)
                    .prop_map(|advance| Op::FlushAt { advance })
                    .boxed(),
            ),
            (
                1,
                prop::collection::vec(0..KEYS, 0..3)
                    .prop_map(|keys| Op::MarkMissKeys { keys })
                    .boxed(),
            ),
            (
                1,
                (prop::collection::vec(0..KEYS, 1..3), any::<bool>())
                    .prop_map(|(keys, present)| Op::Settle { keys, present })
                    .boxed(),
            ),
            (2, (0..REQUESTS).prop_map(|req| Op::Cleanup { req }).boxed()),
        ];
        if !state.unanswered.is_empty() {
            let answer = (
                0..state.unanswered.len(),
                prop::collection::vec(any::<bool>(), 0..5),
            )
                .prop_map(|(group, found)| Op::Answer { group, found });
            choices.push((3, answer.boxed()));
            let claim = (0..state.unanswered.len()).prop_map(|group| Op::Claim { group });
            choices.push((1, claim.boxed()));
        }
        if !state.tickets.is_empty() {
            let mark = (0..state.tickets.len()).prop_map(|ticket| Op::MarkMiss { ticket });
            choices.push((1, mark.boxed()));
        }
        prop::strategy::Union::new_weighted(choices).boxed()
    }

    fn preconditions(state: &Model, op: &Op) -> bool {
        match op {
            Op::Answer { group, .. } | Op::Claim { group } => *group < state.unanswered.len(),
            Op::MarkMiss { ticket } => *ticket < state.tickets.len(),
            _ => true,
        }
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        match op {
            Op::Lookup { key, req } => {
                let expected = state.spec.lookup(*key, *req);
                if let Expected::Hit(generation) = expected {
                    state.tickets.push((*key, generation));
                }
                state.last_verdict = Some(expected);
            }
            Op::Flush => {
                let groups = state.spec.take_submission();
                state.unanswered.extend(groups);
            }
            Op::FlushAt { advance } => {
                state.now += advance;
                let groups = state.spec.take_submission_at(Some(state.now));
                state.unanswered.extend(groups);
            }
            Op::Claim { group } => {
                let entries = state.unanswered[*group].1.clone();
                if !state.spec.claim(&entries) {
                    state.unanswered.remove(*group);
                    state.spec.apply_group(&entries, &[], true);
                }
            }
            Op::Answer { group, found } => {
                let (_, entries) = state.unanswered.remove(*group);
                state.spec.apply_group(&entries, found, false);
            }
            Op::MarkMiss { ticket } => {
                let (key, generation) = state.tickets[*ticket];
                state.spec.mark_miss(key, generation);
            }
            Op::MarkMissKeys { keys } => {
                state.spec.mark_miss_keys(keys);
            }
            Op::Settle { keys, present } => {
                state.spec.settle(keys, *present);
            }
            Op::Cleanup { req } => state.spec.cleanup(*req),
        }
        state
    }
}

struct Sut {
    table: Table,
    unanswered: Vec<Group<Key, Req>>,
    tickets: Vec<Ticket<Key>>,
    /// Tick 0 of the timed flushes.
    epoch: Instant,
}

struct TableTest;

impl StateMachineTest for TableTest {
    type SystemUnderTest = Sut;
    type Reference = LookupMachine;

    fn init_test(model: &Model) -> Sut {
        Sut {
            table: Table::with_limits(model.spec.limits.to_real()).expect("valid limits"),
            unanswered: Vec::new(),
            tickets: Vec::new(),
            epoch: Instant::now(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, op: Op) -> Sut {
        match op {
            Op::Lookup { key, req } => {
                let verdict = sut.table.lookup(&key, &req);
                let expected = model.last_verdict.expect("the model looked up too");
                if let Err(why) = check_verdict(&verdict, expected) {
                    panic!("lookup({key}, {req}): {why}");
                }
                if let Verdict::Hit(ticket) = verdict {
                    sut.tickets.push(ticket);
                }
            }
            Op::Flush | Op::FlushAt { .. } => {
                let submission = match op {
                    Op::FlushAt { .. } => sut
                        .table
                        .take_submission_at(sut.epoch + Duration::from_millis(model.now)),
                    _ => sut.table.take_submission(),
                };
                let groups = submission.map(|s| s.into_groups()).unwrap_or_default();
                sut.unanswered.extend(groups);
                let real: Vec<(Req, Vec<Key>)> = sut
                    .unanswered
                    .iter()
                    .map(|g| (*g.request(), g.keys().to_vec()))
                    .collect();
                let expected: Vec<(Req, Vec<Key>)> = model
                    .unanswered
                    .iter()
                    .map(|(req, entries)| (*req, entries.iter().map(|&(k, _)| k).collect()))
                    .collect();
                assert_eq!(real, expected, "unanswered groups after the flush");
            }
            Op::Claim { group } => {
                if !sut.unanswered[group].claim() {
                    let group = sut.unanswered.remove(group);
                    sut.table.apply(group.abandoned());
                }
                assert_eq!(
                    sut.unanswered.len(),
                    model.unanswered.len(),
                    "the claim disagrees with the specification"
                );
            }
            Op::Answer { group, found } => {
                let group = sut.unanswered.remove(group);
                sut.table.apply(group.answered(found));
            }
            Op::MarkMiss { ticket } => {
                let ticket = sut.tickets[ticket].clone();
                sut.table.mark_miss(&ticket);
            }
            Op::MarkMissKeys { keys } => {
                sut.table.mark_miss_keys(&keys);
            }
            Op::Settle { keys, present } => {
                sut.table.settle(&keys, present);
            }
            Op::Cleanup { req } => sut.table.cleanup(&req),
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        if let Err(why) = check_state(&sut.table, &model.spec) {
            panic!("{why}");
        }
        assert_eq!(sut.tickets.len(), model.tickets.len(), "hits handed out");
    }

    fn teardown(mut sut: Sut, model: Model) {
        // Liveness at the end of every sequence: answer everything still in
        // flight, end every request: nothing may remain.
        let _ = model;
        if let Some(submission) = sut.table.take_submission() {
            sut.unanswered.extend(submission.into_groups());
        }
        for group in sut.unanswered.drain(..) {
            sut.table.apply(group.failed());
        }
        for req in 0..REQUESTS {
            sut.table.cleanup(&req);
        }
        assert!(sut.table.is_empty(), "{} keys leaked", sut.table.len());
        assert_eq!(sut.table.stats().anomalies, 0);
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES overrides, as it does for proptest's default.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1024),
        max_shrink_iters: 20_000,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_table_follows_the_specification_step_by_step(sequential 1..80 => TableTest);
}
