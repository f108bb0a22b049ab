//! The docs name the checks, guards and mutations behind every invariant;
//! a name that no longer exists in the code is a claim nobody checks. This
//! test fails when docs/design.md, docs/verification.md or the README name
//! a test, model or helper (a backquoted `snake_case_name` of four or more
//! words) that appears nowhere in the sources (Rust, and the Python
//! package's), or a mutation id (`L3-...`, `S6-...`) that
//! `models/mutants.py` does not define.

use std::path::{Path, PathBuf};

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file below `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    source_files(dir, "rs", out);
}

/// Every file with extension `ext` below `dir`, skipping build output.
fn source_files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            source_files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The backquoted spans of a Markdown text.
fn spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// A test-like name: lowercase words joined by `_`, at least four of them.
fn is_check_name(name: &str) -> bool {
    let words: Vec<&str> = name.split('_').collect();
    words.len() >= 4
        && words.iter().all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
        && name.as_bytes()[0].is_ascii_lowercase()
}

/// A mutation id: a protocol letter, a number, `-`, lowercase words.
fn is_mutation_id(span: &str) -> bool {
    let mut chars = span.chars();
    matches!(
        chars.next(),
        Some('L' | 'S' | 'T' | 'F' | 'W' | 'P' | 'V' | 'N' | 'C' | 'H' | 'K' | 'E' | 'O' | 'G')
    ) && span[1..].split_once('-').is_some_and(|(number, rest)| {
        !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit())
            && !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// vLLM's tier and connector test files (python/integration/vllm.sh takes
/// them from vLLM's sdist); the docs name their tests as `<file>::<test>`.
const VLLM_TEST_FILES: [&str; 5] = [
    "test_async_lookup.py",
    "test_fs_tier.py",
    "test_tiering_offloading.py",
    "test_obj_tier.py",
    "test_multi_connector.py",
];

#[test]
fn every_check_and_mutation_the_docs_name_exists() {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "src",
        "tests",
        "models",
        "cli",
        "benches",
        "examples",
        "fuzz/fuzz_targets",
        "python/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    for dir in [
        "python/tests",
        "python/kvtier",
        "python/bench",
        "python/integration",
    ] {
        source_files(&root.join(dir), "py", &mut files);
    }
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    let code: String = files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap())
        .collect();
    let mutants = catalogue(&root);

    let mut named = 0;
    let mut missing = Vec::new();
    for doc in ["docs/design.md", "docs/verification.md", "README.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        for span in spans(&text) {
            if VLLM_TEST_FILES
                .iter()
                .any(|file| span.starts_with(&format!("{file}::")))
            {
                // One of vLLM's own tests, in its sdist, not here:
                // python/integration/vllm.sh checks it exists there.
                continue;
            }
            let last = span.rsplit(['/', ':']).next().unwrap_or(span);
            let name = last.trim_end_matches('…').trim_end_matches('_');
            if is_check_name(name) {
                named += 1;
                if !code.contains(name) {
                    missing.push(format!("{doc}: `{span}` names nothing in the sources"));
                }
            } else if is_mutation_id(span) {
                named += 1;
                if !mutants.contains(&format!("\"{span}")) {
                    missing.push(format!(
                        "{doc}: mutation `{span}` is not in models/mutation/catalogue/"
                    ));
                }
            }
        }
    }
    assert!(named > 100, "only {named} names found: is the scan broken?");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_scan_recognises_names_and_ids() {
    assert!(is_check_name("a_key_looked_up_twice"));
    assert!(!is_check_name("take_submission"));
    assert!(!is_check_name("Stats_foreign_x_y"));
    assert!(is_mutation_id("L10-apply-checks-the-table"));
    assert!(is_mutation_id("S6-multi"));
    assert!(is_mutation_id("O16-a-start-aborts-stale-uploads"));
    assert!(!is_mutation_id("L-x"));
    assert!(!is_mutation_id("README.md"));
    assert_eq!(spans("a `b` c `d e` f"), ["b", "d e"]);
}

/// The text of every file of the mutation catalogue
/// (`models/mutation/catalogue/`, one file per subsystem).
fn catalogue(root: &std::path::Path) -> String {
    let mut files = Vec::new();
    source_files(&root.join("models/mutation/catalogue"), "py", &mut files);
    assert!(
        files.len() > 3,
        "found only {} catalogue files",
        files.len()
    );
    files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap())
        .collect()
}

/// The mutation ids the catalogue defines: the string that opens each
/// `Mutation(` entry.
fn mutation_ids(mutants: &str) -> Vec<String> {
    mutants
        .split("Mutation(")
        .skip(1)
        .filter_map(|entry| {
            let id = entry.split('"').nth(1)?;
            is_mutation_id(id).then(|| id.to_owned())
        })
        .collect()
}

/// Every mutation is anchored on a `// guard: <id>` tag in the library (or
/// the command line's code, the Python package's native module, or
/// `# guard: <id>` in its Python code, `-- guard: <id>` in the fleet
/// books' Lua script), and
/// every tag belongs to a mutation: a guard nobody mutates is a claim with
/// no check behind it, and a mutation without its tag cannot run.
#[test]
fn every_guard_tag_has_its_mutation_and_every_mutation_its_tag() {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("cli/src"), &mut files);
    rust_files(&root.join("python/src"), &mut files);
    source_files(&root.join("python/kvtier"), "py", &mut files);
    // The fleet books' server-side script.
    source_files(&root.join("src"), "lua", &mut files);
    let mut tags = std::collections::BTreeSet::new();
    for file in &files {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            let line = line.trim();
            if let Some(id) = line
                .strip_prefix("// guard: ")
                .or_else(|| line.strip_prefix("# guard: "))
                .or_else(|| line.strip_prefix("-- guard: "))
            {
                tags.insert(id.trim().to_owned());
            }
        }
    }
    let mutants = catalogue(&root);
    let ids: std::collections::BTreeSet<String> = mutation_ids(&mutants).into_iter().collect();
    assert!(ids.len() > 50, "found only {} mutations", ids.len());
    let untagged: Vec<_> = ids.difference(&tags).collect();
    let orphans: Vec<_> = tags.difference(&ids).collect();
    assert!(
        untagged.is_empty(),
        "mutations without a guard tag: {untagged:?}"
    );
    assert!(
        orphans.is_empty(),
        "guard tags without a mutation: {orphans:?}"
    );
}

/// Every mutation's texts are found, once each, after its tags: a guard
/// whose code was reformatted or rewritten makes its mutation stale, which
/// otherwise only the (long) mutation run would notice.
#[test]
fn every_mutation_applies_to_the_code_as_it_stands() {
    let report = mutants_py("--anchors");
    assert!(
        report.contains(" mutations anchored"),
        "stale mutations:\n{report}"
    );
}

/// Runs `models/mutants.py <arg>`; its output, once it has succeeded.
fn mutants_py(arg: &str) -> String {
    let output = std::process::Command::new("python3")
        .arg(root().join("models/mutants.py"))
        .arg(arg)
        .output()
        .expect("python3 runs models/mutants.py");
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "mutants.py {arg}:\n{report}\n{errors}"
    );
    report
}

/// The rule that picks CI's mutations (docs/verification.md, "Mutations in
/// CI") runs what changed and only that: against a record of the tree as
/// it stands only the fixed sample is picked; an edit to any mutation's
/// guard lines, or to the mutation, gets it picked; and on a small tree, a
/// moved guard, an edited guard, an edited check, an unrelated edit and an
/// edit to the Rust a Python check calls each select what they must.
#[test]
fn the_ci_mutation_rule_runs_what_changed_and_only_that() {
    let report = mutants_py("--check-selection");
    assert!(report.contains("select what they must"), "{report}");
}
