//! Arbitrary bytes as a path below a vLLM rank directory, through the
//! layout's path-to-key parser: never a panic, and every key it finds is
//! stored at that very path. See `kvtier_models::fuzzing::vllm_block_path`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::vllm_block_path(data));
