//! Arbitrary bytes through kvtier's block decoder: never a panic, and every
//! block round-trips. See `kvtier_models::fuzzing::block_decoder`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::block_decoder(data));
