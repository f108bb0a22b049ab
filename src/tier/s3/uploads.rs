//! Unfinished multipart uploads: listed (`ListMultipartUploads`) and
//! aborted (`AbortMultipartUpload`), which `object_store` does not offer.
//!
//! A writer killed mid-upload (vLLM's obj tier through the AWS SDK uploads
//! large objects in parts) leaves its parts in the bucket, counted by the
//! server and billed by the cloud, but in no listing of objects. The object
//! tiers abort those of their layout's blocks once they are older than
//! `stale_temp_age` (a live writer's upload is younger), at start and in
//! `kvtier trim --s3`. kvtier itself writes every block with one `PUT`, so
//! it never leaves one.
//!
//! The requests are signed with SigV4 by `object_store`'s own authorizer,
//! with the store's own credentials, and sent through its own HTTP client
//! (its timeouts and TLS settings). Keys are addressed raw, so an upload
//! of vLLM's key with an empty segment (`prefix//model_…`) is found and
//! aborted too.

use std::time::{Duration, SystemTime};

use object_store::ClientOptions;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{
    HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use quick_xml::Reader;
use quick_xml::events::Event;

use crate::tier::error::TierError;

/// An unfinished multipart upload.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Upload {
    /// The object's key, raw (empty segments kept).
    pub key: String,
    /// The upload's id.
    pub upload_id: String,
    /// When it was started, if the server said (RFC 3339 parsed).
    pub initiated: Option<SystemTime>,
}

/// One page of a `ListMultipartUploads` answer.
#[derive(Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UploadPage {
    /// The page's uploads, in the server's order.
    pub uploads: Vec<Upload>,
    /// Where the next page starts (key marker, upload id marker), when the
    /// answer is truncated.
    pub next: Option<(String, String)>,
}

/// The most pages one listing reads: a million uploads. A server that
/// keeps answering "truncated" with the same markers cannot hold a tier in
/// a loop.
const MAX_PAGES: usize = 1000;

/// Characters a query value or key segment keeps unencoded (RFC 3986's
/// unreserved set), as SigV4 wants them.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Signed requests about one bucket's multipart uploads.
pub(crate) struct Uploads {
    s3: AmazonS3,
    client: HttpClient,
    /// `<endpoint>/<bucket>`, path-style.
    bucket_url: String,
    region: String,
}

impl std::fmt::Debug for Uploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploads")
            .field("bucket_url", &self.bucket_url)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl Uploads {
    /// For `bucket` of the store `s3` (whose credentials sign the
    /// requests), reached at `endpoint` (AWS's when `None`) with `client`'s
    /// settings, requests signed for `region`.
    pub(crate) fn new(
        s3: AmazonS3,
        client: &ClientOptions,
        endpoint: Option<&str>,
        bucket: &str,
        region: String,
    ) -> Result<Self, TierError> {
        let client = ReqwestConnector::default()
            .connect(client)
            .map_err(|error| TierError::Config(error.to_string()))?;
        let endpoint = match endpoint {
            Some(endpoint) => endpoint.trim_end_matches('/').to_owned(),
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        Ok(Self {
            s3,
            client,
            bucket_url: format!("{endpoint}/{bucket}"),
            region,
        })
    }

    /// Every unfinished upload whose key starts with `prefix` (raw).
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<Upload>, TierError> {
        let mut uploads = Vec::new();
        let mut next: Option<(String, String)> = None;
        for _ in 0..MAX_PAGES {
            let mut query = vec![("prefix", prefix.to_owned()), ("uploads", String::new())];
            if let Some((key, id)) = &next {
                query.push(("key-marker", key.clone()));
                query.push(("upload-id-marker", id.clone()));
            }
            let body = match self.send("GET", "", &query).await {
                Ok(body) => body,
                // A server without the call (s3s-fs) holds no uploads we
                // could abort either: nothing to do.
                Err(TierError::Store { source, .. })
                    if source.to_string().contains("NotImplemented") =>
                {
                    tracing::debug!("the server does not list multipart uploads");
                    return Ok(uploads);
                }
                Err(error) => return Err(error),
            };
            let page = parse_upload_page(&body)
                .map_err(|reason| self.error("list uploads", prefix, reason))?;
            uploads.extend(page.uploads);
            match page.next {
                Some(markers) if next.as_ref() != Some(&markers) => next = Some(markers),
                _ => return Ok(uploads),
            }
        }
        Ok(uploads)
    }

    /// Aborts `upload` (its parts are deleted); one that is gone already
    /// counts as aborted.
    pub(crate) async fn abort(&self, upload: &Upload) -> Result<(), TierError> {
        let query = [("uploadId", upload.upload_id.clone())];
        match self.send("DELETE", &upload.key, &query).await {
            Ok(_) => Ok(()),
            Err(TierError::Store { source, .. }) if source.to_string().contains("NoSuchUpload") => {
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// One signed request; the answer's body on a 2xx status.
    async fn send(
        &self,
        method: &str,
        key: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<u8>, TierError> {
        let mut url = self.bucket_url.clone();
        if !key.is_empty() {
            url.push('/');
            let segments: Vec<String> = key
                .split('/')
                .map(|segment| utf8_percent_encode(segment, UNRESERVED).to_string())
                .collect();
            url.push_str(&segments.join("/"));
        }
        let mut query: Vec<String> = query
            .iter()
            .map(|(name, value)| format!("{name}={}", utf8_percent_encode(value, UNRESERVED)))
            .collect();
        query.sort();
        url.push('?');
        url.push_str(&query.join("&"));
        let what = if method == "GET" {
            "list uploads"
        } else {
            "abort upload"
        };
        let failed = |reason: String| self.error(what, key, reason);
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.method_mut() = method
            .parse()
            .map_err(|_| failed(format!("method {method}")))?;
        *request.uri_mut() = url
            .parse()
            .map_err(|error| failed(format!("{url}: {error}")))?;
        let credential = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|error| failed(error.to_string()))?;
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|error| failed(error.to_string()))?;
        let answer = self
            .client
            .execute(request)
            .await
            .map_err(|error| failed(error.to_string()))?;
        let status = answer.status();
        let body = answer
            .into_body()
            .bytes()
            .await
            .map_err(|error| failed(error.to_string()))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(failed(format!("{status}: {text}")));
        }
        Ok(body.to_vec())
    }

    fn error(&self, op: &'static str, location: &str, reason: String) -> TierError {
        TierError::Store {
            op,
            location: location.to_owned(),
            source: reason.into(),
        }
    }
}

/// Aborts the uploads below `prefix` whose key `is_block` (after empty
/// segments are dropped) and that began at least `older_than` ago; returns
/// how many it aborted. An upload whose start the server did not say is
/// left alone. Failures are logged and skipped.
pub(crate) async fn abort_stale(
    uploads: &Uploads,
    prefix: &str,
    older_than: Duration,
    is_block: impl Fn(&str) -> bool,
) -> Result<StaleUploads, TierError> {
    let listed = uploads.list(prefix).await?;
    let (found, stale) = stale_blocks(&listed, SystemTime::now(), older_than, is_block);
    let mut report = StaleUploads {
        found,
        ..StaleUploads::default()
    };
    for upload in stale {
        match uploads.abort(upload).await {
            Ok(()) => report.aborted += 1,
            Err(error) => {
                tracing::warn!(key = %upload.key, %error, "cannot abort a stale multipart upload");
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

/// Of `listed`, how many are uploads of blocks (`is_block` of the key with
/// empty segments dropped), and those of them that began at least
/// `older_than` before `now` (an upload whose start is unknown is not).
fn stale_blocks(
    listed: &[Upload],
    now: SystemTime,
    older_than: Duration,
    is_block: impl Fn(&str) -> bool,
) -> (u64, Vec<&Upload>) {
    let mut found = 0;
    let mut stale = Vec::new();
    for upload in listed {
        let normalised: Vec<&str> = upload
            .key
            .split('/')
            .filter(|part| !part.is_empty())
            .collect();
        // guard: O14-only-the-layouts-stale-uploads-are-aborted
        if !is_block(&normalised.join("/")) {
            continue;
        }
        found += 1;
        let age = upload
            .initiated
            .and_then(|initiated| now.duration_since(initiated).ok());
        if age.is_some_and(|age| age >= older_than) {
            stale.push(upload);
        }
    }
    (found, stale)
}

/// What an abort of stale uploads found and did ([`ObjectTier::abort_stale_uploads`](crate::ObjectTier::abort_stale_uploads),
/// `VllmObjectLayout::abort_stale_uploads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleUploads {
    /// Unfinished uploads of the layout's blocks.
    pub found: u64,
    /// Those aborted (older than the age).
    pub aborted: u64,
    /// Those whose abort failed.
    pub failed: u64,
}

/// Parses one `ListMultipartUploadsResult` page (a server's answer, so
/// untrusted: never a panic, nesting at most 16 deep). Element names are
/// matched without their namespace; entities and character references are
/// resolved; anything else is an error that says what was wrong.
///
/// ```
/// use kvtier::tier::parse_upload_page;
///
/// let page = parse_upload_page(
///     b"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>\
///       <Upload><Key>kv/a&amp;b.bin</Key><UploadId>7</UploadId></Upload>\
///       </ListMultipartUploadsResult>",
/// )?;
/// assert_eq!((page.uploads[0].key.as_str(), page.next), ("kv/a&b.bin", None));
/// assert!(parse_upload_page(b"<Error><Code>AccessDenied</Code></Error>").is_err());
/// # Ok::<(), String>(())
/// ```
pub fn parse_upload_page(xml: &[u8]) -> Result<UploadPage, String> {
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut text = String::new();
    let mut page = UploadPage::default();
    let (mut truncated, mut next_key, mut next_id) = (false, None, None);
    let mut current: Option<(Option<String>, Option<String>, Option<String>)> = None;
    let mut seen_root = false;
    loop {
        let event = reader
            .read_event_into(&mut buf)
            .map_err(|error| format!("not XML: {error}"))?;
        match event {
            Event::Start(start) => {
                let name = start.local_name().as_ref().to_vec();
                if path.is_empty() {
                    if name != b"ListMultipartUploadsResult" {
                        return Err(format!(
                            "the answer is <{}>, not a list of uploads",
                            String::from_utf8_lossy(&name)
                        ));
                    }
                    seen_root = true;
                }
                if path.len() == 1 && name == b"Upload" {
                    current = Some((None, None, None));
                }
                path.push(name);
                text.clear();
                if path.len() > 16 {
                    return Err("elements nested deeper than 16".into());
                }
            }
            Event::Text(chunk) => {
                text.push_str(&chunk.decode().map_err(|error| format!("text: {error}"))?);
            }
            Event::CData(chunk) => {
                text.push_str(&chunk.decode().map_err(|error| format!("text: {error}"))?);
            }
            Event::GeneralRef(reference) => {
                match reference
                    .resolve_char_ref()
                    .map_err(|error| format!("a reference: {error}"))?
                {
                    Some(ch) => text.push(ch),
                    None => {
                        let name = reference
                            .decode()
                            .map_err(|error| format!("a reference: {error}"))?;
                        let Some(value) = quick_xml::escape::resolve_xml_entity(&name) else {
                            return Err(format!("an unknown entity &{name};"));
                        };
                        text.push_str(value);
                    }
                }
            }
            Event::End(_) => {
                let Some(name) = path.pop() else {
                    return Err("an end tag without a start".into());
                };
                let value = std::mem::take(&mut text);
                match (path.len(), name.as_slice()) {
                    (1, b"IsTruncated") => truncated = value.trim() == "true",
                    (1, b"NextKeyMarker") => next_key = Some(value),
                    (1, b"NextUploadIdMarker") => next_id = Some(value),
                    (1, b"Upload") => {
                        let Some((Some(key), Some(upload_id), initiated)) = current.take() else {
                            return Err("an <Upload> without its <Key> or <UploadId>".into());
                        };
                        let initiated = initiated.as_deref().and_then(parse_time);
                        page.uploads.push(Upload {
                            key,
                            upload_id,
                            initiated,
                        });
                    }
                    (2, field) => {
                        if let Some((key, id, initiated)) = &mut current {
                            match field {
                                b"Key" => *key = Some(value),
                                b"UploadId" => *id = Some(value),
                                b"Initiated" => *initiated = Some(value),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if !seen_root || !path.is_empty() {
        return Err("the list of uploads is cut short".into());
    }
    page.next = match (truncated, next_key, next_id) {
        (true, Some(key), id) => Some((key, id.unwrap_or_default())),
        _ => None,
    };
    Ok(page)
}

/// An RFC 3339 time (`2026-12-06T22:41:59.000Z`); `None` for anything else.
fn parse_time(text: &str) -> Option<SystemTime> {
    let time = chrono::DateTime::parse_from_rfc3339(text.trim()).ok()?;
    let seconds = u64::try_from(time.timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(seconds, time.timestamp_subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>kv</Bucket><KeyMarker></KeyMarker>
  <NextKeyMarker>fleet//m_r0/abc/de_g0/abcdef.bin</NextKeyMarker>
  <NextUploadIdMarker>id-2</NextUploadIdMarker>
  <IsTruncated>true</IsTruncated>
  <Upload><Key>fleet/m_r0/abc/de_g0/abc&amp;def.bin</Key><UploadId>id-1</UploadId>
    <Initiated>2026-12-06T22:41:59.000Z</Initiated></Upload>
  <Upload><Key>fleet//m_r0/abc/de_g0/abcdef.bin</Key><UploadId>id&#x2D;2</UploadId></Upload>
</ListMultipartUploadsResult>"#;

    #[test]
    fn a_page_parses_with_entities_markers_and_missing_times() {
        let page = parse_upload_page(PAGE.as_bytes()).unwrap();
        assert_eq!(page.uploads.len(), 2);
        assert_eq!(page.uploads[0].key, "fleet/m_r0/abc/de_g0/abc&def.bin");
        assert!(page.uploads[0].initiated.is_some());
        assert_eq!(page.uploads[1].upload_id, "id-2");
        assert_eq!(page.uploads[1].initiated, None);
        assert_eq!(
            page.next,
            Some(("fleet//m_r0/abc/de_g0/abcdef.bin".into(), "id-2".into()))
        );
    }

    #[test]
    fn only_old_uploads_of_blocks_are_stale() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let upload = |key: &str, age: Option<u64>| Upload {
            key: key.into(),
            upload_id: "id".into(),
            initiated: age.map(|age| now - Duration::from_secs(age)),
        };
        let listed = [
            upload("p//m_r0/abc/de_g0/abcde1.bin", Some(700)), // vLLM's key: a block
            upload("p/m_r0/abc/de_g0/abcde2.bin", Some(100)),  // a block, young
            upload("p/m_r0/notes.txt", Some(700)),             // not a block
            upload("p/m_r0/abc/de_g0/abcde3.bin", None),       // start unknown
        ];
        let is_block = |key: &str| key.ends_with(".bin") && key.starts_with("p/m_r0/");
        let (found, stale) = stale_blocks(&listed, now, Duration::from_secs(600), is_block);
        assert_eq!(found, 3);
        let stale: Vec<&str> = stale.iter().map(|upload| upload.key.as_str()).collect();
        assert_eq!(stale, ["p//m_r0/abc/de_g0/abcde1.bin"]);
    }

    #[test]
    fn answers_that_are_not_a_list_are_errors() {
        for bad in [
            "",
            "<Error><Code>AccessDenied</Code></Error>",
            "<ListMultipartUploadsResult><Upload><Key>k</Key></Upload></ListMultipartUploadsResult>",
            "<ListMultipartUploadsResult><Upload>",
            "<ListMultipartUploadsResult>&nope;</ListMultipartUploadsResult>",
            &format!("<ListMultipartUploadsResult>{}", "<a>".repeat(20)),
        ] {
            assert!(parse_upload_page(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
