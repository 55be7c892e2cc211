//! The C allocator's tuning for a long-lived daemon (glibc only; elsewhere nothing).

/// Gives the kernel back the whole free pages inside the C allocator's heap (glibc's
/// `malloc_trim(0)`; elsewhere nothing). Freed memory in the middle of the heap is otherwise
/// kept: a registry round at 10,000 jobs frees several megabytes that an idle node kept
/// (issue 23). It walks the free lists once: call it after such a round, not per run.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it only madvises free pages of the allocator's
    // own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
