//! The header's constants, the kinds of message and of request id, and why
//! bytes are not a message.

use std::io;

/// The first four bytes of every message.
pub const MAGIC: [u8; 4] = *b"KVTW";
/// The layout version this build writes and reads.
pub const VERSION: u8 = 1;
/// The header's length.
pub const HEADER_LEN: usize = 10;
/// The longest body a message may declare.
pub const MAX_BODY: usize = 64 << 20;
/// The memory a decoded message may hold per byte of its body (see
/// [What a message costs](super#what-a-message-costs)).
pub const MAX_COST_PER_BYTE: usize = 8;
/// The memory any message may hold beyond [`MAX_COST_PER_BYTE`] per byte:
/// small messages of short ids always decode.
pub const COST_ALLOWANCE: usize = 1 << 20;
/// What a message holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageKind {
    /// A [`SaveStep`](crate::save::SaveStep), scheduler to worker.
    Step,
    /// A [`WorkerReport`](crate::save::WorkerReport), worker to scheduler.
    Report,
}

impl MessageKind {
    pub(super) fn byte(self) -> u8 {
        match self {
            Self::Step => 1,
            Self::Report => 2,
        }
    }
}

/// How a message writes its request ids (see [`WireId`](super::WireId)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdKind {
    /// `u64`, 8 bytes big-endian.
    U64,
    /// `String`, UTF-8 with a varint length.
    Utf8,
    /// `Vec<u8>`, raw bytes with a varint length.
    Bytes,
}

impl IdKind {
    pub(super) fn byte(self) -> u8 {
        match self {
            Self::U64 => 1,
            Self::Utf8 => 2,
            Self::Bytes => 3,
        }
    }
}

/// Why bytes are not a message of the expected kind. Positions are byte
/// offsets in the whole message, header included.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than a header.
    #[error("{len} bytes is shorter than a message header ({HEADER_LEN} bytes)")]
    NoHeader {
        /// The length given.
        len: usize,
    },
    /// Not a kvtier message.
    #[error("not a kvtier message: magic {found:02x?}")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A layout version this build does not know.
    #[error("message version {found}, but this build reads version {VERSION} only")]
    UnsupportedVersion {
        /// The version byte.
        found: u8,
    },
    /// A kind byte no version-1 message has.
    #[error("unknown message kind {found}")]
    UnknownKind {
        /// The kind byte.
        found: u8,
    },
    /// A message of another kind than the one decoded.
    #[error("expected a {expected:?} message, found a {found:?}")]
    WrongKind {
        /// The kind asked for.
        expected: MessageKind,
        /// The kind in the header.
        found: MessageKind,
    },
    /// A body longer than [`MAX_BODY`]: declared by a header, or what an
    /// encoder was asked to write.
    #[error("a {declared}-byte message body, more than the {MAX_BODY} allowed")]
    TooLong {
        /// The body length.
        declared: usize,
    },
    /// Decoding (or a decoder of) the message would hold more memory than
    /// its budget: [`MAX_COST_PER_BYTE`] per byte of body plus
    /// [`COST_ALLOWANCE`].
    #[error("the value at byte {at} takes the message past its memory budget of {budget} bytes")]
    TooCostly {
        /// Where the value that did not fit starts (the header's length for
        /// an encoder).
        at: usize,
        /// The message's budget.
        budget: usize,
    },
    /// The body is not as long as the header declares.
    #[error("the header declares a {declared}-byte body but {actual} bytes follow it")]
    LengthMismatch {
        /// The declared body length.
        declared: usize,
        /// The bytes after the header.
        actual: usize,
    },
    /// A field runs past the end of the body.
    #[error("a field at byte {at} needs {needed} more bytes than the message has")]
    Truncated {
        /// Where the field starts.
        at: usize,
        /// How many bytes are missing.
        needed: usize,
    },
    /// A varint longer than 64 bits or not in its shortest form.
    #[error("bad varint at byte {at}")]
    BadVarint {
        /// Where it starts.
        at: usize,
    },
    /// Ids of another kind than the decoder's id type.
    #[error("the message carries {found}-kind ids, expected {expected:?}")]
    IdKind {
        /// The decoder's id kind.
        expected: IdKind,
        /// The kind byte in the message.
        found: u8,
    },
    /// An id that is not valid for its kind (a string that is not UTF-8).
    #[error("the id at byte {at} is not valid UTF-8")]
    BadId {
        /// Where the id starts.
        at: usize,
    },
    /// A field whose value no valid message has: a worker index beyond
    /// `u32`, a counter count other than the version's, a histogram bucket
    /// out of range, out of order or empty.
    #[error("bad {field} at byte {at}")]
    BadField {
        /// Which field.
        field: &'static str,
        /// Where it starts.
        at: usize,
    },
    /// Bytes after the last field.
    #[error("trailing bytes after the last field, at byte {at}")]
    TrailingBytes {
        /// Where they start.
        at: usize,
    },
}

/// Why [`read_message`](super::read_message) did not return a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The reader failed, or ended inside a message.
    #[error("reading a message failed: {0}")]
    Io(#[from] io::Error),
    /// The header is not a valid one.
    #[error(transparent)]
    Wire(#[from] WireError),
}
