//! The client of the fleet's books: one connection to Valkey (or Redis),
//! kept and re-made by redis-rs's connection manager, and the books'
//! script (`books.lua`), each [`Op`] one `EVALSHA` (loaded on first use).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script, Value};

use super::ops::{BadReply, Frame, Op, Reply};

/// The script every host runs: the books change only through it.
pub const BOOKS_SCRIPT: &str = include_str!("books.lua");

/// Why a call to the books did not get an answer the protocol knows.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // url: the index (no password); detail: the client's words
pub enum FleetError {
    /// The index URL or a namespace is not usable.
    #[error("fleet index: {0}")]
    Config(String),
    /// The server did not answer (refused, reset, timed out).
    #[error("fleet index at {url} did not answer: {detail}")]
    Unreachable { url: String, detail: String },
    /// The server answered with an error (a script error, a refusal).
    #[error("fleet index at {url} refused {op}: {detail}")]
    Server {
        url: String,
        op: &'static str,
        detail: String,
    },
    #[error(transparent)]
    BadReply(#[from] BadReply),
}

/// Timeouts of the connection to the books.
#[derive(Clone, Copy, Debug)]
pub struct IndexTimeouts {
    /// Connecting (and reconnecting).
    pub connect: Duration,
    /// One command's answer.
    pub response: Duration,
}

impl Default for IndexTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        }
    }
}

/// One namespace's books on one server (cheap to clone: clones share the
/// connection).
#[derive(Clone)]
pub struct FleetBooks {
    url: Arc<str>,
    conn: ConnectionManager,
    script: Arc<Script>,
    keys: Arc<[String; 7]>,
}

impl std::fmt::Debug for FleetBooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetBooks")
            .field("url", &self.url)
            .field("namespace", &self.keys[0])
            .finish_non_exhaustive()
    }
}

/// The seven keys of `namespace`'s books, one hash slot (`{namespace}`).
pub fn books_keys(namespace: &str) -> Result<[String; 7], FleetError> {
    if namespace.is_empty() || namespace.contains(['{', '}']) {
        return Err(FleetError::Config(format!(
            "the namespace {namespace:?} must be non-empty and without braces"
        )));
    }
    Ok([
        "meta",
        "blocks",
        "recency",
        "held",
        "pins",
        "deadlines",
        "rebuild",
    ]
    .map(|part| format!("kvtier:{{{namespace}}}:{part}")))
}

impl FleetBooks {
    /// Connects to `url` (`redis://host:port[/db]`, `rediss://` for TLS
    /// where the client was built with it) for `namespace`'s books.
    pub async fn connect(
        url: &str,
        namespace: &str,
        timeouts: IndexTimeouts,
    ) -> Result<Self, FleetError> {
        let keys = books_keys(namespace)?;
        let shown = redacted(url);
        let client = Client::open(url)
            .map_err(|error| FleetError::Config(format!("the index URL {shown}: {error}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(timeouts.connect);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|error| FleetError::Unreachable {
                url: shown.clone(),
                detail: error.to_string(),
            })?;
        Ok(Self {
            url: shown.into(),
            conn,
            script: Arc::new(Script::new(BOOKS_SCRIPT)),
            keys: Arc::new(keys),
        })
    }

    /// The index's URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `op` under `epoch` (any string for the operations that need
    /// none) and reads its answer.
    pub async fn call(&self, epoch: &str, op: &Op) -> Result<Reply, FleetError> {
        let mut invocation = self.script.prepare_invoke();
        for key in self.keys.iter() {
            invocation.key(key);
        }
        invocation.arg(op.name()).arg(epoch);
        for arg in op.args() {
            invocation.arg(arg);
        }
        let mut conn = self.conn.clone();
        let value: Value = invocation.invoke_async(&mut conn).await.map_err(|error| {
            if error.is_io_error() || error.is_timeout() || error.is_connection_dropped() {
                FleetError::Unreachable {
                    url: self.url.to_string(),
                    detail: error.to_string(),
                }
            } else {
                FleetError::Server {
                    url: self.url.to_string(),
                    op: op.name(),
                    detail: error.to_string(),
                }
            }
        })?;
        Ok(op.parse(&frame(value))?)
    }

    /// Deletes `namespace`'s books outright (tests, and `kvtier trim
    /// --index … --reset`): the hosts see them lost and rebuild.
    pub async fn wipe(&self) -> Result<(), FleetError> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(&self.keys[..])
            .query_async::<()>(&mut conn)
            .await
            .map_err(|error| FleetError::Unreachable {
                url: self.url.to_string(),
                detail: error.to_string(),
            })
    }
}

/// The client library's value as the protocol's frame.
fn frame(value: Value) -> Frame {
    match value {
        Value::Nil => Frame::Nil,
        Value::Int(n) => Frame::Int(n),
        Value::BulkString(bytes) => Frame::Text(bytes),
        Value::SimpleString(text) => Frame::Text(text.into_bytes()),
        Value::Okay => Frame::Text(b"OK".to_vec()),
        Value::Array(items) | Value::Set(items) => {
            Frame::Array(items.into_iter().map(frame).collect())
        }
        Value::Boolean(b) => Frame::Int(i64::from(b)),
        other => Frame::Text(format!("{other:?}").into_bytes()),
    }
}

/// `url` with any password replaced by `***`.
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_one_hash_slot_and_braces_are_refused() {
        let keys = books_keys("bucket/model_r0").unwrap();
        assert_eq!(keys[0], "kvtier:{bucket/model_r0}:meta");
        assert!(keys.iter().all(|key| key.contains("{bucket/model_r0}")));
        assert!(books_keys("a{b}").is_err());
        assert!(books_keys("").is_err());
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redacted("redis://user:secret@127.0.0.1:6379/0"),
            "redis://user:***@127.0.0.1:6379/0"
        );
        assert_eq!(redacted("redis://127.0.0.1:1"), "redis://127.0.0.1:1");
    }
}
