//! The wire form of the save protocol's messages, for a scheduler and its
//! workers in separate processes: the scheduler encodes each [`SaveStep`]
//! once and sends the bytes to every worker; each worker sends back one
//! [`WorkerReport`] per step.
//!
//! A hand-written codec rather than serde: the layout below is the contract
//! between processes that may run different builds, so it is written down
//! byte by byte and owned here, not derived from struct definitions a
//! refactor could change; it needs no dependency; and the decoder, written
//! against that layout, is small enough to fuzz to the bottom (no input
//! makes it panic or accept a message it would not encode itself).
//!
//! # What a message costs
//!
//! A decoded message holds at most [`MAX_COST_PER_BYTE`] bytes of memory
//! per byte of its body, plus [`COST_ALLOWANCE`]: each id is counted as its
//! slot in its list and its own allocation (as glibc lays it out), before
//! either is made, and a message past its budget is refused with
//! [`WireError::TooCostly`]. Without it, a body of empty string ids (one
//! byte each on the wire, 24 bytes each decoded) would cost 24 times its
//! size. Ids of a few bytes and more (vLLM's are 40 or so) stay far below
//! the budget; an encoder refuses the messages a decoder would, so a
//! scheduler never sends one its workers cannot take.
//!
//! # Layout (version 1)
//!
//! Every message starts with a 10-byte header:
//!
//! | offset | size | field                                       |
//! |--------|------|---------------------------------------------|
//! | 0      | 4    | magic `KVTW`                                |
//! | 4      | 1    | version, 1                                  |
//! | 5      | 1    | kind: 1 step, 2 report                      |
//! | 6      | 4    | body length, u32 little-endian (≤ 64 MiB)   |
//!
//! The body is a sequence of fields. Integers are unsigned LEB128 varints
//! in their shortest form; a *list* is a varint count followed by that many
//! ids; the *id kind* byte says how ids are written: 1 `u64` (8 bytes,
//! big-endian), 2 UTF-8 string, 3 raw bytes (both a varint length, then the
//! bytes).
//!
//! - **Step** (kind 1): sequence number, id kind, the saving requests, the
//!   preempted requests, the finished requests (three lists).
//! - **Report** (kind 2): worker index, step number, id kind, the finished
//!   requests whose saves are done (a list), the counters (a varint count,
//!   16 in version 1, then each counter of [`SaveStats`] in its declared
//!   order), the save latency histogram (a varint count of non-empty
//!   buckets, then for each a bucket index byte and a count, indices
//!   strictly ascending and below [`SaveLatency::BUCKETS`]).
//!
//! Nothing may follow the last field. Each value has exactly one encoding,
//! so a message that decodes re-encodes to the same bytes.
//!
//! # Versioning
//!
//! Within a version the layout never changes. A change of layout — a new
//! field, a new counter, a new id kind — is a new version number, and a
//! decoder refuses versions it does not know with
//! [`WireError::UnsupportedVersion`]: an old worker facing a new scheduler
//! stops at its first message instead of misreading it. Integrity is the
//! transport's (pipes, Unix or TCP sockets); the codec checks structure.
//!
//! ```
//! use kvtier::{SaveScheduler, SaveStep};
//!
//! let mut scheduler = SaveScheduler::new();
//! let step = scheduler.record_step([("req-1".to_string(), 4)]);
//! let bytes = step.encode()?;
//! assert_eq!(&bytes[..4], b"KVTW");
//!
//! let decoded = SaveStep::<String>::decode(&bytes)?;
//! assert_eq!(decoded, step);
//! assert!(SaveStep::<u64>::decode(&bytes).is_err()); // ids of another kind
//! # Ok::<(), kvtier::save::wire::WireError>(())
//! ```

mod codec;
mod format;

use std::io::{self, Read};

#[doc(hidden)]
pub use codec::Reader;
pub use codec::WireId;
use codec::{put_list, put_varint};
pub use format::{
    COST_ALLOWANCE, HEADER_LEN, IdKind, MAGIC, MAX_BODY, MAX_COST_PER_BYTE, MessageKind, ReadError,
    VERSION, WireError,
};

use super::report::WorkerReport;
use super::scheduler::SaveStep;
use super::stats::{SaveLatency, SaveStats};

/// Counters in a version-1 report.
const COUNTERS: u64 = 16;

/// Checks a message header and returns the kind and declared body length.
/// Looks at the first [`HEADER_LEN`] bytes only.
pub fn parse_header(bytes: &[u8]) -> Result<(MessageKind, usize), WireError> {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(WireError::NoHeader { len: bytes.len() });
    };
    let magic = [header[0], header[1], header[2], header[3]];
    if magic != MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    // guard: W1-version-checked
    if header[4] != VERSION {
        return Err(WireError::UnsupportedVersion { found: header[4] });
    }
    let kind = match header[5] {
        1 => MessageKind::Step,
        2 => MessageKind::Report,
        found => return Err(WireError::UnknownKind { found }),
    };
    let declared = u32::from_le_bytes([header[6], header[7], header[8], header[9]]) as usize;
    if declared > MAX_BODY {
        return Err(WireError::TooLong { declared });
    }
    Ok((kind, declared))
}

/// Reads one whole message from a stream into `message` (replacing its
/// contents), checking its header first so a bad length never makes it
/// read or allocate more than [`MAX_BODY`]. `Ok(None)` at a clean end of
/// the stream (no byte of a new message); an end inside a message is an
/// [`io::ErrorKind::UnexpectedEof`] error. The body is decoded by the
/// message type's `decode`.
pub fn read_message(
    reader: &mut impl Read,
    message: &mut Vec<u8>,
) -> Result<Option<MessageKind>, ReadError> {
    message.clear();
    message.resize(HEADER_LEN, 0);
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut message[filled..]) {
            Ok(0) if filled == 0 => {
                message.clear();
                return Ok(None);
            }
            Ok(0) => {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the stream ended {filled} bytes into a message header"),
                )));
            }
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(ReadError::Io(error)),
        }
    }
    let (kind, declared) = parse_header(message)?;
    message.resize(HEADER_LEN + declared, 0);
    reader.read_exact(&mut message[HEADER_LEN..])?;
    Ok(Some(kind))
}

/// Starts a message: the header with a placeholder length.
fn begin(out: &mut Vec<u8>, kind: MessageKind) -> usize {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind.byte());
    out.extend_from_slice(&[0; 4]);
    start
}

/// Writes the body length into the header begun at `start`; a body over
/// [`MAX_BODY`], or whose ids would cost a decoder more than its budget
/// (`cost`, see [What a message costs](self#what-a-message-costs)), is taken
/// back out of `out` and refused.
fn end(out: &mut Vec<u8>, start: usize, cost: usize) -> Result<(), WireError> {
    let body = out.len() - start - HEADER_LEN;
    // guard: W3-encoder-refuses-oversized
    if body > MAX_BODY {
        out.truncate(start);
        return Err(WireError::TooLong { declared: body });
    }
    // guard: W4-encoder-refuses-too-costly
    if cost > codec::budget(body) {
        out.truncate(start);
        return Err(WireError::TooCostly {
            at: HEADER_LEN,
            budget: codec::budget(body),
        });
    }
    out[start + 6..start + 10].copy_from_slice(&(body as u32).to_le_bytes());
    Ok(())
}

/// Checks the header of a message of `kind` and returns a reader over its
/// body.
fn open(bytes: &[u8], kind: MessageKind) -> Result<Reader<'_>, WireError> {
    let (found, declared) = parse_header(bytes)?;
    if found != kind {
        return Err(WireError::WrongKind {
            expected: kind,
            found,
        });
    }
    let actual = bytes.len() - HEADER_LEN;
    if declared != actual {
        return Err(WireError::LengthMismatch { declared, actual });
    }
    Ok(Reader::new(&bytes[HEADER_LEN..], HEADER_LEN))
}

fn id_kind<R: WireId>(body: &mut Reader<'_>) -> Result<(), WireError> {
    let found = body.byte()?;
    if found != R::KIND.byte() {
        return Err(WireError::IdKind {
            expected: R::KIND,
            found,
        });
    }
    Ok(())
}

impl<R: WireId> SaveStep<R> {
    /// The step as a version-1 message (see the [module docs](self) for the
    /// layout); [`WireError::TooLong`] if its body would exceed
    /// [`MAX_BODY`] (about a million 64-byte ids in one step),
    /// [`WireError::TooCostly`] if its ids would cost a decoder more than
    /// its budget (see [What a message costs](self#what-a-message-costs)).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Appends the step's message to `out` (reusing its allocation); on an
    /// error `out` is left as it was.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let start = begin(out, MessageKind::Step);
        put_varint(out, self.step);
        out.push(R::KIND.byte());
        put_list(out, &self.requests);
        put_list(out, &self.preempted);
        put_list(out, &self.finished);
        let cost = codec::cost_of(&[&self.requests, &self.preempted, &self.finished]);
        end(out, start, cost)
    }

    /// Decodes a step message; any other bytes give a [`WireError`], never
    /// a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut body = open(bytes, MessageKind::Step)?;
        let step = body.varint()?;
        id_kind::<R>(&mut body)?;
        let requests = body.list()?;
        let preempted = body.list()?;
        let finished = body.list()?;
        body.finish()?;
        Ok(Self {
            step,
            requests,
            preempted,
            finished,
        })
    }
}

/// The counters of a report, in their wire order (`SaveStats`'s field order).
fn counters(stats: &SaveStats) -> [u64; COUNTERS as usize] {
    stats.counters().map(|(_, value)| value)
}

fn stats_from(values: [u64; COUNTERS as usize]) -> SaveStats {
    let [
        steps,
        recorded,
        tasks_submitted,
        submit_failures,
        tasks_reaped,
        tasks_waited,
        task_failures,
        task_timeouts,
        tasks_abandoned,
        task_panics,
        reported,
        deferred,
        not_delayed,
        repeated_finishes,
        unrecorded_saves,
        preemption_fences,
    ] = values;
    SaveStats {
        steps,
        recorded,
        tasks_submitted,
        submit_failures,
        tasks_reaped,
        tasks_waited,
        task_failures,
        task_timeouts,
        tasks_abandoned,
        task_panics,
        reported,
        deferred,
        not_delayed,
        repeated_finishes,
        unrecorded_saves,
        preemption_fences,
    }
}

fn put_latency(out: &mut Vec<u8>, latency: &SaveLatency) {
    let buckets = latency.buckets();
    put_varint(
        out,
        buckets.iter().filter(|count| **count > 0).count() as u64,
    );
    for (index, count) in buckets.iter().enumerate() {
        if *count > 0 {
            out.push(index as u8);
            put_varint(out, *count);
        }
    }
}

fn take_latency(body: &mut Reader<'_>) -> Result<SaveLatency, WireError> {
    let at = body.position();
    let filled = body.varint()?;
    if filled > SaveLatency::BUCKETS as u64 {
        return Err(WireError::BadField {
            field: "bucket count",
            at,
        });
    }
    let mut latency = SaveLatency::default();
    let mut next = 0usize;
    for _ in 0..filled {
        let at = body.position();
        let index = body.byte()? as usize;
        // guard: W2-histogram-canonical
        if index < next || index >= SaveLatency::BUCKETS {
            return Err(WireError::BadField {
                field: "bucket index",
                at,
            });
        }
        let at = body.position();
        let count = body.varint()?;
        if count == 0 {
            return Err(WireError::BadField {
                field: "bucket count",
                at,
            });
        }
        latency.buckets[index] = count;
        next = index + 1;
    }
    Ok(latency)
}

impl<R: WireId> WorkerReport<R> {
    /// The report as a version-1 message (see the [module docs](self));
    /// [`WireError::TooLong`] if its body would exceed [`MAX_BODY`],
    /// [`WireError::TooCostly`] if its ids would cost a decoder more than
    /// its budget.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Appends the report's message to `out`; on an error `out` is left as
    /// it was.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let start = begin(out, MessageKind::Report);
        put_varint(out, u64::from(self.worker));
        put_varint(out, self.step);
        out.push(R::KIND.byte());
        put_list(out, &self.finished);
        put_varint(out, COUNTERS);
        for value in counters(&self.stats) {
            put_varint(out, value);
        }
        put_latency(out, &self.latency);
        end(out, start, codec::cost_of(&[&self.finished]))
    }

    /// Decodes a report message; any other bytes give a [`WireError`],
    /// never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut body = open(bytes, MessageKind::Report)?;
        let at = body.position();
        let worker = u32::try_from(body.varint()?).map_err(|_| WireError::BadField {
            field: "worker",
            at,
        })?;
        let step = body.varint()?;
        id_kind::<R>(&mut body)?;
        let finished = body.list()?;
        let at = body.position();
        if body.varint()? != COUNTERS {
            return Err(WireError::BadField {
                field: "counter count",
                at,
            });
        }
        let mut values = [0u64; COUNTERS as usize];
        for value in &mut values {
            *value = body.varint()?;
        }
        let latency = take_latency(&mut body)?;
        body.finish()?;
        Ok(WorkerReport {
            worker,
            step,
            finished,
            stats: stats_from(values),
            latency,
        })
    }
}

#[cfg(test)]
mod tests;
