//! The body of the `aws_file` fuzz target, shared by the target
//! (fuzz/fuzz_targets/aws_file.rs includes this file) and the replay of its
//! corpus (tests/aws_files.rs): arbitrary text as an AWS shared credentials
//! or config file, through kvtier's reader. It never panics, a section it
//! finds holds only trimmed keys and values, and the entries it finds,
//! written out again, are found again.

use kvtier::tier::aws_file_section;

pub fn aws_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for section in ["default", "profile fleet", "fleet", ""] {
        let Some(entries) = aws_file_section(text, section) else {
            continue;
        };
        let mut written = format!("[{section}]\n");
        for (key, value) in &entries {
            assert_eq!(key.trim(), key);
            assert_eq!(value.trim(), value);
            written.push_str(&format!("{key} = {value}\n"));
        }
        // A key that starts a comment or a section, or holds `=`, cannot be
        // written back as the same line.
        let plain = entries.iter().all(|(key, _)| {
            !key.is_empty() && !key.contains('=') && !key.starts_with(['#', ';', '['])
        });
        if plain {
            assert_eq!(aws_file_section(&written, section), Some(entries));
        }
    }
}
