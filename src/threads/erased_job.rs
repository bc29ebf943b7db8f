//! [`ErasedJob`]: a borrowed job handed to threads that the borrow checker cannot see end.

/// A borrowed `Fn(usize) + Sync` job whose borrow's lifetime is erased, so that threads not
/// scoped to the borrow (a crew's followers, [`super::share_items`]' helpers) can hold it.
///
/// Erasing is the one unsafe step ([`ErasedJob::new`]); whoever erases a job waits for every
/// thread that may still use it before the borrow ends, which makes running it
/// ([`ErasedJob::get`]) safe.
#[derive(Clone, Copy)]
pub(super) struct ErasedJob(*const (dyn Fn(usize) + Sync));

// SAFETY: the job is `Sync`, so other threads may call it through a shared reference; how
// long the pointer stays valid is the contract of `ErasedJob::new`.
unsafe impl Send for ErasedJob {}
// SAFETY: as for `Send`: `get` hands out only shared references to a `Sync` job.
unsafe impl Sync for ErasedJob {}

impl ErasedJob {
    /// Erases the lifetime of the borrow of `job`.
    ///
    /// # Safety
    /// Every call of [`ErasedJob::get`] on the returned value or a copy of it, and every use
    /// of the reference it returns, must end before the borrow of `job` does: the thread that
    /// erases a job waits for every thread that may still run it before it lets the borrow go.
    pub(super) unsafe fn new(job: &(dyn Fn(usize) + Sync + '_)) -> ErasedJob {
        let job: *const (dyn Fn(usize) + Sync + '_) = job;
        // SAFETY: the two pointer types differ only in the trait object's lifetime bound, so
        // they have the same layout; the caller keeps the pointee alive while it is used.
        ErasedJob(unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(job) })
    }

    /// The job.
    pub(super) fn get(&self) -> &(dyn Fn(usize) + Sync) {
        // SAFETY: by the contract of `new`, the borrowed job is alive while any copy of this
        // value is used.
        unsafe { &*self.0 }
    }
}
