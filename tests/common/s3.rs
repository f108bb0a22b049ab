//! A real S3-compatible server on loopback for the object-store tests.
//!
//! By default an in-process one: s3s serving a temporary directory (s3s-fs)
//! on a free loopback port, with SigV4 authentication and the test
//! credentials, so `cargo test` needs nothing but cargo. When
//! `KVTIER_S3_ENDPOINT` is set (`.ci/run` starts moto and sets it), the
//! tests that share a server use that one instead, so every submission is
//! also checked against a second, independent implementation. A test that
//! stops its server mid-run always gets an in-process server of its own.

use std::io::{Read, Write};
use std::net::TcpStream;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

/// The credentials every test server accepts.
pub const ACCESS_KEY: &str = "testing";
pub const SECRET_KEY: &str = "testing";

/// A server the tests talk to; an in-process one stops when dropped.
pub struct S3Server {
    pub endpoint: String,
    kind: Kind,
}

enum Kind {
    /// `KVTIER_S3_ENDPOINT`: a server someone else runs (moto in CI).
    External,
    /// SeaweedFS started for one test by python/integration/seaweed.py,
    /// its data in `dir`; stopped when dropped.
    Seaweed { dir: tempfile::TempDir },
    /// s3s on a thread of this process, serving `root`.
    InProcess {
        root: tempfile::TempDir,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

impl S3Server {
    /// The server of `KVTIER_S3_ENDPOINT`, or a fresh in-process one.
    pub fn shared_or_start() -> S3Server {
        match std::env::var("KVTIER_S3_ENDPOINT") {
            Ok(endpoint) => S3Server {
                endpoint,
                kind: Kind::External,
            },
            Err(_) => S3Server::start(),
        }
    }

    /// A server with multipart uploads and their listing (which the
    /// in-process s3s server lacks): `KVTIER_S3_ENDPOINT`'s, or a SeaweedFS
    /// of this test's own when its `weed` binary is installed
    /// (`KVTIER_WEED`, or target/seaweed-venv, which `.ci/run` and the
    /// Python fixtures install). `None`, with the reason printed, when
    /// there is neither: `cargo test` needs nothing but cargo.
    pub fn with_upload_listing() -> Option<S3Server> {
        if std::env::var_os("KVTIER_S3_ENDPOINT").is_some() {
            return Some(S3Server::shared_or_start());
        }
        // The workspace's root: the package's own directory, or above it
        // (the command line's tests include this file from cli/).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .find(|dir| dir.join("python/integration/seaweed.py").is_file())
            .expect("the checkout holds python/integration/seaweed.py");
        let installed = std::env::var_os("KVTIER_WEED").is_some()
            || root.join("target/seaweed-venv/bin/weed").exists();
        if !installed {
            eprintln!(
                "skipped: no KVTIER_S3_ENDPOINT and no weed binary (a server that lists multipart uploads)"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let started = std::process::Command::new("python3")
            .arg(root.join("python/integration/seaweed.py"))
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("python3 runs seaweed.py");
        assert!(
            started.status.success(),
            "seaweed.py start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        let endpoint = String::from_utf8(started.stdout).unwrap().trim().to_owned();
        Some(S3Server {
            endpoint,
            kind: Kind::Seaweed { dir },
        })
    }

    /// A fresh in-process server on a free loopback port, ready to answer.
    pub fn start() -> S3Server {
        let root = tempfile::tempdir().unwrap();
        let store = s3s_fs::FileSystem::new(root.path()).expect("an s3s-fs root");
        let mut builder = S3ServiceBuilder::new(store);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let http = ConnBuilder::new(TokioExecutor::new());
                let mut stopped = stopped;
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((socket, _)) = accepted else { continue };
                            let connection = http
                                .serve_connection(TokioIo::new(socket), service.clone())
                                .into_owned();
                            tokio::spawn(async move {
                                let _ = connection.await;
                            });
                        }
                        _ = &mut stopped => break,
                    }
                }
            });
            // Ends every open connection: the server is gone, as if killed.
            runtime.shutdown_background();
        });
        S3Server {
            endpoint,
            kind: Kind::InProcess {
                root,
                stop: Some(stop),
                thread: Some(thread),
            },
        }
    }

    /// Creates `bucket`: a directory of the in-process server's root, or an
    /// unsigned `CreateBucket`, which moto accepts.
    pub fn create_bucket(&self, bucket: &str) {
        match &self.kind {
            Kind::InProcess { root, .. } => {
                std::fs::create_dir(root.path().join(bucket)).unwrap();
            }
            Kind::External | Kind::Seaweed { .. } => {
                let address = self.endpoint.trim_start_matches("http://");
                let mut stream = TcpStream::connect(address).expect("connect to the S3 server");
                write!(
                    stream,
                    "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                assert!(
                    response.starts_with("HTTP/1.1 200"),
                    "CreateBucket {bucket}: {}",
                    response.lines().next().unwrap_or("")
                );
            }
        }
    }

    /// Options reaching `bucket` on this server with the test credentials,
    /// and short timeouts (2 s a request, 1 s to connect, one retry): a
    /// server stopped mid-test costs seconds, not minutes.
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    pub fn s3_options(&self, bucket: &str) -> kvtier::tier::S3Options {
        kvtier::tier::S3Options::new(bucket)
            .endpoint(self.endpoint.clone())
            .allow_http(true)
            .credentials(ACCESS_KEY, SECRET_KEY)
            .region("us-east-1")
            .request_timeout(std::time::Duration::from_secs(2))
            .connect_timeout(std::time::Duration::from_secs(1))
            .max_retries(1)
    }

    /// object_store's own client of `bucket` on this server, for what the
    /// tiers never do themselves (start a multipart upload, say).
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    pub fn amazon_s3(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .build()
            .expect("a client of the test server")
    }

    /// Stops the server (only an in-process one); its connections end.
    pub fn stop(&mut self) {
        let Kind::InProcess { stop, thread, .. } = &mut self.kind else {
            panic!("only an in-process server can be stopped by a test");
        };
        if let Some(stop) = stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        match &self.kind {
            Kind::InProcess { .. } => self.stop(),
            Kind::Seaweed { dir } => {
                let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .ancestors()
                    .map(|dir| dir.join("python/integration/seaweed.py"))
                    .find(|script| script.is_file())
                    .expect("the checkout holds python/integration/seaweed.py");
                let _ = std::process::Command::new("python3")
                    .arg(script)
                    .arg("stop")
                    .arg(dir.path())
                    .status();
            }
            Kind::External => {}
        }
    }
}

/// A bucket name unique to this process and call.
pub fn unique_bucket(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
