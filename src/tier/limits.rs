//! Bounds on what a caller can make a tier hold.

/// The most I/O threads one tier or transfer pool starts: a thread count
/// is a caller's number, and each thread reserves a stack.
pub const MAX_IO_THREADS: usize = 1024;
