//! Operation sequences on the real save-completion halves and the
//! specification, S1–S6 checked after every operation. See
//! `kvtier_models::fuzzing::save_vs_reference`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::save_vs_reference(data));
