//! vLLM's file-system layout on real directories: blocks written where
//! vLLM's fs tier writes them are found by both probers, absent ones are
//! not, and a key that cannot name a file is a miss on its own.
#![cfg(all(
    feature = "fs",
    feature = "tokio",
    not(any(kvtier_loom, kvtier_shuttle))
))]

use std::fs;
use std::path::{Path, PathBuf};

use kvtier::lookup::{Backend, Prober, TokioConfig};
use kvtier::tier::VllmFsLayout;
use kvtier::{Lookup, TierError};

/// vLLM's key: the block hash, then the group index as 4 big-endian bytes.
fn key(hash: &[u8], group: u32) -> Vec<u8> {
    let mut key = hash.to_vec();
    key.extend_from_slice(&group.to_be_bytes());
    key
}

/// Where vLLM's fs tier writes a block, spelled out from its rule.
fn vllm_path(rank_dir: &Path, hash: &[u8], group: u32) -> PathBuf {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let fan = |range: std::ops::Range<usize>| {
        hex.get(range.start..range.end.min(hex.len()))
            .unwrap_or("")
            .to_owned()
    };
    rank_dir
        .join(fan(0..3))
        .join(format!("{}_g{group}", fan(3..5)))
        .join(format!("{hex}.bin"))
}

fn write(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, b"a block vLLM saved").unwrap();
}

/// Stored and absent keys: hashes of several lengths and groups.
fn fixture(rank_dir: &Path) -> (Vec<Vec<u8>>, Vec<bool>) {
    let mut keys = Vec::new();
    let mut stored = Vec::new();
    for i in 0..24u8 {
        let hash: Vec<u8> = (0..[32, 16, 2, 1][usize::from(i % 4)])
            .map(|j| i.wrapping_mul(31).wrapping_add(j))
            .collect();
        let group = u32::from(i % 3) * 1000;
        let keep = i % 2 == 0;
        if keep {
            write(&vllm_path(rank_dir, &hash, group));
        }
        keys.push(key(&hash, group));
        stored.push(keep);
    }
    (keys, stored)
}

/// Which of `keys` are hits once their probes were answered.
fn hits_after_probing<P: Prober<Vec<u8>, String>>(
    lookup: &mut Lookup<Vec<u8>, String, P>,
    keys: &[Vec<u8>],
) -> Vec<bool> {
    let request = "req".to_string();
    let mut verdicts = Vec::new();
    lookup.lookup_all(keys, &request, &mut verdicts);
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    lookup.lookup_all(keys, &request, &mut verdicts);
    verdicts.iter().map(|v| v.is_hit()).collect()
}

#[test]
fn the_thread_prober_finds_exactly_the_blocks_vllm_wrote() {
    let root = tempfile::tempdir().unwrap();
    let rank_dir = root.path().join("m_0123456789ab_r0");
    let (keys, stored) = fixture(&rank_dir);
    let layout = VllmFsLayout::new(&rank_dir).unwrap();
    for (key, stored) in keys.iter().zip(&stored) {
        assert_eq!(
            layout.path_of(key).unwrap(),
            vllm_path(
                &rank_dir,
                &key[..key.len() - 4],
                u32::from_be_bytes(key[key.len() - 4..].try_into().unwrap())
            )
        );
        assert_eq!(layout.contains(key).unwrap(), *stored);
    }
    let mut lookup = Lookup::threaded(layout).unwrap();
    assert_eq!(hits_after_probing(&mut lookup, &keys), stored);
    assert_eq!(lookup.stats().backend_errors, 0);
}

#[test]
fn the_tokio_prober_finds_exactly_the_blocks_vllm_wrote() {
    let root = tempfile::tempdir().unwrap();
    let rank_dir = VllmFsLayout::for_rank(root.path().join("m_0123456789ab"), 2).unwrap();
    let (keys, stored) = fixture(rank_dir.rank_dir());
    let mut lookup = Lookup::tokio(rank_dir, TokioConfig::default()).unwrap();
    assert_eq!(hits_after_probing(&mut lookup, &keys), stored);
}

#[test]
fn a_key_that_names_no_file_is_a_miss_on_its_own() {
    let root = tempfile::tempdir().unwrap();
    let mut layout = VllmFsLayout::new(root.path()).unwrap();
    // The longest name that fits (255 bytes: 125 hash bytes and ".bin"),
    // stored; one byte more cannot be a file name at all.
    let fits = vec![0xab_u8; 125];
    let too_long = vec![0xab_u8; 126];
    write(&vllm_path(root.path(), &fits, 0));
    let group = vec![
        key(&too_long, 0),
        key(&fits, 0),
        vec![0, 0, 0, 1],
        Vec::new(),
    ];
    let answers = layout.batch_lookup(&group, &"r".to_string()).unwrap();
    assert_eq!(answers, [false, true, false, false]);
    assert!(!layout.contains(&group[0]).unwrap());
    assert!(matches!(
        layout.path_of(&[0, 0, 0, 1]),
        Err(TierError::KeyFormat { length: 4, .. })
    ));

    let mut lookup = Lookup::tokio(layout, TokioConfig::default()).unwrap();
    assert_eq!(
        hits_after_probing(&mut lookup, &group),
        [false, true, false, false]
    );
    assert_eq!(lookup.stats().backend_errors, 0);
}

/// No path holds a NUL: a rank directory with one is refused at once, not
/// accepted to make every key miss.
#[test]
fn a_rank_directory_with_a_nul_is_refused() {
    let refused = VllmFsLayout::new("/tmp/a\0b");
    assert!(
        matches!(refused, Err(kvtier::TierError::Config(ref message)) if message.contains("NUL")),
        "{refused:?}"
    );
}
