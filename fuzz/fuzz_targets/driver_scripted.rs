//! Scheduler calls on the real threaded `AsyncLookup` over a backend with
//! scripted faults, checked against the specification after every call. See
//! `kvtier_models::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtier_models::fuzzing::driver_scripted(data));
