//! The forward pass's threads: a rayon pool per model, and [`Disjoint`], the one type through
//! which a parallel phase's threads write disjoint parts of a buffer.
//!
//! A pool of `threads` threads is the calling thread plus `threads - 1` rayon threads. A
//! forward pass runs inside [`ThreadPool::install`]: the caller runs the pass and the rayon
//! threads follow it through all its phases ([`ThreadPool::run`],
//! [`ThreadPool::for_each_mut`]) for one rayon `spawn_broadcast` per pass (see `crew`).
//! Dispatching each of a pass's ~300 short phases as its own rayon fork/join was measured too
//! (docs/benchmarks.md, "Threads"): idle rayon threads fall asleep between phases and the batch engine's
//! passes lost up to 5% to waking them. Threads claim a phase's chunks from a shared counter,
//! so a thread the OS has descheduled delays the others by one chunk at most. Which thread
//! computes a chunk never changes what is computed: every output is produced by one thread
//! with one op sequence. With one thread there is no pool: everything runs on the caller.
//!
//! A panic inside a phase, on any thread, reaches `install`'s caller as
//! [`Error::Internal`]; the threads live on and the pool stays usable.
//!
//! After `fork()` the child has none of the parent's threads: a pool made before the fork
//! runs everything on the caller (the same results, since they never depend on the thread
//! count) and never signals, or joins, the workers it no longer has.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

use crate::error::{Error, Result};

mod crew;
mod erased_job;

use erased_job::ErasedJob;

pub struct ThreadPool {
    /// `None` with one thread. Never dropped in a forked child (see [`Drop`]).
    rayon: Option<ManuallyDrop<rayon::ThreadPool>>,
    /// [`fork_generation`] when the workers were started.
    generation: usize,
    /// Serialises forward passes (one crew at a time).
    passes: Mutex<()>,
    /// Tests only: counts `run` calls down; the one that takes it from 1 to 0 panics in its
    /// last chunk (0: never).
    #[cfg(test)]
    pub(crate) panic_countdown: AtomicUsize,
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
    /// A pool for `n_threads` threads in all, the caller included (`n_threads >= 1`): it
    /// starts `n_threads - 1` rayon threads.
    pub fn new(n_threads: usize) -> Result<ThreadPool> {
        let generation = fork_generation();
        let rayon = if n_threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n_threads - 1)
                .thread_name(|i| format!("reprolm-{}", i + 1))
                .build()
                .map_err(|e| Error::Internal(format!("cannot start {} worker threads: {e}", n_threads - 1)))?;
            Some(ManuallyDrop::new(pool))
        } else {
            None
        };
        Ok(ThreadPool {
            rayon,
            generation,
            passes: Mutex::new(()),
            #[cfg(test)]
            panic_countdown: AtomicUsize::new(0),
        })
    }

    pub fn n_threads(&self) -> usize {
        self.rayon.as_ref().map_or(1, |p| p.current_num_threads() + 1)
    }

    /// The pool, unless there is none or this process is a fork of the one that started it.
    fn live(&self) -> Option<&rayon::ThreadPool> {
        self.rayon.as_deref().filter(|_| FORKS.load(Relaxed) == self.generation)
    }

    /// Runs `op` on the calling thread with the pool's threads following its parallel phases
    /// ([`run`](Self::run), [`for_each_mut`](Self::for_each_mut)), and returns its result, or
    /// [`Error::Internal`] if it or any of its phases panicked.
    pub fn install<R>(&self, op: impl FnOnce() -> R) -> Result<R> {
        catch_unwind(AssertUnwindSafe(|| self.pass(op)))
            .map_err(|panic| Error::Internal(format!("a computation panicked: {}", panic_message(&*panic))))
    }

    /// `op`, with the pool's threads following it, unless they already are (a phase started
    /// from inside a phase runs on its thread alone).
    fn pass<R>(&self, op: impl FnOnce() -> R) -> R {
        match self.live() {
            Some(pool) if !crew::leads(self) && pool.current_thread_index().is_none() => crew::lead(pool, self, op),
            _ => op(),
        }
    }

    /// Calls `f(c)` for every chunk `c` in `0..n_chunks`, in parallel, and returns when all
    /// are done. Cheapest inside [`install`](Self::install), which starts the threads once
    /// for all the phases of a pass.
    pub fn run(&self, n_chunks: usize, f: impl Fn(usize) + Sync) {
        #[cfg(test)]
        let f = {
            let due = self.panic_countdown.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)) == Ok(1);
            move |c| {
                if due && c + 1 == n_chunks {
                    panic!("a fault injected in chunk {c}");
                }
                f(c)
            }
        };
        if n_chunks <= 1 || self.live().is_none() {
            (0..n_chunks).for_each(f);
        } else {
            self.pass(|| crew::phase(self, n_chunks, &f));
        }
    }

    /// Calls `f(i, &mut items[i])` for every item, in parallel (see [`run`](Self::run)).
    pub fn for_each_mut<T: Send>(&self, items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
        let n = items.len();
        let items = Disjoint::new(items);
        // SAFETY: chunk i alone takes item i.
        self.run(n, |i| f(i, unsafe { &mut items.slice(i..i + 1)[0] }));
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        if let Some(pool) = self.rayon.as_mut() {
            // In a forked child the workers are the parent's, and their shared state may
            // hold a lock forever: leave it alone.
            if FORKS.load(Relaxed) == self.generation {
                // SAFETY: dropped once, here, and never used again.
                unsafe { ManuallyDrop::drop(pool) };
            }
        }
    }
}

/// Calls `f(&mut items[i])` for every item, on the calling thread and on up to
/// `items.len() - 1` helpers from rayon's global pool, which claim items from a shared counter.
/// The caller never waits for a helper that has not started: it does the items no helper has
/// claimed itself, then waits only for items in progress. For a few irregular jobs that may
/// take less time than waking a sleeping thread (a grammar mask's parts); a panic in `f`, on
/// any thread, is resumed on the caller. Inside a pass (on a rayon thread, or leading a crew)
/// the cores are already busy with the pass's own parallel work: there it runs on the caller.
pub fn share_items<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    let in_a_pass = rayon::current_thread_index().is_some() || crew::leads_any();
    if items.len() <= 1 || in_a_pass || FORKS.load(Relaxed) != 0 {
        items.iter_mut().for_each(f);
        return;
    }
    let n = items.len();
    let shared = Disjoint::new(items);
    // SAFETY: item i is claimed once, so only one thread touches it.
    let job = |i: usize| f(unsafe { &mut shared.slice(i..i + 1)[0] });
    let board = std::sync::Arc::new(Board {
        // SAFETY: helpers run the job only while counted in `active` with the board open,
        // and the caller closes it and waits for `active` to be zero before it returns.
        job: unsafe { ErasedJob::new(&job) },
        n,
        next: AtomicUsize::new(0),
        closed: std::sync::atomic::AtomicBool::new(false),
        active: AtomicUsize::new(0),
        panicked: Mutex::new(None),
    });
    for _ in 1..n {
        let board = std::sync::Arc::clone(&board);
        rayon::spawn(move || {
            board.active.fetch_add(1, SeqCst);
            if !board.closed.load(SeqCst) {
                // The board is open and we are counted in `active`: the job is alive.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| claim_all(&board.next, board.n, board.job.get()))) {
                    *board.panicked.lock().unwrap_or_else(|e| e.into_inner()) = Some(panic_message(&*panic));
                }
            }
            board.active.fetch_sub(1, SeqCst);
        });
    }
    let mine = catch_unwind(AssertUnwindSafe(|| claim_all(&board.next, board.n, &job)));
    board.closed.store(true, SeqCst);
    crew::wait_until(|| board.active.load(SeqCst) == 0);
    if let Err(payload) = mine {
        std::panic::resume_unwind(payload);
    }
    let helper_panic = board.panicked.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(message) = helper_panic {
        panic!("{message}");
    }
}

/// [`share_items`]' state, shared with helpers that may start after it has returned (they
/// then find the board closed and leave without touching the job).
struct Board {
    job: ErasedJob,
    n: usize,
    next: AtomicUsize,
    closed: std::sync::atomic::AtomicBool,
    /// Helpers that have looked at `closed` and not yet left.
    active: AtomicUsize,
    panicked: Mutex<Option<String>>,
}

/// Claims indices `0..n` from `next` and runs `job` on each, until none are left (the
/// threads sharing `next` each run a disjoint share).
fn claim_all(next: &AtomicUsize, n: usize, job: &(dyn Fn(usize) + Sync + '_)) {
    loop {
        let i = next.fetch_add(1, AcqRel);
        if i >= n {
            return;
        }
        job(i);
    }
}

/// The message a panic was raised with.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|m| m.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// The `part`-th of `parts` contiguous, nearly equal pieces of `0..n`.
pub fn split(n: usize, part: usize, parts: usize) -> Range<usize> {
    (n * part / parts)..(n * (part + 1) / parts)
}

/// A buffer that the threads of one parallel phase write in disjoint parts: the one place
/// where they share a `*mut`. It borrows the buffer mutably for `'a`, so nothing else reads
/// or writes it meanwhile, and every access is bounds-checked against it.
///
/// SAFETY argument, for every `unsafe` use of it: the caller proves that no two threads
/// touch the same element while the phase runs (each output element belongs to exactly one
/// chunk of the phase), which together with the exclusive borrow makes each element's
/// writes and reads those of a single thread.
pub struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _buffer: PhantomData<&'a mut [T]>,
}

impl<T> Clone for Disjoint<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Disjoint<'_, T> {}

// SAFETY: a `Disjoint` only hands out element ranges through `unsafe` methods whose callers
// guarantee no two threads touch the same element (see the type's documentation); `T: Send`
// because the elements are written from other threads.
unsafe impl<T: Send> Send for Disjoint<'_, T> {}
// SAFETY: as for `Send`: shared between threads, it gives each only the elements its caller
// guarantees are that thread's alone.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub fn new(buffer: &'a mut [T]) -> Self {
        Disjoint { ptr: buffer.as_mut_ptr(), len: buffer.len(), _buffer: PhantomData }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements `range` of the buffer.
    ///
    /// # Safety
    /// No other thread may access any of them until the returned slice is dropped.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, range: Range<usize>) -> &'a mut [T] {
        assert!(range.start <= range.end && range.end <= self.len, "{range:?} is outside 0..{}", self.len);
        // SAFETY: `range` is within the `len` elements at `ptr` (asserted), which
        // `Disjoint::new` borrowed mutably for `'a`, and no other thread accesses them while
        // the slice lives (this function's precondition).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// A pointer to element `index`, for SIMD stores of the elements from `index` on.
    ///
    /// # Safety
    /// `index + n <= len()` for the `n` elements stored through it, and no other thread may
    /// access them during the phase.
    #[inline(always)]
    pub unsafe fn at(&self, index: usize) -> *mut T {
        debug_assert!(index <= self.len);
        // SAFETY: `index <= len` (this function's precondition), so the pointer stays within
        // the borrowed buffer or one past its end.
        unsafe { self.ptr.add(index) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once_per_call() {
        for n in [1, 2, 3, 7] {
            let pool = ThreadPool::new(n).unwrap();
            for round in 0..2000 {
                let chunks = round % 13;
                let hits: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
                let check = || {
                    pool.run(chunks, |c| {
                        hits[c].fetch_add(1, Relaxed);
                    })
                };
                if round % 2 == 0 {
                    check();
                } else {
                    pool.install(check).unwrap();
                }
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
            }
        }
    }

    #[test]
    fn every_item_is_visited_once() {
        let pool = ThreadPool::new(3).unwrap();
        let mut items = vec![0usize; 50];
        pool.for_each_mut(&mut items, |i, v| *v += i + 1);
        assert!(items.iter().enumerate().all(|(i, &v)| v == i + 1));
    }

    #[test]
    fn a_phase_inside_a_phase_runs_every_chunk_once() {
        let pool = ThreadPool::new(3).unwrap();
        let hits: Vec<AtomicUsize> = (0..24).map(|_| AtomicUsize::new(0)).collect();
        pool.install(|| {
            pool.run(4, |outer| {
                std::thread::sleep(std::time::Duration::from_millis(5)); // let the followers take some
                pool.run(6, |inner| _ = hits[outer * 6 + inner].fetch_add(1, Relaxed))
            })
        })
        .unwrap();
        assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
    }

    #[test]
    fn shared_items_are_each_done_once_whoever_claims_them() {
        for n in 0..6usize {
            for round in 0..300 {
                let mut items: Vec<(usize, usize)> = (0..n).map(|i| (i, 0)).collect();
                share_items(&mut items, |(i, hits)| {
                    if round % 3 == 0 && *i % 2 == 1 {
                        std::thread::sleep(std::time::Duration::from_micros(50)); // let helpers claim some
                    }
                    *hits += 1;
                });
                assert!(items.iter().all(|&(_, hits)| hits == 1), "n={n} round={round}");
            }
        }
    }

    #[test]
    fn shared_items_stay_on_the_caller_inside_a_pass() {
        let pool = ThreadPool::new(2).unwrap();
        let mut per_chunk = vec![Vec::new(); 4];
        pool.install(|| {
            pool.for_each_mut(&mut per_chunk, |_, threads| {
                let mut items = vec![None; 3];
                share_items(&mut items, |t| {
                    std::thread::sleep(std::time::Duration::from_millis(2)); // time for helpers to claim some
                    *t = Some(std::thread::current().id())
                });
                threads.extend(items.into_iter().map(|t| (t.unwrap(), std::thread::current().id())));
            })
        })
        .unwrap();
        assert!(per_chunk.iter().flatten().all(|(item, chunk)| item == chunk));
    }

    #[test]
    fn a_panic_in_a_shared_item_reaches_the_caller() {
        for bad in 0..3 {
            let mut items = [0usize, 1, 2];
            let result = catch_unwind(AssertUnwindSafe(|| {
                share_items(&mut items, |i| {
                    if *i == bad {
                        panic!("item {i} failed");
                    }
                })
            }));
            let message = panic_message(&*result.expect_err("the panic is resumed"));
            assert!(message.contains(&format!("item {bad} failed")), "{message}");
            let mut items = [1usize, 2, 3];
            share_items(&mut items, |i| *i *= 2);
            assert_eq!(items, [2, 4, 6]);
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
        let pool = ThreadPool::new(3).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let sum = AtomicUsize::new(0);
        pool.run(6, |c| {
            sum.fetch_add(c + 1, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 21);
    }

    #[test]
    fn a_panic_in_a_phase_is_an_internal_error_and_the_pool_stays_usable() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n).unwrap();
            for bad in 0..8 {
                let result = pool.install(|| {
                    pool.run(8, |c| {
                        if c == bad {
                            panic!("chunk {c} failed");
                        }
                    })
                });
                match result {
                    Err(Error::Internal(m)) => assert!(m.contains(&format!("chunk {bad} failed")), "{m}"),
                    other => panic!("expected an internal error, got {other:?}"),
                }
                let sum = AtomicUsize::new(0);
                pool.install(|| pool.run(8, |c| _ = sum.fetch_add(c, Relaxed))).unwrap();
                assert_eq!(sum.load(Relaxed), 28);
            }
        }
    }

    #[test]
    fn disjoint_slices_are_bounds_checked() {
        let mut buf = vec![0f32; 10];
        let shared = Disjoint::new(&mut buf);
        let pool = ThreadPool::new(2).unwrap();
        // SAFETY: chunk c alone takes elements 2c and 2c + 1.
        pool.run(5, |c| unsafe { shared.slice(2 * c..2 * c + 2).fill(c as f32) });
        assert_eq!(buf, [0., 0., 1., 1., 2., 2., 3., 3., 4., 4.]);
        let shared = Disjoint::new(&mut buf);
        // SAFETY: one thread (the range is out of bounds: the call panics).
        assert!(catch_unwind(AssertUnwindSafe(|| unsafe { shared.slice(8..11).len() })).is_err());
    }
}
