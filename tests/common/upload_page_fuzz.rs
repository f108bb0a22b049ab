//! The body of the `upload_page` fuzz target, shared by the target
//! (fuzz/fuzz_targets/upload_page.rs includes this file) and the replay of
//! its corpus (tests/upload_page.rs): arbitrary bytes, as a server could
//! answer a `ListMultipartUploads`, through kvtier's parser. It never
//! panics, and a page it parses, written out again, parses to the same
//! page.

use std::fmt::Write;

use kvtier::tier::{UploadPage, parse_upload_page};

/// Writes `page` as a server would, every character but letters and
/// digits as a character reference; `None` when a text holds a character
/// no XML can carry (NUL).
pub fn render(page: &UploadPage) -> Option<String> {
    fn text(value: &str) -> Option<String> {
        let mut out = String::new();
        for ch in value.chars() {
            if ch == '\0' {
                return None;
            }
            if ch.is_ascii_alphanumeric() {
                out.push(ch);
            } else {
                let _ = write!(out, "&#x{:x};", ch as u32);
            }
        }
        Some(out)
    }
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListMultipartUploadsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
    );
    match &page.next {
        Some((key, id)) => {
            let _ = write!(
                xml,
                "<IsTruncated>true</IsTruncated><NextKeyMarker>{}</NextKeyMarker><NextUploadIdMarker>{}</NextUploadIdMarker>",
                text(key)?,
                text(id)?
            );
        }
        None => xml.push_str("<IsTruncated>false</IsTruncated>"),
    }
    for upload in &page.uploads {
        let _ = write!(
            xml,
            "<Upload><Key>{}</Key><UploadId>{}</UploadId>",
            text(&upload.key)?,
            text(&upload.upload_id)?
        );
        if let Some(time) = upload.initiated {
            let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
            let time =
                chrono::DateTime::from_timestamp(since.as_secs() as i64, since.subsec_nanos())?;
            let _ = write!(xml, "<Initiated>{}</Initiated>", time.to_rfc3339());
        }
        xml.push_str("</Upload>");
    }
    xml.push_str("</ListMultipartUploadsResult>");
    Some(xml)
}

pub fn upload_page(data: &[u8]) {
    let Ok(page) = parse_upload_page(data) else {
        return;
    };
    let Some(xml) = render(&page) else {
        return;
    };
    let again = parse_upload_page(xml.as_bytes()).expect("a page written out parses");
    assert_eq!(again, page, "written out and parsed again: the same page");
}
