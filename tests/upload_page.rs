//! kvtier's parser of `ListMultipartUploads` answers: any page written out
//! as a server would (every key, id and time, escaped) parses back to the
//! same page, whatever its keys hold (`&`, `<`, empty segments, any
//! Unicode); and every committed input of the `upload_page` fuzz target
//! (fuzz/corpus/upload_page) goes through the target's body without a
//! panic.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

#[path = "common/upload_page_fuzz.rs"]
mod upload_page_fuzz;

use std::time::{Duration, UNIX_EPOCH};

use kvtier::tier::parse_upload_page;
use proptest::prelude::*;
use upload_page_fuzz::{render, upload_page};

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9/&<>'\" _.\\-\u{e9}\u{4e2d}]{1,40}"
}

proptest! {
    #[test]
    fn a_page_written_out_parses_back(
        uploads in prop::collection::vec((text(), text(), prop::option::of(0u64..4_000_000_000)), 0..8),
        next in prop::option::of((text(), text())),
    ) {
        let mut xml = String::from("<ListMultipartUploadsResult>");
        match &next {
            Some((key, id)) => xml.push_str(&format!(
                "<IsTruncated>true</IsTruncated><NextKeyMarker>{}</NextKeyMarker><NextUploadIdMarker>{}</NextUploadIdMarker>",
                escape(key), escape(id))),
            None => xml.push_str("<IsTruncated>false</IsTruncated>"),
        }
        for (key, id, seconds) in &uploads {
            xml.push_str(&format!("<Upload><Key>{}</Key><UploadId>{}</UploadId>", escape(key), escape(id)));
            if let Some(seconds) = seconds {
                let time = chrono::DateTime::from_timestamp(*seconds as i64, 0).unwrap();
                xml.push_str(&format!("<Initiated>{}</Initiated>", time.to_rfc3339()));
            }
            xml.push_str("<StorageClass>STANDARD</StorageClass><Owner><ID>x</ID></Owner></Upload>");
        }
        xml.push_str("</ListMultipartUploadsResult>");
        let page = parse_upload_page(xml.as_bytes()).unwrap();
        prop_assert_eq!(page.uploads.len(), uploads.len());
        for (parsed, (key, id, seconds)) in page.uploads.iter().zip(&uploads) {
            prop_assert_eq!(&parsed.key, key);
            prop_assert_eq!(&parsed.upload_id, id);
            prop_assert_eq!(parsed.initiated, seconds.map(|s| UNIX_EPOCH + Duration::from_secs(s)));
        }
        prop_assert_eq!(&page.next, &next);
        // The fuzz target's own writer agrees.
        let again = parse_upload_page(render(&page).unwrap().as_bytes()).unwrap();
        prop_assert_eq!(again, page);
    }
}

/// The predefined entities a server writes.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

#[test]
fn the_fuzz_targets_corpus_goes_through_without_a_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/upload_page");
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/upload_page") {
        let path = entry.unwrap().path();
        upload_page(&std::fs::read(&path).unwrap());
        inputs += 1;
    }
    assert!(
        inputs >= 10,
        "{inputs} inputs in {}: the seed corpus is missing",
        dir.display()
    );
}
