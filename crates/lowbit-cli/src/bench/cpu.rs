//! CPU side of `lowbit bench`.
