//! kvtier's reader of the AWS shared credentials and config files: any
//! file written as the AWS tools write one (sections, `key = value`
//! lines, comments, blank lines, other sections between) gives back each
//! section's entries; and every committed input of the `aws_file` fuzz
//! target goes through the target's body without a panic.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

#[path = "common/aws_file_fuzz.rs"]
mod aws_file_fuzz;

use kvtier::tier::aws_file_section;
use proptest::prelude::*;

fn word() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,12}"
}

fn value() -> impl Strategy<Value = String> {
    "[A-Za-z0-9/+=_.-][A-Za-z0-9/+=_. -]{0,30}[A-Za-z0-9/+=_.-]"
}

proptest! {
    #[test]
    fn every_section_written_is_read_back(
        sections in prop::collection::vec((word(), prop::collection::vec((word(), value()), 0..6)), 1..5),
        comment in "[#;][ -~]{0,20}",
    ) {
        let mut text = String::new();
        for (name, entries) in &sections {
            text.push_str(&format!("\n{comment}\n[ {name} ]\n"));
            for (key, value) in entries {
                text.push_str(&format!("  {key}={value}  \n"));
            }
        }
        for (name, _) in &sections {
            // A name given twice: its entries are every section's, in order.
            let expected: Vec<(String, String)> = sections
                .iter()
                .filter(|(other, _)| other == name)
                .flat_map(|(_, entries)| entries.clone())
                .collect();
            prop_assert_eq!(aws_file_section(&text, name), Some(expected));
        }
        prop_assert_eq!(aws_file_section(&text, "no such section"), None);
    }
}

#[test]
fn the_fuzz_targets_corpus_goes_through_without_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/aws_file");
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/aws_file") {
        aws_file_fuzz::aws_file(&std::fs::read(entry.unwrap().path()).unwrap());
        inputs += 1;
    }
    assert!(
        inputs >= 10,
        "{inputs} inputs in {}: the seed corpus is missing",
        dir.display()
    );
}
