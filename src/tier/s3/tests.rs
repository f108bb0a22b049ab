use super::*;

#[test]
fn debug_output_never_shows_the_secret_access_key() {
    let options = S3Options::new("bucket").credentials("key-id", "very-secret");
    let shown = format!("{options:?}");
    assert!(!shown.contains("very-secret"), "{shown}");
    assert!(
        shown.contains("key-id") && shown.contains("<redacted>"),
        "{shown}"
    );
    let shown = format!("{:?}", S3Options::new("bucket"));
    assert!(shown.contains("secret_access_key: None"), "{shown}");
}

#[test]
fn endpoints_are_plain_http_urls_of_a_host() {
    for good in [
        "http://127.0.0.1:9000",
        "http://127.0.0.1:9000/",
        "https://minio.local:9000",
        "http://[::1]:9000",
        "http://localhost",
    ] {
        assert_eq!(check_endpoint(good), Ok(()), "{good}");
    }
    let refused = [
        ("", "is empty"),
        ("::::", "not http"),
        ("http://", "not a URL"),
        ("not a url", "contains ' '"),
        ("http://127.0.0.1:9000?x=1", "query"),
        ("http://127.0.0.1:9000/?", "query"),
        ("http://127.0.0.1:9000#frag", "fragment"),
        ("http://127.0.0.1:9000/%23frag", "path"),
        ("http://127.0.0.1:9000/x%20y", "path"),
        ("http://user:pw@127.0.0.1:9000", "user name"),
        ("http://127.0.0.1:9000\t", "contains '\\t'"),
        ("http://\tlocalhost", "contains '\\t'"),
        ("http://bücher.example", "plain ASCII"),
        ("http:127.0.0.1:9000", "not http"),
        ("http://LOCALHOST:9000", "is read as"),
        ("http://localhost:80", "is read as"),
        ("HTTP://localhost", "not http"),
        ("ftp://localhost", "not http"),
        ("file:///tmp", "not http"),
    ];
    for (bad, reason) in refused {
        match check_endpoint(bad) {
            Err(message) => assert!(message.contains(reason), "{bad:?}: {message}"),
            Ok(()) => panic!("{bad:?} accepted"),
        }
    }
}

#[test]
fn a_credential_with_a_control_byte_or_a_space_is_refused() {
    let with = |id: &str, secret: &str| S3Options::new("bucket").credentials(id, secret);
    assert!(
        with("AKIDEXAMPLE", "wJalr/XUtnFEMI+K7MDENG")
            .validate()
            .is_ok()
    );
    for (id, secret) in [
        ("AKID\r\nX-Injected: 1", "secret"),
        ("AKID", "sec\nret"),
        ("AKID EXAMPLE", "secret"),
        ("", "secret"),
        ("AKID", "s\0"),
    ] {
        let error = with(id, secret).validate().expect_err(id);
        assert!(matches!(error, TierError::Config(_)), "{error}");
    }
}

#[test]
fn bucket_names_follow_the_s3_rules() {
    for good in ["abc", "kv-cache", "kv.cache.0", &"a".repeat(63)] {
        assert_eq!(check_bucket(good), Ok(()), "{good}");
    }
    for bad in [
        "ab",
        "adv_b!",
        "Upper",
        "-lead",
        "trail-",
        "a..b",
        &"a".repeat(64),
        "",
    ] {
        assert!(check_bucket(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn namespaces_are_decoded_once_and_never_resolved() {
    let cases = [
        ("s3://bkt", Ok("kvtier")),
        ("s3://bkt/", Ok("kvtier")),
        ("s3://bkt/my%20ns", Ok("my ns")),
        ("s3://bkt/my%2520ns", Ok("my%20ns")),
        ("s3://bkt/a/b/", Ok("a/b")),
        ("s3://bkt/a?endpoint=http://h/x", Ok("a")),
        ("s3://bkt?endpoint=http://h/x", Ok("kvtier")),
        ("s3://bkt/a%2Fb", Err("decodes to a `/`")),
        ("s3://bkt/%ff", Err("not UTF-8")),
    ];
    for (url, expected) in cases {
        match (namespace_of(url), expected) {
            (Ok(namespace), Ok(expected)) => assert_eq!(namespace, expected, "{url}"),
            (Err(message), Err(reason)) => {
                assert!(message.contains(reason), "{url}: {message}")
            }
            (got, _) => panic!("{url}: {got:?}"),
        }
    }
    for (url, reason) in [
        ("s3://bkt/../x", "`..`"),
        ("s3://bkt/a/./x", "`.`"),
        ("s3://bkt/%2e%2e/x", "`..`"),
        ("s3://bkt/a//x", "empty component"),
    ] {
        match S3Options::from_url(url) {
            Err(TierError::Config(message)) => {
                assert!(message.contains(reason), "{url}: {message}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[test]
fn out_of_range_settings_are_refused_not_overflowed() {
    let mut options = S3Options::new("bucket");
    assert!(options.validate().is_ok());
    for timeout in [
        Duration::MAX,
        Duration::ZERO,
        MAX_TIMEOUT + Duration::from_secs(1),
    ] {
        options.request_timeout = timeout;
        assert!(options.validate().is_err(), "{timeout:?}");
        options.request_timeout = Duration::from_secs(5);
        options.connect_timeout = timeout;
        assert!(options.validate().is_err(), "{timeout:?}");
        options.connect_timeout = Duration::from_secs(2);
    }
    options.request_timeout = MAX_TIMEOUT;
    options.max_retries = MAX_RETRIES;
    assert!(options.validate().is_ok());
    for retries in [MAX_RETRIES + 1, u32::MAX as usize, usize::MAX] {
        options.max_retries = retries;
        assert!(options.validate().is_err(), "{retries}");
    }
    options.max_retries = 2;
    options.region = Some("eu-west-1/../x".into());
    assert!(options.validate().is_err());
}
