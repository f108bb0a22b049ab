//! Test backends shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use kvtier::lookup::Backend;

/// One backend call, as the test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub request: String,
    pub keys: Vec<u64>,
}

/// A backend that holds a fixed set of keys, reports every call on a channel
/// before answering, and blocks a gated request's call until the test opens
/// its gate. This is how tests wait for the worker deterministically.
pub struct GatedBackend {
    present: HashSet<u64>,
    started: Sender<Call>,
    gates: HashMap<String, Receiver<()>>,
}

pub struct Harness {
    pub backend: GatedBackend,
    pub started: Receiver<Call>,
}

impl Harness {
    /// A backend holding `present`, and the receiving end of its call reports.
    pub fn new(present: impl IntoIterator<Item = u64>) -> Harness {
        let (started, started_rx) = channel();
        Harness {
            backend: GatedBackend {
                present: present.into_iter().collect(),
                started,
                gates: HashMap::new(),
            },
            started: started_rx,
        }
    }

    /// Makes `request`'s next call wait until the returned sender sends `()`.
    pub fn gate(&mut self, request: &str) -> Sender<()> {
        let (open, wait) = channel();
        self.backend.gates.insert(request.to_owned(), wait);
        open
    }
}

impl Backend<u64, String> for GatedBackend {
    type Answers = Vec<bool>;
    type Error = std::convert::Infallible;

    fn batch_lookup(&mut self, keys: &[u64], request: &String) -> Result<Vec<bool>, Self::Error> {
        let _ = self.started.send(Call {
            request: request.clone(),
            keys: keys.to_vec(),
        });
        if let Some(gate) = self.gates.remove(request) {
            // The timeout is not synchronisation: it only keeps a failing
            // test (which never opens the gate) from hanging in the join.
            let _ = gate.recv_timeout(Duration::from_secs(20));
        }
        Ok(keys.iter().map(|key| self.present.contains(key)).collect())
    }
}

/// The next backend call reported on `started`. Waits at most 20 s (not
/// synchronisation: a test whose worker never calls the backend fails instead
/// of hanging).
pub fn next_call(started: &Receiver<Call>) -> Call {
    started
        .recv_timeout(Duration::from_secs(20))
        .expect("the worker never called the backend")
}

/// Owned request ids for readability: `req("a")`.
pub fn req(id: &str) -> String {
    id.to_owned()
}
pub mod fake_s3;
pub mod outage;
pub mod s3;
pub mod valkey;
