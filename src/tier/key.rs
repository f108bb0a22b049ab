//! How a block's key becomes a name in a tier.

use std::fmt::Write as _;

/// A key a tier can store a block under: anything with a stable lowercase
/// hexadecimal name (a block hash).
///
/// The name places the block in a two-level directory fan-out, so no
/// directory grows beyond 4096 × 256 entries' worth of blocks:
/// `<namespace>/<hex[..3]>/<hex[3..5]>/<hex>.bin`. Implemented for `u64`
/// and `u128` (fixed width, zero-padded), byte arrays and byte vectors (a
/// SHA-256 block hash is `[u8; 32]`).
///
/// ```
/// use kvtier::BlockKey;
///
/// assert_eq!(0xabcdef_u64.hex(), "0000000000abcdef");
/// assert_eq!([0xde, 0xad, 0xbe, 0xef].hex(), "deadbeef");
/// ```
pub trait BlockKey {
    /// The key's name: lowercase hex digits, never empty.
    fn hex(&self) -> String;
}

impl BlockKey for u64 {
    fn hex(&self) -> String {
        format!("{self:016x}")
    }
}

impl BlockKey for u128 {
    fn hex(&self) -> String {
        format!("{self:032x}")
    }
}

impl BlockKey for [u8] {
    fn hex(&self) -> String {
        let mut hex = String::with_capacity(2 * self.len().max(1));
        for byte in self {
            let _ = write!(hex, "{byte:02x}");
        }
        if hex.is_empty() {
            hex.push('0');
        }
        hex
    }
}

impl<const N: usize> BlockKey for [u8; N] {
    fn hex(&self) -> String {
        self.as_slice().hex()
    }
}

impl BlockKey for Vec<u8> {
    fn hex(&self) -> String {
        self.as_slice().hex()
    }
}

impl<K: BlockKey + ?Sized> BlockKey for &K {
    fn hex(&self) -> String {
        (**self).hex()
    }
}

/// The path of a block below its namespace, `/`-separated:
/// `<hex[..3]>/<hex[3..5]>/<hex>.bin`. Names shorter than five digits are
/// zero-padded for the fan-out only.
pub(crate) fn block_path(key: &(impl BlockKey + ?Sized)) -> String {
    let hex = key.hex();
    let padded = format!("{hex:0>5}");
    format!("{}/{}/{hex}.bin", &padded[..3], &padded[3..5])
}

/// Checks a namespace: non-empty `/`-separated components, none empty, `.`
/// or `..`, none with a backslash or NUL, so a namespace can never climb out
/// of the tier's root.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), String> {
    if namespace.is_empty() {
        return Err("the namespace is empty".into());
    }
    for component in namespace.split('/') {
        match component {
            "" => return Err(format!("namespace {namespace:?} has an empty component")),
            "." | ".." => {
                return Err(format!(
                    "namespace {namespace:?} may not contain `.` or `..` components"
                ));
            }
            _ if component.contains(['\\', '\0']) => {
                return Err(format!(
                    "namespace {namespace:?} may not contain backslashes or NUL"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fan_out_by_the_first_five_hex_digits() {
        assert_eq!(block_path(&0x1234_5678_u64), "000/00/0000000012345678.bin");
        assert_eq!(block_path(&[0xab, 0xcd, 0xef]), "abc/de/abcdef.bin");
        // Short names are padded for the fan-out, not in the file name.
        assert_eq!(block_path(&[0x0f_u8]), "000/0f/0f.bin");
        assert_eq!(block_path(&Vec::<u8>::new()), "000/00/0.bin");
        assert_eq!(u128::MAX.hex().len(), 32);
    }

    #[test]
    fn namespaces_cannot_escape_the_root() {
        assert!(check_namespace("llama-3-8b/cfg-9f2c/rank0").is_ok());
        for bad in ["", "a//b", "../x", "a/./b", "/abs", "a/", "a\\b", "a\0b"] {
            assert!(check_namespace(bad).is_err(), "{bad:?} accepted");
        }
    }
}
