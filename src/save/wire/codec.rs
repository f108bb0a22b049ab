//! The primitives of the wire format: canonical varints, request ids, and a
//! reader that never reads past its input.

use super::format::{COST_ALLOWANCE, IdKind, MAX_COST_PER_BYTE, WireError};

/// A request id type with a wire form: `u64` (8 bytes, big-endian), `String`
/// (UTF-8) and `Vec<u8>` (raw bytes). The kind is written once per message,
/// so a worker decoding ids of another type gets [`WireError::IdKind`]
/// instead of misreading them. Sealed: convert your own id type to one of
/// these at the process boundary.
pub trait WireId: Sized + sealed::Sealed {
    /// The kind byte written in messages carrying ids of this type.
    const KIND: IdKind;

    #[doc(hidden)]
    fn put(&self, out: &mut Vec<u8>);

    #[doc(hidden)]
    fn take(input: &mut Reader<'_>) -> Result<Self, WireError>;

    /// The memory a decoded id holds: its slot in a list and its heap
    /// allocation (see [`heap_cost`]).
    #[doc(hidden)]
    fn cost(&self) -> usize;

    /// The fewest bytes one id takes on the wire (bounds a list's claimed
    /// length by what is left of the message).
    #[doc(hidden)]
    const MIN_LEN: usize;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u64 {}
    impl Sealed for String {}
    impl Sealed for Vec<u8> {}
}

impl WireId for u64 {
    const KIND: IdKind = IdKind::U64;
    const MIN_LEN: usize = 8;

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let bytes = input.bytes(8)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(array))
    }

    fn cost(&self) -> usize {
        size_of::<Self>()
    }
}

impl WireId for String {
    const KIND: IdKind = IdKind::Utf8;
    const MIN_LEN: usize = 1;

    fn put(&self, out: &mut Vec<u8>) {
        put_varint(out, self.len() as u64);
        out.extend_from_slice(self.as_bytes());
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let at = input.position();
        let len = input.length()?;
        input.charge(heap_cost(len), at)?;
        let bytes = input.bytes(len)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.to_owned()),
            Err(_) => Err(WireError::BadId { at }),
        }
    }

    fn cost(&self) -> usize {
        size_of::<Self>() + heap_cost(self.len())
    }
}

impl WireId for Vec<u8> {
    const KIND: IdKind = IdKind::Bytes;
    const MIN_LEN: usize = 1;

    fn put(&self, out: &mut Vec<u8>) {
        put_varint(out, self.len() as u64);
        out.extend_from_slice(self);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let at = input.position();
        let len = input.length()?;
        input.charge(heap_cost(len), at)?;
        Ok(input.bytes(len)?.to_vec())
    }

    fn cost(&self) -> usize {
        size_of::<Self>() + heap_cost(self.len())
    }
}

/// What an allocation of `len` bytes holds, as glibc's allocator lays it
/// out: nothing for an empty id, else `len` plus an 8-byte header rounded
/// up to 16, at least 32.
pub(crate) fn heap_cost(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        len.saturating_add(8).next_multiple_of(16).max(32)
    }
}

/// What decoding a body of `body` bytes may hold in memory:
/// [`MAX_COST_PER_BYTE`] bytes per byte of body,
/// plus [`COST_ALLOWANCE`].
pub(crate) fn budget(body: usize) -> usize {
    body.saturating_mul(MAX_COST_PER_BYTE)
        .saturating_add(COST_ALLOWANCE)
}

/// What the ids of `lists` hold once decoded (the encoder's side of the
/// budget: it refuses what a decoder would).
pub(crate) fn cost_of<R: WireId>(lists: &[&[R]]) -> usize {
    lists
        .iter()
        .flat_map(|list| list.iter())
        .fold(0usize, |total, id| total.saturating_add(id.cost()))
}

/// Appends `value` as an unsigned LEB128 varint: 7 bits a byte, low bits
/// first, the high bit set on every byte but the last.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a list: its length, then each id.
pub(crate) fn put_list<R: WireId>(out: &mut Vec<u8>, ids: &[R]) {
    put_varint(out, ids.len() as u64);
    for id in ids {
        id.put(out);
    }
}

/// Reads a message body front to back. Every read is checked against what
/// is left, so no input makes it index out of bounds or allocate more than
/// the input could describe.
#[doc(hidden)]
#[derive(Debug)]
pub struct Reader<'a> {
    input: &'a [u8],
    /// Offset of `input[0]` in the whole message, for error positions.
    base: usize,
    at: usize,
    /// Bytes of memory the decoded values may still take (see [`budget`]).
    budget: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(input: &'a [u8], base: usize) -> Self {
        Self {
            input,
            base,
            at: 0,
            budget: budget(input.len()),
        }
    }

    /// Takes `bytes` of memory out of the budget before they are allocated
    /// for the value at `at`.
    pub(crate) fn charge(&mut self, bytes: usize, at: usize) -> Result<(), WireError> {
        // guard: W4-decoding-within-the-memory-budget
        match self.budget.checked_sub(bytes) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(WireError::TooCostly {
                at,
                budget: budget(self.input.len()),
            }),
        }
    }

    /// The position in the whole message.
    pub(crate) fn position(&self) -> usize {
        self.base + self.at
    }

    pub(crate) fn remaining(&self) -> usize {
        self.input.len() - self.at
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if len > self.remaining() {
            return Err(WireError::Truncated {
                at: self.position(),
                needed: len - self.remaining(),
            });
        }
        let bytes = &self.input[self.at..self.at + len];
        self.at += len;
        Ok(bytes)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }

    /// A canonical varint: at most 10 bytes, no bits beyond 64, and no
    /// redundant trailing zero byte — so every value has one encoding and a
    /// decoded message re-encodes to the bytes it came from.
    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        let at = self.position();
        let mut value = 0u64;
        for index in 0..10 {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds bit 63 only.
            if index == 9 && byte > 1 {
                return Err(WireError::BadVarint { at });
            }
            value |= bits << (7 * index);
            if byte & 0x80 == 0 {
                if byte == 0 && index > 0 {
                    return Err(WireError::BadVarint { at });
                }
                return Ok(value);
            }
        }
        Err(WireError::BadVarint { at })
    }

    /// A length that must fit in what is left of the message.
    pub(crate) fn length(&mut self) -> Result<usize, WireError> {
        let at = self.position();
        let len = self.varint()?;
        match usize::try_from(len) {
            Ok(len) if len <= self.remaining() => Ok(len),
            _ => Err(WireError::Truncated {
                at,
                needed: usize::try_from(len)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(self.remaining()),
            }),
        }
    }

    /// A list of ids; its claimed length is checked against the bytes left
    /// before anything is allocated.
    pub(crate) fn list<R: WireId>(&mut self) -> Result<Vec<R>, WireError> {
        let at = self.position();
        let count = self.varint()?;
        let fits = usize::try_from(count)
            .ok()
            .and_then(|count| count.checked_mul(R::MIN_LEN))
            .is_some_and(|bytes| bytes <= self.remaining());
        // guard: W3-list-bounded-by-input
        if !fits {
            return Err(WireError::Truncated {
                at,
                needed: usize::try_from(count)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(R::MIN_LEN)
                    .saturating_sub(self.remaining()),
            });
        }
        self.charge((count as usize).saturating_mul(size_of::<R>()), at)?;
        let mut ids = Vec::with_capacity(count as usize);
        for _ in 0..count {
            ids.push(R::take(self)?);
        }
        Ok(ids)
    }

    /// The end of the body: nothing may follow the last field.
    pub(crate) fn finish(&self) -> Result<(), WireError> {
        if self.remaining() > 0 {
            return Err(WireError::TrailingBytes {
                at: self.position(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_of(bytes: &[u8]) -> Result<u64, WireError> {
        let mut reader = Reader::new(bytes, 0);
        let value = reader.varint()?;
        reader.finish()?;
        Ok(value)
    }

    #[test]
    fn varints_round_trip_at_every_length() {
        for value in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(varint_of(&out), Ok(value), "{value} as {out:?}");
        }
        let mut out = Vec::new();
        put_varint(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn a_varint_has_one_encoding_and_no_more_than_64_bits() {
        // 0 written in two bytes, 1 in three.
        assert_eq!(
            varint_of(&[0x80, 0x00]),
            Err(WireError::BadVarint { at: 0 })
        );
        assert_eq!(
            varint_of(&[0x81, 0x80, 0x00]),
            Err(WireError::BadVarint { at: 0 })
        );
        // Bit 64 set in the tenth byte; an eleventh byte.
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert_eq!(varint_of(&over), Err(WireError::BadVarint { at: 0 }));
        assert_eq!(varint_of(&[0xff; 11]), Err(WireError::BadVarint { at: 0 }));
        assert!(matches!(
            varint_of(&[0x80]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn a_list_longer_than_its_message_is_refused_before_allocating() {
        let mut out = Vec::new();
        put_varint(&mut out, u64::MAX / 2);
        let mut reader = Reader::new(&out, 0);
        assert!(matches!(
            reader.list::<u64>(),
            Err(WireError::Truncated { at: 0, .. })
        ));
        let mut reader = Reader::new(&[2, 1, b'a'], 0);
        assert!(matches!(
            reader.list::<String>(),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn strings_must_be_utf8() {
        let mut reader = Reader::new(&[2, 0xff, 0xfe], 10);
        assert_eq!(String::take(&mut reader), Err(WireError::BadId { at: 10 }));
    }
}
