//! A global allocator that tracks the bytes currently allocated and their peak, so a target
//! can assert that an input of n bytes never makes reprolm hold more than its documented bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Set once the binary's `#[global_allocator]` is this one (the replay tests do not install it).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

fn add(n: usize) {
    ACTIVE.store(1, Relaxed);
    let now = CURRENT.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            add(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            add(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Relaxed);
            add(new_size);
        }
        p
    }
}

/// Runs `f` and returns its result with the peak number of bytes allocated during the call
/// beyond what was allocated before it (`None` when the counting allocator is not installed).
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    (out, (ACTIVE.load(Relaxed) == 1).then_some(peak))
}
