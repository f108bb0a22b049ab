//! What the workers save: one block per saving request and step, named and
//! filled so the scheduler can find it on disk; and the workload's random
//! numbers.

/// The namespace of rank `rank`'s blocks under the shared root.
pub(crate) fn rank_namespace(rank: u32) -> String {
    format!("rank{rank}")
}

/// The key of the block `request` saves in step `step` (FNV-1a over the id,
/// mixed with the step).
pub(crate) fn block_key(request: &str, step: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in request.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix(hash ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A block's bytes: its key, repeated; the blocks whose key is a multiple
/// of 5 (about one in five) are 16 times longer.
pub(crate) fn block_payload(key: u64, bytes: usize) -> Vec<u8> {
    let len = if key.is_multiple_of(5) {
        bytes * 16
    } else {
        bytes
    };
    let mut payload = key.to_le_bytes().repeat(len.div_ceil(8));
    payload.truncate(len);
    payload
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The workload's random numbers.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.0 = splitmix(self.0);
        self.0 % 100 < percent
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 = splitmix(self.0);
        self.0 % n.max(1)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_keys_differ_by_request_and_step() {
        assert_ne!(block_key("req-1", 0), block_key("req-1", 1));
        assert_ne!(block_key("req-1", 0), block_key("req-2", 0));
        assert_eq!(block_key("req-1", 7), block_key("req-1", 7));
        assert_eq!(block_payload(5, 8).len(), 128);
        assert_eq!(block_payload(6, 8).len(), 8);
    }
}
