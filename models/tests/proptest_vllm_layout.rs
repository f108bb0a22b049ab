//! proptest: vLLM's file-system layout as kvtier reads it. For any key,
//! the path is the one vLLM's rule gives (written here as Python slices
//! it: `hex[0:3]`, `hex[3:5]`, the group as a decimal), or the key is
//! refused when it holds no hash; different keys never share a path; and a
//! lookup of any key in an empty rank directory answers a miss, never an
//! error, whatever the key.
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_vllm_layout`;
//! more cases: `PROPTEST_CASES=100000`.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

use std::path::Path;

use kvtier::TierError;
use kvtier::lookup::Backend;
use kvtier::tier::VllmFsLayout;
use proptest::prelude::*;

/// Python's `s[start:end]` on an ASCII string: clamped, never failing.
fn py_slice(s: &str, start: usize, end: usize) -> &str {
    let end = end.min(s.len());
    &s[start.min(end)..end]
}

/// vLLM's rule, straight from its description.
fn expected(key: &[u8]) -> Option<String> {
    if key.len() <= 4 {
        return None;
    }
    let (hash, group) = key.split_at(key.len() - 4);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let group = u32::from_be_bytes(group.try_into().ok()?);
    Some(format!(
        "{}/{}_g{group}/{hex}.bin",
        py_slice(&hex, 0, 3),
        py_slice(&hex, 3, 5)
    ))
}

fn keys() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8),
        prop::collection::vec(any::<u8>(), 30..40),
        prop::collection::vec(any::<u8>(), 120..140),
    ]
}

proptest! {
    #[test]
    fn every_key_gets_vllms_path_or_is_refused(key in keys()) {
        let layout = VllmFsLayout::new("/rank").unwrap();
        match (layout.path_of(&key), expected(&key)) {
            (Ok(path), Some(rule)) => prop_assert_eq!(path, Path::new("/rank").join(rule)),
            (Err(TierError::KeyFormat { length, .. }), None) => prop_assert_eq!(length, key.len()),
            (got, rule) => prop_assert!(false, "{got:?} where the rule gives {rule:?}"),
        }
    }

    #[test]
    fn different_keys_never_share_a_path(a in keys(), b in keys()) {
        let layout = VllmFsLayout::new("/rank").unwrap();
        if let (Ok(pa), Ok(pb)) = (layout.path_of(&a), layout.path_of(&b)) {
            prop_assert_eq!(pa == pb, a == b);
        }
    }

    #[test]
    fn any_group_of_keys_in_an_empty_directory_is_all_misses(group in prop::collection::vec(keys(), 0..6)) {
        let root = tempfile_dir();
        let mut layout = VllmFsLayout::new(&root).unwrap();
        let answers = layout.batch_lookup(&group, &0u64);
        std::fs::remove_dir(&root).unwrap();
        prop_assert_eq!(answers.unwrap(), vec![false; group.len()]);
    }
}

/// An empty directory for the lookups (the models crate has no tempfile).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-vllm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
