//! A persistent worker pool for the forward pass.
//!
//! `run(f)` calls `f(i)` once on each of the pool's `n` threads (`i = 0` is the caller) and
//! returns when all are done. Workers spin briefly between calls, so the many short phases
//! of one forward pass cost a few hundred nanoseconds each, then sleep on a condition
//! variable so an idle model burns no CPU. Work is divided by the callers with
//! [`split`], a static partition: which thread computes an output never changes what is
//! computed, because every output is produced by one thread with one op sequence.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How long an idle worker spins before sleeping (in spin-loop iterations, ~tens of µs).
const SPIN_ITERS: u32 = 20_000;
/// Then how many times it yields its core before sleeping.
const YIELDS: u32 = 100;

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// The current job; written only by the caller while every worker is idle.
    job: UnsafeCell<Option<*const Job>>,
    epoch: AtomicU64,
    pending: AtomicUsize,
    sleepers: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the caller before an epoch is published (Release) and read by
// workers after they observe it (Acquire); it is not written again until all have finished.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job at a time.
    caller: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, the caller included (`n_threads >= 1`).
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            epoch: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads.max(1))
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("reprolm-{index}"))
                    .spawn(move || worker(&shared, index))
                    .expect("cannot spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, workers, caller: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every thread index `i` in `0..n_threads()`, in parallel.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _one_at_a_time = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: *const (dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: erase the lifetime; the pointer is only used until `pending` reaches zero,
        // which this function waits for before returning (even if `f` panics on this thread).
        unsafe { *s.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job)) };
        s.pending.store(self.workers.len(), SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            // On an oversubscribed machine a worker may be descheduled: give up the core.
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a reprolm worker thread panicked");
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while s.epoch.load(Acquire) == seen && !s.shutdown.load(Relaxed) {
            if spins < SPIN_ITERS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if spins < SPIN_ITERS + YIELDS {
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            let guard = if s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, SeqCst);
            drop(guard);
        }
        if s.shutdown.load(Acquire) {
            return;
        }
        seen = s.epoch.load(Acquire);
        // SAFETY: published before the epoch we observed; valid until we decrement pending.
        let job = unsafe { (*s.job.get()).expect("a job is published with every epoch") };
        if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) })).is_err() {
            s.panicked.store(true, SeqCst);
        }
        s.pending.fetch_sub(1, Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The `part`-th of `parts` contiguous, nearly equal pieces of `0..n`.
pub fn split(n: usize, part: usize, parts: usize) -> Range<usize> {
    (n * part / parts)..(n * (part + 1) / parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_per_call() {
        for n in [1, 2, 3, 7] {
            let pool = ThreadPool::new(n);
            for _ in 0..1000 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
            }
        }
    }

    #[test]
    fn split_covers_range_exactly() {
        for n in 0..50 {
            for parts in 1..8 {
                let mut next = 0;
                for p in 0..parts {
                    let r = split(n, p, parts);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn survives_sleeping_workers() {
        let pool = ThreadPool::new(3);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let sum = AtomicUsize::new(0);
        pool.run(|i| {
            sum.fetch_add(i + 1, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 6);
    }
}
