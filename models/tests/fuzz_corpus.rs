//! Replays every committed input of the cargo-fuzz targets on stable Rust:
//! each file under fuzz/corpus/<target>/ and fuzz/artifacts/<target>/ runs
//! through the same function the fuzz target calls
//! ([`kvtier_models::fuzzing`]). A crash the fuzzer found and committed as an
//! artifact fails here until it is fixed.

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("readable fuzz directory").path();
            let hidden = path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with('.'));
            if path.is_file() && !hidden {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= 10,
        "fuzz/corpus/{target} holds {} inputs: the seed corpus is missing",
        files.len()
    );
    for path in &files {
        let data = std::fs::read(path).expect("readable corpus file");
        let outcome = std::panic::catch_unwind(|| body(&data));
        if outcome.is_err() {
            panic!("{target}: input {} fails", path.display());
        }
    }
    println!("{target}: replayed {} inputs", files.len());
}

#[test]
fn table_vs_reference_corpus_replays_cleanly() {
    replay(
        "table_vs_reference",
        kvtier_models::fuzzing::table_vs_reference,
    );
}

#[test]
fn driver_scripted_corpus_replays_cleanly() {
    replay("driver_scripted", kvtier_models::fuzzing::driver_scripted);
}

#[test]
fn save_vs_reference_corpus_replays_cleanly() {
    replay(
        "save_vs_reference",
        kvtier_models::fuzzing::save_vs_reference,
    );
}

/// The block format is not built for the model checkers (no tiers there).
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
#[test]
fn block_decoder_corpus_replays_cleanly() {
    replay("block_decoder", kvtier_models::fuzzing::block_decoder);
}

/// The save protocol's wire decoders (no tiers needed, but the fuzzing
/// bodies of the byte decoders share one cfg).
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
#[test]
fn wire_decoder_corpus_replays_cleanly() {
    replay("wire_decoder", kvtier_models::fuzzing::wire_decoder);
}

/// The vLLM layout's path-to-key parser.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
#[test]
fn vllm_block_path_corpus_replays_cleanly() {
    replay("vllm_block_path", kvtier_models::fuzzing::vllm_block_path);
}
