//! A persistent worker pool for the forward pass.
//!
//! `run(n_chunks, f)` calls `f(c)` once for every chunk index `c` in `0..n_chunks`, on the
//! caller and the pool's workers together, and returns when all are done. Threads claim
//! chunks from a shared counter, so a worker the OS has descheduled never holds the others
//! up: the caller simply does more chunks. Which thread computes a chunk never changes what
//! is computed, because every output is produced by one thread with one op sequence.
//!
//! Workers spin briefly between calls (the many short phases of one forward pass cost well
//! under a microsecond each), then yield, then sleep on a condition variable so an idle
//! model burns no CPU.
//!
//! After `fork()` the child has none of the parent's threads: a pool made before the fork
//! runs every chunk on the caller (the same results, since they never depend on the thread
//! count) and never waits for, or joins, the workers it no longer has.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How long an idle worker spins before yielding (spin-loop iterations, ~tens of µs).
const SPIN_ITERS: u32 = 20_000;
/// Then how many times it yields its core before sleeping.
const YIELDS: u32 = 100;

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// The current job; written only by the caller while no worker is inside a job.
    job: UnsafeCell<Option<*const Job>>,
    n_chunks: AtomicUsize,
    next_chunk: AtomicUsize,
    /// Incremented to publish a job.
    epoch: AtomicU64,
    /// The last epoch whose job is closed to late-comers.
    closed: AtomicU64,
    /// Workers currently inside a job.
    active: AtomicUsize,
    sleepers: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the caller before an epoch is published and only while
// `active` is zero with the previous epoch closed; workers read it only after entering
// (`active` incremented) an epoch that is not closed. See `run` and `enter`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs chunks of the current job until none are left.
    fn work(&self, job: &(dyn Fn(usize) + Sync + '_)) {
        let n = self.n_chunks.load(Acquire);
        loop {
            let c = self.next_chunk.fetch_add(1, AcqRel);
            if c >= n {
                return;
            }
            job(c);
        }
    }
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job at a time.
    caller: Mutex<()>,
    /// [`fork_generation`] when the workers were started.
    generation: usize,
}

/// Forks this process has gone through (counted in the child, from the first pool on).
static FORKS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_fork_in_child() {
    FORKS.fetch_add(1, SeqCst);
}

/// How many times this process is a forked child of a process that had made a pool (or
/// another object that registered through here): threads started before a change of this
/// number do not exist any more.
pub fn fork_generation() -> usize {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: the handler only increments an atomic (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(count_fork_in_child)) };
    });
    FORKS.load(Relaxed)
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, the caller included (`n_threads >= 1`).
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            n_chunks: AtomicUsize::new(0),
            next_chunk: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            active: AtomicUsize::new(0),
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
                    .spawn(move || worker(&shared))
                    .expect("cannot spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, workers, caller: Mutex::new(()), generation: fork_generation() }
    }

    /// Whether this process is a fork of the one that started the workers.
    fn forked(&self) -> bool {
        FORKS.load(Relaxed) != self.generation
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(c)` for every chunk `c` in `0..n_chunks`, in parallel.
    pub fn run<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        if self.workers.is_empty() || n_chunks <= 1 || self.forked() {
            (0..n_chunks).for_each(f);
            return;
        }
        let _one_at_a_time = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: *const (dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: erase the lifetime; workers dereference the pointer only inside an open
        // epoch, and this function closes the epoch and waits for them before returning.
        unsafe { *s.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job)) };
        s.n_chunks.store(n_chunks, SeqCst);
        s.next_chunk.store(0, SeqCst);
        let epoch = s.epoch.fetch_add(1, SeqCst) + 1;
        if s.sleepers.load(SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| s.work(&f)));
        // Every chunk is claimed; close the epoch so no late worker enters, then wait for
        // those inside to finish their last chunk.
        s.closed.store(epoch, SeqCst);
        let mut spins = 0u32;
        while s.active.load(SeqCst) != 0 {
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

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while s.epoch.load(Acquire) == seen && !s.shutdown.load(Relaxed) {
            if spins < SPIN_ITERS + YIELDS {
                if spins < SPIN_ITERS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                spins += 1;
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
        seen = s.epoch.load(SeqCst);
        s.active.fetch_add(1, SeqCst);
        // Enter only if the caller has not closed this epoch (it may even have moved on to
        // a later one, which this worker will see on its next turn).
        if s.closed.load(SeqCst) < seen && s.epoch.load(SeqCst) == seen {
            // SAFETY: the epoch is open and we are counted in `active`, so the caller is
            // still inside `run` and the job pointer is valid.
            let job = unsafe { (*s.job.get()).expect("a job is published with every epoch") };
            if catch_unwind(AssertUnwindSafe(|| s.work(unsafe { &*job }))).is_err() {
                s.panicked.store(true, SeqCst);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        if self.forked() {
            // The workers are the parent's; their shared state may hold a lock forever.
            std::mem::forget(std::mem::take(&mut self.workers));
            return;
        }
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
    fn every_chunk_runs_once_per_call() {
        for n in [1, 2, 3, 7] {
            let pool = ThreadPool::new(n);
            for round in 0..2000 {
                let chunks = round % 13;
                let hits: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(chunks, |c| {
                    hits[c].fetch_add(1, Relaxed);
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
        pool.run(6, |c| {
            sum.fetch_add(c + 1, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 21);
    }
}
