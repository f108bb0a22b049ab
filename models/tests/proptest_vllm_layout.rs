//! proptest: vLLM's file-system layout as kvtier reads it. For any key,
//! the path is the one vLLM's rule gives (written here as Python slices
//! it: `hex[0:3]`, `hex[3:5]`, the group as a decimal), or the key is
//! refused when it holds no hash; a block's path names its key again and
//! no other path names a key; different keys never share a path; and a
//! group of any keys, some stored, is answered key by key, never with an
//! error (so a name too long to exist is not handed to the file system).
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
    fn a_blocks_path_names_its_key_again(key in keys()) {
        let layout = VllmFsLayout::new("/rank").unwrap();
        if let Ok(path) = layout.path_of(&key) {
            prop_assert_eq!(layout.key_of(&path), Some(key));
        }
    }

    #[test]
    fn any_other_path_names_no_key_or_exactly_the_one_stored_there(
        parts in prop::collection::vec("[0-9a-fA-F_g+.bin/]{0,12}", 0..5),
        key in keys(),
    ) {
        let layout = VllmFsLayout::new("/rank").unwrap();
        let mut path = Path::new("/rank").join(parts.join("/"));
        if parts.len() == 1
            && !parts[0].contains('/')
            && let Ok(real) = layout.path_of(&key)
        {
            // A near miss: a real block's directory, another file name.
            path = real.with_file_name(format!("{}.bin", parts[0]));
        }
        if let Some(found) = layout.key_of(&path) {
            prop_assert_eq!(layout.path_of(&found).unwrap(), path);
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
    fn a_group_is_answered_key_by_key(group in prop::collection::vec((keys(), any::<bool>()), 0..6)) {
        let root = tempfile_dir();
        let mut layout = VllmFsLayout::new(&root).unwrap();
        // Every shard directory exists, so a name too long to exist would
        // reach the file system's own check; some blocks are stored.
        for (key, store) in &group {
            if let Some(rule) = expected(key) {
                let path = root.join(rule);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                let fits = path.file_name().unwrap().len() <= 255;
                if *store && fits {
                    std::fs::write(&path, b"block").unwrap();
                }
            }
        }
        let keys: Vec<Vec<u8>> = group.iter().map(|(key, _)| key.clone()).collect();
        let want: Vec<bool> = keys
            .iter()
            .map(|key| expected(key).is_some_and(|rule| root.join(rule).is_file()))
            .collect();
        let answers = layout.batch_lookup(&keys, &0u64);
        std::fs::remove_dir_all(&root).unwrap();
        prop_assert_eq!(answers.unwrap(), want);
    }
}

/// An empty directory for the lookups (the models crate has no tempfile).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-vllm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
