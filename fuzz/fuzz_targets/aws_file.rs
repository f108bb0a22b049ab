//! Arbitrary text as an AWS shared credentials or config file, through
//! kvtier's reader: never a panic, and what it reads is read back. The body
//! is shared with the corpus replay (tests/aws_files.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/aws_file_fuzz.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::aws_file(data));
