//! Counter structs whose fields are written once: `counters!` declares the
//! struct and, from the same list, `COUNT` and `counters()` (every field
//! with its name, in declaration order) for exporters (a metrics registry,
//! a Python dict) that should not list the fields again.

/// Declares a struct of `pub <name>: u64` fields with `COUNT` and
/// `counters()`.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: u64,
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: u64,
            )*
        }

        impl $name {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($field)),*].len();

            /// Every counter with its field's name, in declaration order.
            pub fn counters(&self) -> [(&'static str, u64); Self::COUNT] {
                [$((stringify!($field), self.$field)),*]
            }
        }
    };
}

pub(crate) use counters;
