//! The C allocator's tuning for a long-lived daemon (glibc only; elsewhere nothing).

/// Caps glibc's malloc at `arenas` arenas. Call it first thing in `main`, before any thread
/// starts. glibc gives each thread that meets a locked arena a new one (up to 8 per core),
/// and every arena keeps the pages it once used: an idle node kept ~6 MiB in six arenas
/// (issue 23). Threads then share arenas and their locks: the CLI and the benchmark ask
/// for two (one cost CPU per run at 1,000 runs a second; see BENCHMARKS.md). Unlike
/// `MALLOC_ARENA_MAX` in the environment, this is not inherited by the jobs.
pub fn limit_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator (no pointer, no memory of
    // ours); glibc takes its own lock for it, and an unknown value is refused with 0.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

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
