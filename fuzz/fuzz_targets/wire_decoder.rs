//! Arbitrary bytes through the save protocol's wire decoders (steps and
//! reports, every id type): never a panic, and whatever decodes re-encodes
//! to the same bytes. See `kvtier_models::fuzzing::wire_decoder`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::wire_decoder(data));
