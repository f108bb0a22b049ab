//! A deterministic backend for the driver models, and the answers the
//! specification expects from it.
//!
//! The tier's contents may change from one backend call to the next (a block
//! evicted between two probes): [`Script::contents`] sees the call number.
//! That is what lets a model tell an old generation's answer from a new one's.
//! Faults are scripted per call.

use std::fmt;

use kvtier::lookup::Backend;

use crate::reference::{Key, Req};

/// What the backend does on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum Fault {
    /// Answers every key.
    None,
    /// Returns an error: every key misses.
    Error,
    /// Panics before answering anything.
    PanicInCall,
    /// Answers the first half of the keys (rounded down), then panics while
    /// the next answer is pulled.
    PanicMidway,
    /// Answers only the first half of the keys (rounded down).
    Short,
    /// Answers every key and one more.
    Surplus,
}

/// The panic payload of a scripted panic, so hooks can recognise it.
#[derive(Debug)]
pub struct ScriptedPanic(pub u64);

/// Whether `key` is stored when the backend is called for the `call`-th time.
pub type Contents = fn(Key, u64) -> bool;

/// A backend's behaviour, call by call.
#[derive(Clone)]
pub struct Script {
    contents: Contents,
    faults: Vec<Fault>,
}

impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Script")
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl Script {
    /// A backend with the given contents that never fails.
    pub fn new(contents: Contents) -> Self {
        Self {
            contents,
            faults: Vec::new(),
        }
    }

    /// The same backend, failing on call `i` as `faults[i]` says (calls past
    /// the end answer normally).
    pub fn with_faults(mut self, faults: impl IntoIterator<Item = Fault>) -> Self {
        self.faults = faults.into_iter().collect();
        self
    }

    /// What call `call` does.
    pub fn fault(&self, call: u64) -> Fault {
        usize::try_from(call)
            .ok()
            .and_then(|i| self.faults.get(i).copied())
            .unwrap_or(Fault::None)
    }

    /// Whether `key` is stored at call `call`.
    pub fn contents(&self, key: Key, call: u64) -> bool {
        (self.contents)(key, call)
    }

    /// The answers the driver must apply for `keys` probed by call `call`:
    /// the scripted contents for every key the backend answered, a miss for
    /// every other key.
    pub fn expected(&self, keys: &[Key], call: u64) -> Vec<bool> {
        let answered = match self.fault(call) {
            Fault::None | Fault::Surplus => keys.len(),
            Fault::Error | Fault::PanicInCall => 0,
            Fault::PanicMidway | Fault::Short => keys.len() / 2,
        };
        keys.iter()
            .enumerate()
            .map(|(i, &key)| i < answered && self.contents(key, call))
            .collect()
    }

    /// The backend itself, starting at call 0.
    pub fn backend(&self) -> ScriptedBackend {
        ScriptedBackend {
            script: self.clone(),
            calls: 0,
        }
    }
}

/// "Even keys are stored", at every call.
pub fn even(key: Key, _call: u64) -> bool {
    key.is_multiple_of(2)
}

/// A key is stored at one call and not the next, alternately (even keys
/// start stored): every reprobe of a key gets the opposite answer.
pub fn flipping(key: Key, call: u64) -> bool {
    (key + call).is_multiple_of(2)
}

/// A stable pseudo-random mix of key and call: about half stored.
pub fn mixed(key: Key, call: u64) -> bool {
    let mut z = key
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(call.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z ^= z >> 29;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    (z >> 32) & 1 == 1
}

/// The backend a [`Script`] describes. Each call to it is one call number.
#[derive(Debug)]
pub struct ScriptedBackend {
    script: Script,
    calls: u64,
}

impl Backend<Key, Req> for ScriptedBackend {
    type Answers = ScriptedAnswers;
    type Error = String;

    fn batch_lookup(&mut self, keys: &[Key], _request: &Req) -> Result<ScriptedAnswers, String> {
        let call = self.calls;
        self.calls += 1;
        let fault = self.script.fault(call);
        let answers: Vec<bool> = keys
            .iter()
            .map(|&key| self.script.contents(key, call))
            .collect();
        let (limit, panic_at) = match fault {
            Fault::None => (keys.len(), None),
            Fault::Surplus => (keys.len() + 1, None),
            Fault::Error => return Err(format!("scripted error in call {call}")),
            Fault::PanicInCall => std::panic::panic_any(ScriptedPanic(call)),
            Fault::PanicMidway => (keys.len(), Some(keys.len() / 2)),
            Fault::Short => (keys.len() / 2, None),
        };
        Ok(ScriptedAnswers {
            answers,
            next: 0,
            limit,
            panic_at,
            call,
        })
    }
}

/// A lazy answer iterator: yields the scripted contents, may run short, run
/// over, or panic part way.
#[derive(Debug)]
pub struct ScriptedAnswers {
    answers: Vec<bool>,
    next: usize,
    limit: usize,
    panic_at: Option<usize>,
    call: u64,
}

impl Iterator for ScriptedAnswers {
    type Item = bool;

    fn next(&mut self) -> Option<bool> {
        if self.panic_at == Some(self.next) {
            std::panic::panic_any(ScriptedPanic(self.call));
        }
        if self.next >= self.limit {
            return None;
        }
        let answer = self.answers.get(self.next).copied().unwrap_or(true);
        self.next += 1;
        Some(answer)
    }
}

/// Installs (once per process) a panic hook that keeps scripted backend
/// panics quiet and passes every other panic to the previous hook, so model
/// output shows real failures only.
pub fn quiet_scripted_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<ScriptedPanic>().is_none() {
                previous(info);
            }
        }));
    });
}
