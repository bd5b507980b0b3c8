//! The binary's allocator (and the benches'): mimalloc, and no transparent huge pages for the
//! commands that build many plans.
//!
//! Planning allocates and drops millions of small buffers (ops' events, names, the timeline's
//! and the allocator replay's per-op vectors), and `tune` builds thousands of plans: mimalloc
//! halves that time against glibc's malloc. mimalloc also purges the pages it has had free
//! for a while, and a search allocates them again at once: each is faulted in and zeroed by
//! the kernel again — under transparent huge pages (Linux's default, `always`, on this
//! project's VM) 2 MiB at a time, whatever the allocation touches. `perf` put a fifth to a
//! quarter of a `tune` run in that zeroing (`clear_page_erms`). Llama-3-8B on 8 H100s at
//! 64 × 4096, CPU time over six runs each, interleaved in random order, on 2026-11-28: 5.6–6.3 s
//! without huge pages against 5.2–8.1 s with them (mimalloc's purge delay off instead:
//! 5.8–8.1 s).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (Linux; nothing elsewhere): for the
/// searches (`tune`, `fit`, `sweep`), not for training, whose tensors they may serve (the
/// setting is inherited by the processes it starts).
pub fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with an integer option and integer arguments; it changes a flag of this
    // process's memory map, nothing Rust holds
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn huge_pages_are_turned_off() {
        super::no_huge_pages();
        // SAFETY: reads the flag
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }, 1);
    }
}
