//! The names kvtier's own layout gives its files, and the rule that tells
//! them from everything else: a tier's scans, sweeps and trims count and
//! delete only what this module (or vLLM's layout, `vllm/layout.rs`) says
//! the layout wrote. A `photos/2024/holiday.bin` is not a block because its
//! name ends in `.bin`; `abc/de/abcdef.bin` is one because `abc/de/` is
//! where the layout puts a block named `abcdef`.
//!
//! kvtier's layout (an [`FsTier`](crate::FsTier)'s namespace directory, an
//! [`ObjectTier`](crate::ObjectTier)'s prefix): a block is
//! `<hex[..3]>/<hex[3..5]>/<hex>.bin` (see [`BlockKey`]), its store's
//! temporary file `<hex>.bin.<16 hex digits>.tmp` beside it.

use super::key::{BlockKey, push_block_path};

/// What a file two levels below a tier's directory is, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Entry {
    /// A block the layout stores under this name.
    Block,
    /// A store's temporary file of such a block.
    Temp,
    /// Anything else: not the tier's, never counted or deleted.
    Foreign,
}

/// Digits of a kvtier temporary file's suffix.
const TEMP_DIGITS: usize = 16;

/// The temporary file a kvtier store writes before renaming it to
/// `block_name`: `<block_name>.<suffix as 16 hex digits>.tmp`.
#[cfg(fs_tier)]
pub(crate) fn kvtier_temp_name(block_name: &str, suffix: u64) -> String {
    format!("{block_name}.{suffix:016x}.tmp")
}

/// Lowercase hex digits, at least one: a [`BlockKey`]'s name.
pub(crate) fn is_lower_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A block name's digits as a [`BlockKey`], so that the check below names
/// the block's path with the very function the writers use.
struct Digits<'a>(&'a str);

impl BlockKey for Digits<'_> {
    fn hex(&self) -> String {
        self.0.to_owned()
    }

    fn write_hex(&self, out: &mut String) {
        out.push_str(self.0);
    }
}

/// What `<fan_out>/<shard>/<name>` is in kvtier's layout.
///
/// ```text
/// abc/de/abcdef.bin                    Block
/// abc/de/abcdef.bin.00000000000000aa.tmp  Temp
/// abc/de/abcdef.bin.4242-7.tmp         Temp (an older writer's name)
/// abc/de/abcdef.bin.old.tmp            Foreign (not a store's suffix)
/// abd/de/abcdef.bin                    Foreign (not where the layout puts it)
/// photos/2024/holiday.bin              Foreign
/// ```
pub(crate) fn kvtier_entry(fan_out: &str, shard: &str, name: &str) -> Entry {
    if is_kvtier_block(fan_out, shard, name) {
        return Entry::Block;
    }
    let temp = name
        .strip_suffix(".tmp")
        .and_then(|stem| stem.rsplit_once('.'))
        .filter(|(_, suffix)| is_temp_suffix(suffix));
    match temp {
        // guard: F15-only-the-layouts-temporaries-are-swept
        Some((block, _)) if is_kvtier_block(fan_out, shard, block) => Entry::Temp,
        _ => Entry::Foreign,
    }
}

/// A store's temporary suffix: 16 hex digits, or `<pid>-<count>` (the
/// names kvtier's writers gave their temporary files before 0.1's
/// exclusive random names).
fn is_temp_suffix(suffix: &str) -> bool {
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    (suffix.len() == TEMP_DIGITS && is_lower_hex(suffix))
        || suffix
            .split_once('-')
            .is_some_and(|(pid, count)| digits(pid) && digits(count))
}

/// Whether `<fan_out>/<shard>/<name>` is where kvtier's layout stores the
/// block `name` names.
fn is_kvtier_block(fan_out: &str, shard: &str, name: &str) -> bool {
    let Some(digits) = name.strip_suffix(".bin") else {
        return false;
    };
    if !is_lower_hex(digits) {
        return false;
    }
    let mut path = String::with_capacity(name.len() + 8);
    push_block_path(&Digits(digits), &mut path);
    // guard: F16-only-the-layouts-blocks-are-counted
    path.split('/').eq([fan_out, shard, name])
}

/// Whether a directory `depth` levels below a kvtier tier's directory (1:
/// the fan-out, 2: the shard) can be one the layout made: a walk does not
/// descend into anything else.
#[cfg(fs_tier)]
pub(crate) fn is_kvtier_dir(depth: usize, name: &str) -> bool {
    let digits = if depth == 1 { 3 } else { 2 };
    name.len() == digits && is_lower_hex(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_layouts_own_names_are_blocks_and_temporaries() {
        use Entry::{Block, Foreign, Temp};
        let cases = [
            ("abc", "de", "abcdef.bin", Block),
            ("000", "0f", "0f.bin", Block),
            ("000", "00", "0.bin", Block),
            ("000", "00", "0000000012345678.bin", Block),
            ("abc", "de", "abcdef.bin.00000000000000aa.tmp", Temp),
            ("abc", "de", "abcdef.bin.4242-7.tmp", Temp),
            ("abc", "de", "abcdef.bin.4242-.tmp", Foreign),
            ("abc", "de", "abcdef.bin.00000000000000AA.tmp", Foreign),
            ("abc", "de", "abcdef.bin.0000000000000aa.tmp", Foreign),
            ("abc", "de", "abcdef.bin.old.tmp", Foreign),
            ("abc", "de", "abddef.bin.00000000000000aa.tmp", Foreign),
            ("abc", "de", "notes.bin.00000000000000aa.tmp", Foreign),
            ("abd", "de", "abcdef.bin", Foreign),
            ("abc", "df", "abcdef.bin", Foreign),
            ("abc", "de", "ABCDEF.bin", Foreign),
            ("abc", "de", "abcdefg.bin", Foreign),
            ("abc", "de", ".bin", Foreign),
            ("abc", "de", "abcdef.bin_1.tmp", Foreign),
            ("photos", "2024", "holiday.bin", Foreign),
            ("notes", "x", "notes.bin.old.tmp", Foreign),
        ];
        for (fan_out, shard, name, expected) in cases {
            assert_eq!(
                kvtier_entry(fan_out, shard, name),
                expected,
                "{fan_out}/{shard}/{name}"
            );
        }
    }

    #[test]
    #[cfg(fs_tier)]
    fn the_writers_temporary_names_are_the_layouts() {
        let name = kvtier_temp_name("abcdef.bin", 0xaa);
        assert_eq!(name, "abcdef.bin.00000000000000aa.tmp");
        assert_eq!(kvtier_entry("abc", "de", &name), Entry::Temp);
        assert_eq!(
            kvtier_entry("abc", "de", &kvtier_temp_name("abcdef.bin", u64::MAX)),
            Entry::Temp
        );
    }

    #[test]
    #[cfg(fs_tier)]
    fn layout_directories_are_hex_of_the_fan_outs_width() {
        assert!(is_kvtier_dir(1, "abc") && is_kvtier_dir(2, "de"));
        for (depth, name) in [
            (1, "ab"),
            (1, "abcd"),
            (1, "ABC"),
            (2, "d"),
            (2, "2024"),
            (1, ".."),
        ] {
            assert!(!is_kvtier_dir(depth, name), "{depth} {name}");
        }
    }
}
