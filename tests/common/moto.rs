//! A real S3-compatible server on loopback for the object-store tests:
//! `moto_server` (`pip install "moto[server]"`), started per test or shared
//! through `KVTIER_S3_ENDPOINT` (which `.ci/run` sets).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server; killed on drop (if this process started it).
pub struct Moto {
    pub endpoint: String,
    child: Option<Child>,
}

impl Moto {
    /// The shared server of `KVTIER_S3_ENDPOINT`, or a fresh one.
    pub fn shared_or_start() -> Moto {
        match std::env::var("KVTIER_S3_ENDPOINT") {
            Ok(endpoint) => Moto {
                endpoint,
                child: None,
            },
            Err(_) => Moto::start(),
        }
    }

    /// A fresh server on a free loopback port, ready to answer.
    pub fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start moto_server ({error}): the object-store tests need a local \
                     S3-compatible server; install it with `pip install \"moto[server]\"` \
                     or point KVTIER_S3_ENDPOINT at one"
                )
            });
        let moto = Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            child: Some(child),
        };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "moto_server did not listen on port {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        moto
    }

    /// Creates `bucket` (S3 `CreateBucket`, which moto accepts unsigned).
    pub fn create_bucket(&self, bucket: &str) {
        let address = self.endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).expect("connect to moto");
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

    /// Stops the server (only one this process started).
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("a server this test started");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
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
