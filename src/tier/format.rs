//! The on-tier block format: a 16-byte header, then the payload.
//!
//! `KVT1` magic, payload length (u64, little-endian), CRC-32 of the payload
//! (u32, little-endian). A file cut short by a crash or a full disk, a file
//! some other program put there, and bit rot are all told apart from a good
//! block on load, and reported instead of handed to the model.

/// Identifies a kvtier block, format version 1.
const MAGIC: &[u8; 4] = b"KVT1";
/// Bytes before the payload.
pub const HEADER_LEN: usize = 16;

/// Why stored bytes are not a valid block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// Shorter than its header says: cut short while written, or truncated.
    #[error("truncated: {found} bytes where the header promises {expected}")]
    Truncated {
        /// Bytes the header (or the header itself) requires.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// Longer than its header says.
    #[error("{extra} unexpected bytes after the payload")]
    Trailing {
        /// Bytes beyond the payload.
        extra: u64,
    },
    /// Not a kvtier block (no `KVT1` magic).
    #[error("not a kvtier block (no KVT1 header)")]
    Foreign,
    /// The payload does not match its checksum.
    #[error("checksum mismatch: the payload is damaged")]
    Checksum,
    /// A raw block (vLLM's format: the bytes alone, no header) whose size is
    /// not the tier's block size.
    #[error("a raw block of {found} bytes where the tier's blocks are {expected} bytes")]
    BlockSize {
        /// The tier's block size.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The header promises a payload above the tier's maximum block size:
    /// refused before anything is read or allocated for it.
    #[error("the header promises {length} bytes, above the {limit}-byte block limit")]
    TooLarge {
        /// Payload bytes the header promises.
        length: u64,
        /// The tier's limit.
        limit: u64,
    },
}

/// The header that precedes `payload` when it is stored.
pub(crate) fn header(payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut header = [0; HEADER_LEN];
    header[..4].copy_from_slice(MAGIC);
    header[4..12].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[12..16].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header
}

/// The stored form of `payload`: the header, then the payload.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut block = Vec::with_capacity(HEADER_LEN + payload.len());
    block.extend_from_slice(&header(payload));
    block.extend_from_slice(payload);
    block
}

/// The payload length a block's header promises: `Foreign` unless `header`
/// starts with the magic. Reading a block from a file checks this before it
/// reads (or allocates for) the payload.
pub fn payload_length(header: &[u8; HEADER_LEN]) -> Result<u64, Corruption> {
    if &header[..MAGIC.len()] != MAGIC {
        return Err(Corruption::Foreign);
    }
    Ok(u64::from_le_bytes(
        header[4..12].try_into().expect("8 bytes"),
    ))
}

/// The payload of a stored block, checked against its header: the magic, the
/// length (neither shorter nor longer) and the checksum. Any bytes at all
/// give a payload or a [`Corruption`], never a panic.
///
/// ```
/// use kvtier::block::{self, Corruption};
///
/// let stored = block::encode(b"kv block");
/// assert_eq!(block::decode(&stored), Ok(&b"kv block"[..]));
/// assert_eq!(block::decode(b"GIF89a, not a block"), Err(Corruption::Foreign));
/// ```
pub fn decode(block: &[u8]) -> Result<&[u8], Corruption> {
    let Some(header) = block.first_chunk::<HEADER_LEN>() else {
        // Too short to tell apart from a foreign file only if it does not
        // start like one of ours.
        if MAGIC.starts_with(&block[..block.len().min(MAGIC.len())]) {
            return Err(Corruption::Truncated {
                expected: HEADER_LEN as u64,
                found: block.len() as u64,
            });
        }
        return Err(Corruption::Foreign);
    };
    let length = payload_length(header)?;
    let checksum = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
    let payload = &block[HEADER_LEN..];
    let found = payload.len() as u64;
    // guard: F2-length
    if found < length {
        return Err(Corruption::Truncated {
            // A header may promise anything up to u64::MAX.
            expected: length.saturating_add(HEADER_LEN as u64),
            found: found + HEADER_LEN as u64,
        });
    }
    if found > length {
        return Err(Corruption::Trailing {
            extra: found - length,
        });
    }
    // guard: F2-checksum
    if crc32fast::hash(payload) != checksum {
        return Err(Corruption::Checksum);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_every_damage_is_named() {
        let block = encode(b"kv block");
        assert_eq!(decode(&block), Ok(&b"kv block"[..]));
        assert_eq!(decode(&encode(b"")), Ok(&b""[..]));

        assert_eq!(
            decode(&block[..block.len() - 1]),
            Err(Corruption::Truncated {
                expected: 24,
                found: 23
            })
        );
        assert_eq!(
            decode(&block[..10]),
            Err(Corruption::Truncated {
                expected: 16,
                found: 10
            })
        );
        assert_eq!(
            decode(&[]),
            Err(Corruption::Truncated {
                expected: 16,
                found: 0
            })
        );
        let mut longer = block.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(Corruption::Trailing { extra: 1 }));
        assert_eq!(decode(b"GIF89a, not a block"), Err(Corruption::Foreign));
        let mut flipped = block.clone();
        flipped[HEADER_LEN] ^= 1;
        assert_eq!(decode(&flipped), Err(Corruption::Checksum));
    }

    #[test]
    fn a_header_promising_any_length_is_truncated_not_an_overflow() {
        for promised in [u64::MAX, u64::MAX - 15, u64::MAX - 16, 1 << 63] {
            let mut block = encode(b"short");
            block[4..12].copy_from_slice(&promised.to_le_bytes());
            assert_eq!(
                decode(&block),
                Err(Corruption::Truncated {
                    expected: promised.saturating_add(16),
                    found: 21
                }),
                "{promised}"
            );
        }
    }
}
