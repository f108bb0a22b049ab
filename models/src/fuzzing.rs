//! The bodies of the cargo-fuzz targets in `fuzz/`, here so that a stable
//! `cargo test` (tests/fuzz_corpus.rs) replays the committed corpus through
//! exactly the code the fuzzer runs.

use arbitrary::{Arbitrary, Unstructured};

use kvtier::save::CompletionMode;

use crate::checked::CheckedDriver;
use crate::lockstep::{Lockstep, TableOp};
use crate::reference::{Key, ModelLimits, Req};
use crate::save_lockstep::{SaveLockstep, SaveOp};
use crate::scripted::{Fault, Script, mixed, quiet_scripted_panics};

/// Operations per input, at most: keeps every input fast.
const MAX_OPS: usize = 512;

/// `table_vs_reference`: an operation sequence applied to the real table and
/// to the specification under bounds the input picks, compared after every
/// operation; at the end every
/// request is cleaned up and every group answered, and nothing may remain.
pub fn table_vs_reference(data: &[u8]) {
    let mut input = Unstructured::new(data);
    // The first byte picks the domains: small ones collide more.
    let shape = u8::arbitrary(&mut input).unwrap_or(0);
    let keys = 1 + u64::from(shape & 0x0f);
    let requests = 1 + u64::from(shape >> 4);
    // The second byte picks the bounds: the defaults for 0, else a budget
    // of a few steps or ticks and room for a few keys and groups.
    let bounds = u8::arbitrary(&mut input).unwrap_or(0);
    let limits = match bounds {
        0 => ModelLimits::default(),
        b => ModelLimits {
            pending_steps: [None, Some(1), Some(2), Some(3)][usize::from(b & 3)],
            pending_time: [None, Some(1), Some(4), None][usize::from(b >> 2 & 3)],
            max_keys: 1 + usize::from(b >> 4 & 7),
            max_groups: 1 + usize::from(b >> 6 & 1) * 2,
            skip_unwanted: b & 0x80 == 0,
        },
    };
    let mut run = Lockstep::with_limits(keys, requests, limits);
    let mut trace = Vec::new();
    while trace.len() < MAX_OPS && !input.is_empty() {
        let Ok(op) = TableOp::arbitrary(&mut input) else {
            break;
        };
        if let Err(why) = run.apply(&op) {
            panic!(
                "operation {} ({op:?}): {why}\ntrace: {trace:?}",
                trace.len()
            );
        }
        trace.push(op);
    }
    if let Err(why) = run.finish() {
        panic!("at the end: {why}\ntrace: {trace:?}");
    }
}

/// One scheduler call on the threaded driver.
#[derive(Debug, Arbitrary)]
pub enum DriverOp {
    /// `lookup(key % 8, req % 4)`.
    Lookup {
        /// Key.
        key: u8,
        /// Request.
        req: u8,
    },
    /// `flush()`.
    Flush,
    /// `drain()`.
    Drain,
    /// `wait_idle()`.
    WaitIdle,
    /// `mark_miss` with one of the hit tickets seen.
    MarkMiss {
        /// Which ticket.
        ticket: u8,
    },
    /// `mark_miss_keys([key % 8])`.
    MarkMissKey {
        /// Key.
        key: u8,
    },
    /// `cleanup(req % 4)`.
    Cleanup {
        /// Request.
        req: u8,
    },
}

/// `driver_scripted`: scheduler calls on the real threaded driver whose
/// backend fails as the input scripts it (errors, panics in the call or
/// mid-answers, short and surplus answers), checked against the
/// specification after every call by [`CheckedDriver`]; the run ends with
/// every request cleaned up and the driver shut down, with nothing left.
pub fn driver_scripted(data: &[u8]) {
    quiet_scripted_panics();
    let mut input = Unstructured::new(data);
    let faults: Vec<Fault> = Vec::arbitrary(&mut input).unwrap_or_default();
    let mut driver = CheckedDriver::new(Script::new(mixed).with_faults(faults));
    let mut ops = 0;
    while ops < MAX_OPS && !input.is_empty() {
        let Ok(op) = DriverOp::arbitrary(&mut input) else {
            break;
        };
        ops += 1;
        match op {
            DriverOp::Lookup { key, req } => {
                driver.lookup(Key::from(key % 8), Req::from(req % 4));
            }
            DriverOp::Flush => {
                driver.flush();
            }
            DriverOp::Drain => {
                driver.drain();
            }
            DriverOp::WaitIdle => driver.wait_idle(),
            DriverOp::MarkMiss { ticket } => {
                driver.mark_miss_ticket(usize::from(ticket));
            }
            DriverOp::MarkMissKey { key } => {
                driver.mark_miss_keys(&[Key::from(key % 8)]);
            }
            DriverOp::Cleanup { req } => driver.cleanup(Req::from(req % 4)),
        }
    }
    driver.finish();
}

/// `save_vs_reference`: an operation sequence on the real save-completion
/// halves (one scheduler, one to three workers, blocking or not) and the
/// specification, compared after every operation, with S1–S6 checked
/// against the scripted store; at the end every request finishes and every
/// save completes, and every delayed request must have been freed once per
/// worker, every task waited and every handle released exactly once.
pub fn save_vs_reference(data: &[u8]) {
    quiet_scripted_panics();
    let mut input = Unstructured::new(data);
    // The first byte picks the mode and the number of workers.
    let shape = u8::arbitrary(&mut input).unwrap_or(0);
    let mode = if shape & 1 == 0 {
        CompletionMode::NonBlocking
    } else {
        CompletionMode::Blocking
    };
    let workers = 1 + usize::from((shape >> 1) % 3);
    let mut run = SaveLockstep::new(mode, workers);
    let mut trace = Vec::new();
    while trace.len() < MAX_OPS && !input.is_empty() {
        let Ok(op) = SaveOp::arbitrary(&mut input) else {
            break;
        };
        if let Err(why) = run.apply(&op) {
            panic!(
                "{mode:?}, {workers} workers, operation {} ({op:?}): {why}\ntrace: {trace:?}",
                trace.len()
            );
        }
        trace.push(op);
    }
    if let Err(why) = run.finish_run() {
        panic!("{mode:?}, {workers} workers, at the end: {why}\ntrace: {trace:?}");
    }
}

/// `block_decoder`: arbitrary bytes, as a file or object holding them would
/// hand them over, through kvtier's block decoder. It never panics (a
/// header may promise any length); whatever decodes re-encodes to the same
/// bytes; every payload round-trips; and a header without the magic is a
/// foreign block whatever follows.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
pub fn block_decoder(data: &[u8]) {
    use kvtier::block::{self, Corruption, HEADER_LEN};

    match block::decode(data) {
        Ok(payload) => assert_eq!(block::encode(payload), data, "decoded, re-encoded"),
        Err(corruption) => assert!(!corruption.to_string().is_empty()),
    }
    assert_eq!(block::decode(&block::encode(data)), Ok(data), "round trip");
    if let Some(header) = data.first_chunk::<HEADER_LEN>() {
        match block::payload_length(header) {
            Err(kind) => assert_eq!(block::decode(data), Err(kind)),
            Ok(length) if length != (data.len() - HEADER_LEN) as u64 => assert!(matches!(
                block::decode(data),
                Err(Corruption::Truncated { .. } | Corruption::Trailing { .. })
            )),
            Ok(_) => {}
        }
    }
}

/// `vllm_block_path`: arbitrary bytes as a path below a rank directory
/// (what a directory walk or a change log could hand over), through the
/// vLLM layout's path-to-key parser. It never panics; a key it finds is
/// stored at exactly that path; and the first bytes, read as a key, come
/// back from the path of that key.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
pub fn vllm_block_path(data: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use kvtier::tier::VllmFsLayout;

    let layout = VllmFsLayout::new("/rank").expect("a valid rank directory");
    let path = Path::new("/rank").join(std::ffi::OsStr::from_bytes(data));
    if let Some(key) = layout.key_of(&path) {
        assert_eq!(layout.path_of(&key).expect("a key it found"), path);
    }
    let key = &data[..data.len().min(40)];
    if let Ok(path) = layout.path_of(key) {
        assert_eq!(layout.key_of(&path).as_deref(), Some(key), "round trip");
    }
}

/// `wire_decoder`: arbitrary bytes, as a pipe or socket from another
/// process would hand them over, through the save protocol's message
/// decoders, for every id type. It never panics and never allocates beyond
/// the input (a list may claim any length); whatever decodes re-encodes to
/// the same bytes (the format has one encoding per value); a valid header
/// whose declared length disagrees with the input is a length mismatch; and
/// reading the bytes as a stream of messages consumes them front to back
/// without reading past a message.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
pub fn wire_decoder(data: &[u8]) {
    use kvtier::SaveStep;
    use kvtier::save::WorkerReport;
    use kvtier::save::wire::{self, HEADER_LEN, WireError};

    fn canonical<T: std::fmt::Debug>(
        data: &[u8],
        decoded: Result<T, WireError>,
        encode: impl Fn(&T) -> Result<Vec<u8>, WireError>,
    ) -> bool {
        match decoded {
            Ok(value) => {
                assert_eq!(
                    encode(&value).as_deref(),
                    Ok(data),
                    "decoded {value:?}, re-encoded"
                );
                true
            }
            Err(error) => {
                assert!(!error.to_string().is_empty());
                false
            }
        }
    }

    let decoded = [
        canonical(data, SaveStep::<u64>::decode(data), SaveStep::encode),
        canonical(data, SaveStep::<String>::decode(data), SaveStep::encode),
        canonical(data, SaveStep::<Vec<u8>>::decode(data), SaveStep::encode),
        canonical(
            data,
            WorkerReport::<u64>::decode(data),
            WorkerReport::encode,
        ),
        canonical(
            data,
            WorkerReport::<String>::decode(data),
            WorkerReport::encode,
        ),
        canonical(
            data,
            WorkerReport::<Vec<u8>>::decode(data),
            WorkerReport::encode,
        ),
    ];
    // Every message names its kind and its id kind, even one without ids:
    // at most one of the six decoders reads any bytes.
    assert!(decoded.iter().filter(|ok| **ok).count() <= 1, "{decoded:?}");
    if let Ok((_, declared)) = wire::parse_header(data)
        && declared != data.len() - HEADER_LEN
    {
        assert!(matches!(
            SaveStep::<u64>::decode(data),
            Err(WireError::LengthMismatch { .. } | WireError::WrongKind { .. })
        ));
    }
    let mut stream = data;
    let mut message = Vec::new();
    while let Ok(Some(_)) = wire::read_message(&mut stream, &mut message) {
        assert!(message.len() >= HEADER_LEN && message.len() <= data.len());
        let _ = SaveStep::<String>::decode(&message);
        let _ = WorkerReport::<String>::decode(&message);
    }
}
