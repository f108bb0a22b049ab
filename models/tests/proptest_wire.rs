//! proptest: the save protocol's wire form. Every step and report
//! round-trips for every id type; a message with any byte changed either
//! fails to decode or decodes to a value that encodes to exactly the
//! changed bytes (one encoding per value); every cut of a message fails; a
//! stream of messages delivered in arbitrary chunks is read back whole and
//! in order.
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_wire`;
//! more cases: `PROPTEST_CASES=100000`.

use std::io::Read;

use kvtier::save::wire::{self, MessageKind, WireError, WireId};
use kvtier::save::{SaveLatency, SaveStats, WorkerReport};
use kvtier::{SaveScheduler, SaveStep};
use proptest::prelude::*;

/// A step made the only way a scheduler makes one: `skip` earlier steps,
/// `finished` recorded in one of them and finished, `preempted` noted.
fn step_of<R>(skip: usize, saving: Vec<R>, preempted: Vec<R>, finished: Vec<R>) -> SaveStep<R>
where
    R: Eq + std::hash::Hash + Clone + std::fmt::Debug,
{
    let mut scheduler = SaveScheduler::new();
    scheduler.record_step(finished.iter().cloned().map(|r| (r, 1)));
    for _ in 0..skip {
        scheduler.record_step([]);
    }
    for request in &finished {
        scheduler.request_finished(request);
    }
    scheduler.preempt(&preempted);
    scheduler.record_step(saving.into_iter().map(|r| (r, 1)))
}

fn ids<R: std::fmt::Debug>(id: impl Strategy<Value = R>) -> impl Strategy<Value = Vec<R>> {
    prop::collection::vec(id, 0..6)
}

fn steps<R>(id: impl Strategy<Value = R> + Clone) -> impl Strategy<Value = SaveStep<R>>
where
    R: Eq + std::hash::Hash + Clone + std::fmt::Debug,
{
    (0..200usize, ids(id.clone()), ids(id.clone()), ids(id))
        .prop_map(|(skip, saving, preempted, finished)| step_of(skip, saving, preempted, finished))
}

fn reports() -> impl Strategy<Value = WorkerReport<u64>> {
    (
        any::<u32>(),
        any::<u64>(),
        ids(any::<u64>()),
        prop::collection::vec(any::<u64>(), 16),
        prop::collection::vec(0..1u64 << 42, 0..20),
    )
        .prop_map(|(worker, step, finished, counters, latencies)| {
            let mut stats = SaveStats::default();
            let fields = [
                &mut stats.steps,
                &mut stats.recorded,
                &mut stats.tasks_submitted,
                &mut stats.submit_failures,
                &mut stats.tasks_reaped,
                &mut stats.tasks_waited,
                &mut stats.task_failures,
                &mut stats.task_timeouts,
                &mut stats.tasks_abandoned,
                &mut stats.task_panics,
                &mut stats.reported,
                &mut stats.deferred,
                &mut stats.not_delayed,
                &mut stats.repeated_finishes,
                &mut stats.unrecorded_saves,
                &mut stats.preemption_fences,
            ];
            for (field, value) in fields.into_iter().zip(counters) {
                *field = value;
            }
            let mut latency = SaveLatency::default();
            for micros in latencies {
                latency.record(std::time::Duration::from_micros(micros));
            }
            WorkerReport::new(worker, step, finished, stats, latency)
        })
}

fn round_trips<R: WireId + PartialEq + std::fmt::Debug>(
    step: &SaveStep<R>,
) -> Result<(), TestCaseError> {
    let bytes = step.encode().unwrap();
    let decoded = SaveStep::<R>::decode(&bytes);
    prop_assert_eq!(decoded.as_ref(), Ok(step));
    prop_assert_eq!(
        wire::parse_header(&bytes),
        Ok((MessageKind::Step, bytes.len() - wire::HEADER_LEN))
    );
    Ok(())
}

/// Every single-byte change decodes to an error or to a value encoding to
/// the changed bytes; every cut fails.
fn changes_are_caught<T: std::fmt::Debug>(
    bytes: &[u8],
    at: usize,
    value: u8,
    decode: impl Fn(&[u8]) -> Result<T, WireError>,
    encode: impl Fn(&T) -> Result<Vec<u8>, WireError>,
) -> Result<(), TestCaseError> {
    let at = at % bytes.len();
    let mut changed = bytes.to_vec();
    changed[at] = value;
    if let Ok(decoded) = decode(&changed) {
        prop_assert_eq!(encode(&decoded), Ok(changed));
    }
    prop_assert!(decode(&bytes[..at]).is_err(), "cut at {}", at);
    Ok(())
}

/// Hands out its bytes in the chunk sizes given, cycling.
struct Chunked<'a> {
    bytes: &'a [u8],
    sizes: Vec<usize>,
    turn: usize,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.turn % self.sizes.len()]
            .min(buf.len())
            .min(self.bytes.len());
        self.turn += 1;
        buf[..size].copy_from_slice(&self.bytes[..size]);
        self.bytes = &self.bytes[size..];
        Ok(size)
    }
}

proptest! {
    #[test]
    fn steps_round_trip_for_every_id_type(
        numbers in steps(any::<u64>()),
        strings in steps(".{0,12}"),
        raw in steps(prop::collection::vec(any::<u8>(), 0..9)),
    ) {
        round_trips(&numbers)?;
        round_trips(&strings)?;
        round_trips(&raw)?;
        // Each type reads only its own ids.
        let other = matches!(SaveStep::<String>::decode(&numbers.encode().unwrap()), Err(WireError::IdKind { .. }));
        prop_assert!(other, "u64 ids read as strings");
        let other = matches!(SaveStep::<u64>::decode(&raw.encode().unwrap()), Err(WireError::IdKind { .. }));
        prop_assert!(other, "raw ids read as u64");
    }

    #[test]
    fn reports_round_trip(report in reports()) {
        let bytes = report.encode().unwrap();
        prop_assert_eq!(WorkerReport::<u64>::decode(&bytes), Ok(report));
        let wrong = matches!(SaveStep::<u64>::decode(&bytes), Err(WireError::WrongKind { .. }));
        prop_assert!(wrong, "a report read as a step");
    }

    #[test]
    fn a_changed_or_cut_message_is_refused_or_re_encodes_to_itself(
        step in steps(".{0,6}"),
        report in reports(),
        at in any::<usize>(),
        value in any::<u8>(),
    ) {
        changes_are_caught(&step.encode().unwrap(), at, value, SaveStep::<String>::decode, SaveStep::encode)?;
        changes_are_caught(&report.encode().unwrap(), at, value, WorkerReport::<u64>::decode, WorkerReport::encode)?;
    }

    #[test]
    fn a_stream_read_in_any_chunks_gives_back_every_message_in_order(
        messages in prop::collection::vec(prop_oneof![
            steps(any::<u64>()).prop_map(|step| step.encode().unwrap()),
            reports().prop_map(|report| report.encode().unwrap()),
        ], 0..6),
        sizes in prop::collection::vec(1..40usize, 1..5),
    ) {
        let stream: Vec<u8> = messages.concat();
        let mut reader = Chunked { bytes: &stream, sizes, turn: 0 };
        let mut message = Vec::new();
        for expected in &messages {
            let kind = wire::read_message(&mut reader, &mut message).unwrap();
            prop_assert!(kind.is_some());
            prop_assert_eq!(&message, expected);
        }
        prop_assert!(wire::read_message(&mut reader, &mut message).unwrap().is_none());
    }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A version-1 report with no ids and zero counters whose histogram is the
/// given (index, count) entries, written as they come: what the decoder
/// must take exactly when a canonical encoder could have written it.
fn report_with_histogram(entries: &[(u8, u64)]) -> Vec<u8> {
    let mut body = vec![0, 0, 1, 0, 16];
    body.extend_from_slice(&[0; 16]);
    varint(&mut body, entries.len() as u64);
    for (index, count) in entries {
        body.push(*index);
        varint(&mut body, *count);
    }
    let mut message = b"KVTW\x01\x02".to_vec();
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(&body);
    message
}

proptest! {
    #[test]
    fn a_histogram_is_taken_only_in_its_one_encoding(
        entries in prop::collection::vec((0..44u8, 0..4u64), 0..6),
    ) {
        let bytes = report_with_histogram(&entries);
        let canonical = entries.windows(2).all(|pair| pair[0].0 < pair[1].0)
            && entries.iter().all(|(index, count)| (*index as usize) < SaveLatency::BUCKETS && *count > 0);
        match WorkerReport::<u64>::decode(&bytes) {
            Ok(report) => {
                prop_assert!(canonical, "{:?} taken", entries);
                prop_assert_eq!(report.encode().unwrap(), bytes);
                let buckets = report.latency.buckets();
                for (index, count) in &entries {
                    prop_assert_eq!(buckets[*index as usize], *count);
                }
            }
            Err(error) => {
                prop_assert!(!canonical, "{:?} refused: {}", entries, error);
                let refused = matches!(error, WireError::BadField { .. });
                prop_assert!(refused, "{:?}: {}", entries, error);
            }
        }
    }
}
