//! The code's module layers (issue 41): no import circle and no import from
//! a layer above, in the Rust crates, the Python package and the end-to-end
//! harness's scripts. `models/layers.py` reads the sources; its self-test
//! shows it finds a planted circle, an upward import and a private name
//! taken from a sibling.

use std::path::PathBuf;
use std::process::Command;

fn layers(args: &[&str]) -> (bool, String) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("python3")
        .arg(root.join("models/layers.py"))
        .args(args)
        .output()
        .expect("python3 runs models/layers.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn the_code_has_no_import_circle_and_no_upward_import() {
    let (ok, report) = layers(&[]);
    assert!(ok && report.contains("0 layering problems"), "{report}");
}

#[test]
fn the_layering_check_finds_planted_faults() {
    let (ok, report) = layers(&["--self-test"]);
    assert!(
        ok && report.contains("finds each planted fault"),
        "{report}"
    );
}
