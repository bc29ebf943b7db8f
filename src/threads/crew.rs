//! One pass's phases, stepped through together by the calling thread (the leader) and every
//! thread of a rayon pool (the followers, started by one `spawn_broadcast` per pass).
//!
//! The leader publishes each phase (a job and its number of chunks) under a new epoch; every
//! thread, the leader included, claims chunks from a shared counter until none are left; the
//! leader then closes the epoch and waits for followers still inside it. Between phases the
//! followers spin, then yield: a pass's phases are microseconds apart, too close for a
//! sleeping thread to wake in time. When the pass ends they return to rayon, whose idle
//! threads sleep.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;

use super::erased_job::ErasedJob;
use super::{claim_all, panic_message, ThreadPool};

/// Spin-loop iterations a waiting thread spends before it starts yielding its core.
const SPIN_ITERS: u32 = 20_000;

struct Crew {
    /// The pool whose threads these are.
    pool: *const ThreadPool,
    /// The current phase's job; written by the leader only while no follower is inside a
    /// phase and the previous phase is closed.
    job: UnsafeCell<Option<ErasedJob>>,
    n_chunks: AtomicUsize,
    next_chunk: AtomicUsize,
    /// Incremented to publish a phase.
    epoch: AtomicU64,
    /// The last epoch whose phase is closed to late-comers.
    closed: AtomicU64,
    /// Followers currently inside a phase.
    active: AtomicUsize,
    /// A follower's chunk panicked: its message.
    panicked: Mutex<Option<String>>,
    /// The pass is over: followers return.
    done: AtomicBool,
    /// The leader is inside a phase (a phase started from within one runs on the leader alone).
    in_phase: AtomicBool,
}

// SAFETY: `job` is written by the leader before an epoch is published and only while
// `active` is zero with the previous epoch closed; followers read it only after entering
// (`active` incremented) an epoch that is not closed. See `Crew::phase` and `Crew::follow`.
unsafe impl Sync for Crew {}

thread_local! {
    /// The crew this thread leads, while it runs a pass.
    static LEADING: Cell<*const Crew> = const { Cell::new(std::ptr::null()) };
}

/// `f` of the crew this thread leads for `pool`, if it leads one.
fn with_led<R>(pool: &ThreadPool, f: impl FnOnce(Option<&Crew>) -> R) -> R {
    let crew = LEADING.with(|l| l.get());
    // SAFETY: LEADING points to a live crew while its leader runs the pass (`lead`), and
    // `f` runs on the leader, inside the pass.
    f(unsafe { crew.as_ref() }.filter(|crew| std::ptr::eq(crew.pool, pool)))
}

/// Whether this thread leads a pass on any pool now.
pub(super) fn leads_any() -> bool {
    LEADING.with(|l| !l.get().is_null())
}

/// Whether this thread runs a pass on `pool` now.
pub(super) fn leads(pool: &ThreadPool) -> bool {
    with_led(pool, |crew| crew.is_some())
}

/// Runs `op` on this thread while every thread of `pool` follows its phases.
pub(super) fn lead<R>(pool: &rayon::ThreadPool, owner: &ThreadPool, op: impl FnOnce() -> R) -> R {
    let _one_pass_at_a_time = owner.passes.lock().unwrap_or_else(|e| e.into_inner());
    let crew = Crew {
        pool: owner,
        job: UnsafeCell::new(None),
        n_chunks: AtomicUsize::new(0),
        next_chunk: AtomicUsize::new(0),
        epoch: AtomicU64::new(0),
        closed: AtomicU64::new(0),
        active: AtomicUsize::new(0),
        panicked: Mutex::new(None),
        done: AtomicBool::new(false),
        in_phase: AtomicBool::new(false),
    };
    /// Ends the pass however the leader leaves it, so that followers never wait on.
    struct Finish<'a>(&'a Crew, *const Crew);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            LEADING.with(|l| l.set(self.1));
            self.0.done.store(true, Release);
        }
    }
    // The scope returns when the followers have (they stop once `done` is set).
    pool.in_place_scope(|scope| {
        scope.spawn_broadcast(|_, _| crew.follow());
        let _finish = Finish(&crew, LEADING.with(|l| l.replace(&crew)));
        op()
    })
}

/// Runs a phase on the crew this thread leads for `pool`, or on this thread alone if it
/// leads none (a follower inside a phase).
pub(super) fn phase(pool: &ThreadPool, n_chunks: usize, f: &(dyn Fn(usize) + Sync)) {
    with_led(pool, |crew| match crew {
        Some(crew) => crew.phase(n_chunks, f),
        None => (0..n_chunks).for_each(f),
    })
}

impl Crew {
    /// Claims and runs chunks of the current phase until none are left.
    fn work(&self, job: &(dyn Fn(usize) + Sync + '_)) {
        claim_all(&self.next_chunk, self.n_chunks.load(Acquire), job);
    }

    /// The leader's side of one phase.
    fn phase(&self, n_chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.in_phase.swap(true, Relaxed) {
            // Nested, on the leader: the followers may still be inside the outer phase's job.
            (0..n_chunks).for_each(f);
            return;
        }
        // SAFETY: followers run the job only inside an open epoch, and this function closes
        // the epoch and waits for them before it returns. No follower is inside a phase and
        // the previous epoch is closed, so none reads `job` while it is written.
        unsafe { *self.job.get() = Some(ErasedJob::new(f)) };
        self.n_chunks.store(n_chunks, SeqCst);
        self.next_chunk.store(0, SeqCst);
        let epoch = self.epoch.fetch_add(1, SeqCst) + 1;
        let mine = catch_unwind(AssertUnwindSafe(|| self.work(f)));
        // Every chunk is claimed; close the epoch so no late follower enters, then wait
        // for those inside to finish their last chunk.
        self.closed.store(epoch, SeqCst);
        wait_until(|| self.active.load(SeqCst) == 0);
        // SAFETY: the epoch is closed and no follower is inside it, so none reads `job`.
        unsafe { *self.job.get() = None };
        self.in_phase.store(false, Relaxed);
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if let Some(message) = self.panicked.lock().unwrap_or_else(|e| e.into_inner()).take() {
            panic!("{message}");
        }
    }

    /// A follower's side of the pass: every phase, until the leader is done.
    fn follow(&self) {
        let mut seen = 0u64;
        loop {
            wait_until(|| self.epoch.load(Acquire) != seen || self.done.load(Acquire));
            if self.done.load(Acquire) {
                return;
            }
            seen = self.epoch.load(SeqCst);
            self.active.fetch_add(1, SeqCst);
            // Enter only if the leader has not closed this epoch (it may even have moved
            // on to a later one, which this follower sees on its next turn).
            if self.closed.load(SeqCst) < seen && self.epoch.load(SeqCst) == seen {
                // SAFETY: the epoch is open and we are counted in `active`, so the leader is
                // inside `phase`, past writing `job`, and does not write it again before we
                // leave.
                let job = unsafe { (*self.job.get()).expect("a job is published with every epoch") };
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.work(job.get()))) {
                    *self.panicked.lock().unwrap_or_else(|e| e.into_inner()) = Some(panic_message(&*panic));
                }
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }
}

/// Spins, then yields, until `ready()`.
pub(super) fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        if spins < SPIN_ITERS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
