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

/// Largest free block at the top of a malloc arena that glibc keeps instead of giving its
/// pages back (see [`trim_tops_above`]).
pub const TOP_KEPT_MAX: usize = 1 << 20;

/// Makes glibc give back the free top of any arena above `bytes` when a block is freed
/// (`mallopt(M_TRIM_THRESHOLD)`; elsewhere nothing). Call it once, first thing in `main`.
///
/// By default glibc raises its trim threshold each time a large block is freed, up to
/// 64 MiB, and [`trim`] gives back only the main arena's top: a thread that parsed a large
/// configuration in its own arena then leaves megabytes resident there after everything in
/// it was freed. A fixed threshold also stops glibc's moving of the size from which a block
/// is its own `mmap` (it stays 128 KiB).
pub fn trim_tops_above(bytes: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt takes two integers and changes only the allocator's parameters,
        // under its own lock.
        let set = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, bytes) };
        debug_assert_eq!(set, 1, "glibc accepts any trim threshold");
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}
