//! The checks an S3 setting passes where it enters: endpoints, bucket
//! names, regions, credentials and the `s3://` URL's namespace.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// Whether the builder has credentials from a source other than the
/// instance-metadata service, which `object_store` falls back to last.
pub(super) fn has_credential_source(builder: &AmazonS3Builder) -> bool {
    let set = |key: AmazonS3ConfigKey| builder.get_config_value(&key).is_some();
    let skip_signature = builder
        .get_config_value(&AmazonS3ConfigKey::SkipSignature)
        .is_some_and(|value| matches!(value.to_ascii_lowercase().as_str(), "true" | "1"));
    set(AmazonS3ConfigKey::AccessKeyId)
        || set(AmazonS3ConfigKey::SecretAccessKey)
        || (set(AmazonS3ConfigKey::WebIdentityTokenFile) && set(AmazonS3ConfigKey::RoleArn))
        || set(AmazonS3ConfigKey::ContainerCredentialsRelativeUri)
        || (set(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && set(AmazonS3ConfigKey::ContainerAuthorizationTokenFile))
        || skip_signature
}

/// Checks an endpoint: `http://` or `https://`, a host, an optional port,
/// at most a `/` after it; no user info, path, query or fragment; plain
/// ASCII with no white space; and written the way the URL parser reads it,
/// so the string the HTTP client is given is the one checked here. The
/// error completes "endpoint X ...".
pub(crate) fn check_endpoint(endpoint: &str) -> Result<(), String> {
    const EXAMPLE: &str = "such as http://127.0.0.1:9000";
    if endpoint.is_empty() {
        return Err(format!("is empty; give a URL {EXAMPLE}"));
    }
    if let Some(odd) = endpoint
        .chars()
        .find(|c| !c.is_ascii() || c.is_ascii_whitespace() || c.is_ascii_control())
    {
        return Err(format!(
            "contains {odd:?}; an endpoint is a plain ASCII URL {EXAMPLE}"
        ));
    }
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(format!("is not http(s); give a URL {EXAMPLE}"));
    }
    let parsed = url::Url::parse(endpoint).map_err(|error| format!("is not a URL: {error}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("carries a user name or password; give credentials in the options".into());
    }
    // guard: F8-endpoint-has-no-query
    if parsed.query().is_some() {
        return Err(
            "has a query (`?...`), which would be sent in place of the object's path".into(),
        );
    }
    if parsed.fragment().is_some() {
        return Err("has a fragment (`#...`)".into());
    }
    if parsed.path() != "/" {
        return Err(format!(
            "has a path ({:?}); requests go to ENDPOINT/BUCKET/OBJECT",
            parsed.path()
        ));
    }
    // guard: F8-endpoint-is-canonical
    if parsed.as_str().trim_end_matches('/') != endpoint.trim_end_matches('/') {
        return Err(format!(
            "is read as {:?}; write it that way",
            parsed.as_str()
        ));
    }
    Ok(())
}

/// Checks a bucket name by S3's rules: 3 to 63 characters of lowercase
/// letters, digits, `.` and `-`, beginning and ending with a letter or a
/// digit, no `..`.
pub(super) fn check_bucket(bucket: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let bytes = bucket.as_bytes();
    if !(3..=63).contains(&bytes.len())
        || !bytes.iter().all(|&b| allowed(b))
        || !edge(bytes.first())
        || !edge(bytes.last())
        || bucket.contains("..")
    {
        return Err(format!(
            "bucket {bucket:?} is not a valid bucket name (3 to 63 lowercase letters, digits, \
             `.` and `-`, beginning and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Checks a region: 1 to 64 ASCII letters, digits, `-` and `_` (it becomes
/// part of a host name and of every request's signature).
pub(super) fn check_region(region: &str) -> Result<(), String> {
    if region.is_empty()
        || region.len() > 64
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "region {region:?} is not a region name (letters, digits, `-` and `_`)"
        ));
    }
    Ok(())
}

/// The namespace of an `s3://` URL as written (the URL parser would resolve
/// `..` and keep `%XX` escapes): the path after the bucket, each segment
/// percent-decoded once; one trailing `/` is allowed; `kvtier` when there
/// is no path.
pub(super) fn namespace_of(url: &str) -> Result<String, String> {
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    let authority_and_path = after_scheme.split(['?', '#']).next().unwrap_or("");
    let path = authority_and_path
        .find('/')
        .map_or("", |slash| &authority_and_path[slash + 1..]);
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() {
        return Ok("kvtier".to_owned());
    }
    let mut namespace = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        let decoded = percent_encoding::percent_decode_str(segment)
            .decode_utf8()
            .map_err(|_| format!("namespace segment {segment:?} is not UTF-8 once decoded"))?;
        if decoded.contains('/') {
            return Err(format!(
                "namespace segment {segment:?} decodes to a `/`; separate segments with `/`"
            ));
        }
        if i > 0 {
            namespace.push('/');
        }
        namespace.push_str(&decoded);
    }
    Ok(namespace)
}

/// A credential is printable ASCII without spaces (what access keys,
/// secrets and session tokens are made of), and not empty.
pub(super) fn check_credential(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{name} is empty"));
    }
    if let Some(bad) = value.bytes().find(|byte| !byte.is_ascii_graphic()) {
        return Err(format!(
            "{name} holds the byte {bad:#04x}; a credential is printable ASCII without spaces"
        ));
    }
    Ok(())
}
