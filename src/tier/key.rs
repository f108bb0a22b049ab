//! How a block's key becomes a name in a tier.

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

    /// Appends the key's name (the digits [`hex`](Self::hex) returns) to
    /// `out`. The tiers name blocks through this, into buffers they reuse;
    /// the default calls `hex`, so override it to avoid that allocation.
    ///
    /// ```
    /// use kvtier::BlockKey;
    ///
    /// let mut name = String::from("block-");
    /// 0xabcdef_u64.write_hex(&mut name);
    /// assert_eq!(name, "block-0000000000abcdef");
    /// ```
    fn write_hex(&self, out: &mut String) {
        out.push_str(&self.hex());
    }
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends the `2 * bytes.len()` hex digits of `bytes`, most significant
/// nibble first.
pub(crate) fn push_hex_bytes(bytes: &[u8], out: &mut String) {
    out.reserve(2 * bytes.len());
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

impl BlockKey for u64 {
    fn hex(&self) -> String {
        let mut hex = String::with_capacity(16);
        self.write_hex(&mut hex);
        hex
    }

    fn write_hex(&self, out: &mut String) {
        push_hex_bytes(&self.to_be_bytes(), out);
    }
}

impl BlockKey for u128 {
    fn hex(&self) -> String {
        let mut hex = String::with_capacity(32);
        self.write_hex(&mut hex);
        hex
    }

    fn write_hex(&self, out: &mut String) {
        push_hex_bytes(&self.to_be_bytes(), out);
    }
}

impl BlockKey for [u8] {
    fn hex(&self) -> String {
        let mut hex = String::with_capacity(2 * self.len().max(1));
        self.write_hex(&mut hex);
        hex
    }

    fn write_hex(&self, out: &mut String) {
        if self.is_empty() {
            out.push('0');
        }
        push_hex_bytes(self, out);
    }
}

impl<const N: usize> BlockKey for [u8; N] {
    fn hex(&self) -> String {
        self.as_slice().hex()
    }

    fn write_hex(&self, out: &mut String) {
        self.as_slice().write_hex(out);
    }
}

impl BlockKey for Vec<u8> {
    fn hex(&self) -> String {
        self.as_slice().hex()
    }

    fn write_hex(&self, out: &mut String) {
        self.as_slice().write_hex(out);
    }
}

impl<K: BlockKey + ?Sized> BlockKey for &K {
    fn hex(&self) -> String {
        (**self).hex()
    }

    fn write_hex(&self, out: &mut String) {
        (**self).write_hex(out);
    }
}

/// Appends the path of `key`'s block below its namespace to `out`,
/// `/`-separated: `<hex[..3]>/<hex[3..5]>/<hex>.bin`. Names shorter than
/// five digits are zero-padded for the fan-out only. Allocates nothing when
/// `out` has room.
pub(crate) fn push_block_path(key: &(impl BlockKey + ?Sized), out: &mut String) {
    let start = out.len();
    out.push_str("000/00/");
    let name = out.len();
    key.write_hex(out);
    // The fan-out is the name's first five characters, zero-padded in
    // front. Counted in characters, so a key type whose name breaks the
    // hex-digit contract gets an odd path, never a panic.
    let digits = out[name..].chars().take(5).count();
    if digits > 0 {
        let mut fan = [0u8; 24]; // 5 characters of up to 4 bytes, 2 `/`
        let mut len = 0;
        let mut chars = out[name..].chars();
        for position in 0..5 {
            if position == 3 {
                fan[len] = b'/';
                len += 1;
            }
            let digit = if position < 5 - digits {
                '0'
            } else {
                chars.next().unwrap_or('0')
            };
            len += digit.encode_utf8(&mut fan[len..]).len();
        }
        fan[len] = b'/';
        len += 1;
        if let Ok(fan) = std::str::from_utf8(&fan[..len]) {
            out.replace_range(start..name, fan);
        }
    }
    out.push_str(".bin");
}

/// [`push_block_path`] into a new string.
#[cfg(test)]
pub(crate) fn block_path(key: &(impl BlockKey + ?Sized)) -> String {
    let mut path = String::new();
    push_block_path(key, &mut path);
    path
}

/// The longest namespace component: what a file system takes as a name.
const MAX_COMPONENT: usize = 255;

/// Checks a namespace: non-empty `/`-separated components, none empty, `.`
/// or `..`, none with a backslash or NUL, none longer than a file name, so a
/// namespace can never climb out of the tier's root and is always a path.
/// The error says what is wrong.
///
/// ```
/// use kvtier::tier::check_namespace;
///
/// assert!(check_namespace("llama-3-8b/9f2c1e/rank0").is_ok());
/// assert!(check_namespace("../etc").is_err());
/// ```
pub fn check_namespace(namespace: &str) -> Result<(), String> {
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
            _ if component.len() > MAX_COMPONENT => {
                return Err(format!(
                    "namespace component {:?}... is {} bytes long; at most {MAX_COMPONENT} fit a file name",
                    component.chars().take(16).collect::<String>(),
                    component.len()
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

    /// The names as the first version of the tiers spelled them, with
    /// `format!`: stored blocks must keep their names.
    fn formatted(hex: &str) -> String {
        let padded = format!("{hex:0>5}");
        format!("{}/{}/{hex}.bin", &padded[..3], &padded[3..5])
    }

    #[test]
    fn names_are_the_formatted_names() {
        let mut x = 1u64;
        for _ in 0..2_000 {
            // A xorshift walk over keys of every width.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let small = x >> (x % 64);
            assert_eq!(small.hex(), format!("{small:016x}"));
            assert_eq!(block_path(&small), formatted(&format!("{small:016x}")));
            let wide = u128::from(x) << 64 | u128::from(small);
            assert_eq!(block_path(&wide), formatted(&format!("{wide:032x}")));
            let bytes = &x.to_le_bytes()[..(x % 9) as usize];
            let spelled: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let spelled = if spelled.is_empty() {
                "0".to_owned()
            } else {
                spelled
            };
            assert_eq!(bytes.hex(), spelled);
            let mut appended = String::from("prefix/");
            push_block_path(bytes, &mut appended);
            assert_eq!(appended, format!("prefix/{}", formatted(&spelled)));
            assert_eq!(block_path(bytes), formatted(&spelled));
        }
    }

    /// A key type that only implements `hex`, badly: not hex, not ASCII.
    struct Odd(&'static str);

    impl BlockKey for Odd {
        fn hex(&self) -> String {
            self.0.to_owned()
        }
    }

    #[test]
    fn a_key_that_breaks_the_contract_is_named_without_a_panic() {
        assert_eq!(block_path(&Odd("ab")), "000/ab/ab.bin");
        assert_eq!(block_path(&Odd("äöüßé€x")), "äöü/ßé/äöüßé€x.bin");
        assert_eq!(block_path(&Odd("")), "000/00/.bin");
    }

    #[test]
    fn namespaces_cannot_escape_the_root() {
        assert!(check_namespace("llama-3-8b/cfg-9f2c/rank0").is_ok());
        for bad in ["", "a//b", "../x", "a/./b", "/abs", "a/", "a\\b", "a\0b"] {
            assert!(check_namespace(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_namespace(&format!("a/{}", "n".repeat(255))).is_ok());
        let long = format!("a/{}", "n".repeat(256));
        assert!(check_namespace(&long).unwrap_err().contains("256 bytes"));
    }
}
