//! CUDA side of `lowbit bench`.
