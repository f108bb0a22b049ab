//! Helpers for faults kvtier turns into counted outcomes instead of panics.

/// The message of a caught panic, for logs and error values.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The message of a caught panic, dropping its payload where a payload
/// whose own `Drop` panics cannot unwind into the caller (see
/// [`drop_payload`]). Every caught panic ends here.
pub(crate) fn take_panic(payload: Box<dyn std::any::Any + Send>) -> String {
    let message = panic_message(payload.as_ref());
    drop_payload(payload);
    message
}

/// Drops a caught panic's payload. A payload is any value a backend or task
/// chose to panic with, and its `Drop` may panic too: that second panic is
/// caught here and its own payload leaked rather than dropped (it could do
/// the same again), so a worker thread never dies of it.
pub(crate) fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
    if let Err(second) = dropped {
        tracing::error!("a panic payload panicked while dropped; its payload is leaked");
        std::mem::forget(second);
    }
}

/// Runs `f` with a fmt subscriber installed; returns its result and what
/// was logged (no colours), so tests can assert that a fault is logged.
#[cfg(test)]
pub(crate) fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    use crate::sync::{Arc, Mutex};

    #[derive(Clone)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let captured = Captured(Arc::new(Mutex::new(Vec::new())));
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(captured.0.lock().clone()).expect("utf-8 log");
    (result, text)
}

#[cfg(test)]
mod tests {
    use super::{panic_message, take_panic};

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        let text = std::panic::catch_unwind(|| panic!("backend gone")).unwrap_err();
        assert_eq!(panic_message(text.as_ref()), "backend gone");
        let formatted = std::panic::catch_unwind(|| panic!("backend {} gone", 7)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), "backend 7 gone");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "non-string panic payload");
    }

    /// A payload whose `Drop` panics (a backend can panic with any value).
    pub(crate) struct PanicsWhenDropped;

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("the payload's own drop panics");
        }
    }

    #[test]
    fn a_payload_that_panics_when_dropped_is_contained() {
        let caught =
            std::panic::catch_unwind(|| std::panic::panic_any(PanicsWhenDropped)).unwrap_err();
        assert_eq!(take_panic(caught), "non-string panic payload");
    }
}
