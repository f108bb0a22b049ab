//! Arbitrary bytes as a server's answer to `ListMultipartUploads`, through
//! kvtier's parser: never a panic, and what parses round-trips. The body is
//! shared with the corpus replay (tests/upload_page.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/upload_page_fuzz.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::upload_page(data));
