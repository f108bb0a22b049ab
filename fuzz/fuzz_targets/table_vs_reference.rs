//! Operation sequences on the real `LookupTable` and the specification,
//! compared after every operation. See `kvtier_models::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::table_vs_reference(data));
