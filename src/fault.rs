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

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        let text = std::panic::catch_unwind(|| panic!("backend gone")).unwrap_err();
        assert_eq!(panic_message(text.as_ref()), "backend gone");
        let formatted = std::panic::catch_unwind(|| panic!("backend {} gone", 7)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), "backend 7 gone");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "non-string panic payload");
    }
}
