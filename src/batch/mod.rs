//! The batch engine: continuous batching of many generation requests on one model, with
//! results that do not depend on the batch.
//!
//! Callers [`BatchEngine::submit`] validated [`GenerationSpec`]s from any thread and read each one's
//! events from its [`RequestHandle`]. One engine thread runs the [scheduler](scheduler): between
//! forward passes it admits waiting requests (first come, first served) while the running
//! sequences and their KV caches fit the limits, drops finished and cancelled ones (freeing
//! their caches at once), and builds the next pass from one decode row per running sequence
//! plus chunks of the admitted prompts under a token budget. Each pass reads the weights once
//! for all its rows ([`Transformer::forward_batch`](crate::model::Transformer::forward_batch)), and each
//! sequence's [`SequenceDecoder`](crate::decode::SequenceDecoder) picks its next token from its
//! own logits row.
//!
//! **Batch invariance.** A row's logits have the same bits whatever else is in the pass (the
//! kernels give every row one op sequence, attention reads only the row's own cache), a
//! prompt's split into chunks does not change them (docs/theory.md, "The KV cache"), and a sequence's sampler draws
//! `uniform(seed, t)` from its own counter. So a request's tokens, log-probabilities and finish
//! reason are those of the same request run alone, on any thread count.
//!
//! **Speculative decoding** does not run here: a speculative request decodes alone on a
//! session of its own ([`crate::decode::speculative`]). Speculation spends spare compute per
//! pass to save passes, which pays for a sequence decoding alone; a full batch already shares
//! each weight read among its sequences, and rejected drafts would take rows from them.
//!
//! **Memory.** `kv_memory` is one pool of KV blocks of [`BLOCK_TOKENS`] positions for all
//! sequences ([`KvMemory`](crate::model::KvMemory)). Each sequence's cache is a block table
//! into it, given blocks as it grows rather than reserved for its whole length at admission.
//! A sequence is admitted when the blocks of its prompt fit with a block of room left for
//! every running sequence. When a running sequence cannot grow, the pool first takes back
//! blocks that only the prefix cache holds, then the most recently admitted sequence is
//! preempted: its blocks are released and it goes back to the front of the queue with its
//! decoder (the tokens generated so far and the sampler's state), and when it is admitted
//! again its prompt and generated tokens are recomputed (partly from the prefix cache) before
//! it continues. Recomputed rows have the bits of the first computation and the sampler draws
//! from its own counter, so a preempted request's results do not change; the client sees
//! only time. The oldest running sequence is never preempted, so the engine always makes
//! progress. A request that could never fit (prompt plus `max_tokens` beyond the context or
//! the pool's positions) is refused when submitted.
//!
//! **Prefix cache.** Full blocks of every sequence's keys and values (prompt and generated
//! text) are indexed by a [`PrefixCache`] bounded by `prefix_cache_bytes`; an admitted prompt
//! takes the longest chain of indexed blocks it starts with into its block table, shared
//! read-only with every other sequence that does, and computes only the rest (always at
//! least its last token, whose logits it needs). Attention reads a shared row's bytes just as
//! it reads a computed one's, so a request's results do not depend on what the cache held
//! (see [`prefix_cache`]).

mod block_pool;
mod handle;
pub mod prefix_cache;
mod scheduler;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

pub use handle::{Event, Poll, RequestHandle};
pub use prefix_cache::{PrefixCache, PrefixCacheStats, BLOCK_TOKENS};

use crate::decode::GenerationSpec;
use crate::loaded_model::LoadedModel;
use crate::error::{Error, Result};
use crate::model::KvDtype;
use block_pool::BlockPool;
use handle::Channel;

/// Limits of a [`BatchEngine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Sequences running at once (each adds one row to every decode pass).
    pub max_concurrent: usize,
    /// Requests waiting for admission; a submission beyond it fails with
    /// [`Error::QueueFull`]. `usize::MAX`: no limit.
    pub max_queue: usize,
    /// Rows (tokens) of one forward pass: one per running sequence plus prompt chunks.
    pub max_batch_tokens: usize,
    /// Bytes of the pool of KV blocks all sequences (and the prefix cache) take theirs from;
    /// at least one block of [`BLOCK_TOKENS`] positions.
    pub kv_memory: usize,
    /// The number type of the caches.
    pub kv_dtype: KvDtype,
    /// Bytes of the pool's blocks the prefix cache may index (less than a block: no prefix
    /// cache). Its blocks are in the pool; those no running sequence reads are taken back
    /// when the pool runs out of free blocks.
    pub prefix_cache_bytes: usize,
}

impl BatchOptions {
    /// The defaults for `engine`: 64 sequences, no queue limit, 512 rows per pass, f32
    /// caches taking at most a quarter of the memory available now, and a prefix cache that
    /// may index all of it ([`BatchOptions::default_prefix_cache_bytes`]).
    pub fn defaults_for(loaded: &LoadedModel) -> BatchOptions {
        let quarter = crate::loaded_model::available_memory().map_or(1 << 30, |m| m / 4);
        let kv_memory = quarter.max(BLOCK_TOKENS * loaded.kv_bytes_per_position(KvDtype::F32));
        BatchOptions {
            max_concurrent: 64,
            max_queue: usize::MAX,
            max_batch_tokens: 512,
            kv_memory,
            kv_dtype: KvDtype::F32,
            prefix_cache_bytes: Self::default_prefix_cache_bytes(kv_memory),
        }
    }

    /// The default bound of the prefix cache for a given `kv_memory`: all of it (what the
    /// cache keeps costs the running sequences nothing; the pool takes it back as needed).
    pub fn default_prefix_cache_bytes(kv_memory: usize) -> usize {
        kv_memory
    }

    pub fn validate(&self) -> Result<()> {
        if self.max_concurrent == 0 {
            return Err(Error::invalid_argument("max_concurrent", "must be at least 1"));
        }
        if self.max_batch_tokens < self.max_concurrent {
            return Err(Error::invalid_argument(
                "max_batch_tokens",
                format!("must be at least max_concurrent ({}), got {}", self.max_concurrent, self.max_batch_tokens),
            ));
        }
        if self.kv_memory == 0 {
            return Err(Error::invalid_argument("kv_memory", "must be at least 1 byte"));
        }
        Ok(())
    }
}

/// What the engine is doing, as of its last scheduling step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Sequences running (admitted, not finished).
    pub running: usize,
    /// Bytes of the pool's blocks the running sequences hold (a shared block once).
    pub kv_bytes: usize,
    /// Blocks of [`BLOCK_TOKENS`] positions the running sequences hold (a shared block once).
    pub kv_blocks_used: usize,
    /// Blocks of the pool no running sequence holds: free, or held only by the prefix cache
    /// (which gives them back when the pool needs them).
    pub kv_blocks_free: usize,
    /// Running sequences preempted so far to let older ones grow (each was requeued and its
    /// context recomputed when it was admitted again).
    pub preemptions: u64,
    /// Forward passes run so far.
    pub passes: u64,
    /// Prompt tokens computed so far.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// The prefix cache's counters (all zero without one).
    pub prefix_cache: PrefixCacheStats,
}

/// A submitted request on its way to the engine thread.
struct Submission {
    request: GenerationSpec,
    channel: Arc<Channel>,
}

#[derive(Default)]
struct Inbox {
    /// Submitted, not yet seen by the engine thread.
    submitted: VecDeque<Submission>,
    /// As published by the engine thread.
    stats: EngineStats,
    /// Ids of watched requests with new events, for [`BatchEngine::wait_ready`].
    ready: Vec<u64>,
    shutdown: bool,
}

/// What the engine thread sleeps on, and what wakes it: submissions, cancellations, shutdown.
pub(crate) struct Wakeup {
    inbox: Mutex<Inbox>,
    /// The engine thread waits here for work.
    work: Condvar,
    /// [`BatchEngine::wait_ready`] waits here for events.
    events: Condvar,
}

impl Wakeup {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        let _inbox = self.lock();
        self.work.notify_all();
    }

    fn event_ready(&self, id: u64) {
        self.lock().ready.push(id);
        self.events.notify_all();
    }
}

/// Continuous batching over one model (see the [module docs](self)). Dropping it stops the
/// engine thread; requests still running end with [`Error::EngineStopped`].
pub struct BatchEngine {
    loaded: Arc<LoadedModel>,
    options: BatchOptions,
    wakeup: Arc<Wakeup>,
    next_id: AtomicU64,
    thread: Option<JoinHandle<()>>,
    /// Blocks of [`BLOCK_TOKENS`] positions in the engine's pool.
    pool_blocks: usize,
    /// [`fork_generation`](crate::threads::fork_generation) when the thread was started.
    generation: usize,
}

impl BatchEngine {
    /// Starts the engine thread.
    pub fn new(loaded: Arc<LoadedModel>, options: BatchOptions) -> Result<BatchEngine> {
        options.validate()?;
        let block_bytes = BLOCK_TOKENS * loaded.kv_bytes_per_position(options.kv_dtype);
        if options.kv_memory < block_bytes {
            return Err(Error::invalid_argument(
                "kv_memory",
                format!("must hold at least one block of {BLOCK_TOKENS} positions ({block_bytes} bytes), got {}", options.kv_memory),
            ));
        }
        let pool = BlockPool::new(loaded.config(), options.kv_dtype, options.kv_memory / block_bytes)?;
        // The prefix cache's keys name the model file.
        let fingerprint = loaded.fingerprint()?;
        let pool_blocks = pool.n_blocks();
        let inbox = Inbox { stats: EngineStats { kv_blocks_free: pool_blocks, ..EngineStats::default() }, ..Inbox::default() };
        let wakeup = Arc::new(Wakeup { inbox: Mutex::new(inbox), work: Condvar::new(), events: Condvar::new() });
        let thread = {
            let (loaded, wakeup) = (Arc::clone(&loaded), Arc::clone(&wakeup));
            std::thread::Builder::new()
                .name("reprolm-batch".into())
                .spawn(move || scheduler::run(&loaded, fingerprint, options, pool, &wakeup))
                .map_err(|e| Error::EngineStopped(format!("cannot start the engine thread: {e}")))?
        };
        let generation = crate::threads::fork_generation();
        Ok(BatchEngine { loaded, options, wakeup, next_id: AtomicU64::new(1), thread: Some(thread), pool_blocks, generation })
    }

    /// Whether this process is a fork of the one that started the engine thread (which the
    /// child does not have): a stale engine runs nothing; make a new one.
    pub fn is_stale(&self) -> bool {
        crate::threads::fork_generation() != self.generation
    }

    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    /// Positions the pool of `kv_memory` holds: its whole blocks of [`BLOCK_TOKENS`].
    pub fn pool_positions(&self) -> usize {
        self.pool_blocks * BLOCK_TOKENS
    }

    pub fn loaded(&self) -> &Arc<LoadedModel> {
        &self.loaded
    }

    /// Queues `request` and returns its handle.
    ///
    /// # Errors
    /// Checked here, so a bad request fails alone and at once: [`Error::InvalidArgument`] for a
    /// request built for another vocabulary, [`Error::ContextOverflow`] when the prompt plus
    /// `max_tokens` exceed the model's context or the whole `kv_memory`, and
    /// [`Error::QueueFull`] when `max_queue` requests are already waiting.
    pub fn submit(&self, request: GenerationSpec) -> Result<RequestHandle> {
        let vocab_size = self.loaded.config().vocab_size;
        if request.sampler.vocab_size() != vocab_size {
            return Err(Error::invalid_argument(
                "sampler",
                format!("built for {} tokens but the model has {vocab_size}", request.sampler.vocab_size()),
            ));
        }
        let needed = request.positions_needed();
        let allowed = self.loaded.config().context_length.min(self.pool_positions());
        if needed > allowed {
            return Err(Error::ContextOverflow { requested: needed, allowed });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let channel = Channel::new(id, Arc::downgrade(&self.wakeup));
        {
            let mut inbox = self.wakeup.lock();
            if inbox.shutdown {
                return Err(Error::EngineStopped("the engine is shutting down".into()));
            }
            let waiting = inbox.stats.waiting + inbox.submitted.len();
            if waiting >= self.options.max_queue {
                return Err(Error::QueueFull { waiting });
            }
            inbox.submitted.push_back(Submission { request, channel: Arc::clone(&channel) });
        }
        self.wakeup.work.notify_all();
        Ok(RequestHandle::new(channel))
    }

    /// What the engine is doing (as of its last scheduling step).
    pub fn stats(&self) -> EngineStats {
        self.wakeup.lock().stats
    }

    /// Ids of watched requests ([`RequestHandle::watch`]) that produced events since the last
    /// call, waiting up to `timeout` for one (for an async dispatcher: one thread waits here
    /// and wakes the tasks whose requests have events).
    pub fn wait_ready(&self, timeout: std::time::Duration) -> Vec<u64> {
        let mut inbox = self.wakeup.lock();
        if inbox.ready.is_empty() && !inbox.shutdown {
            inbox = self.wakeup.events.wait_timeout(inbox, timeout).unwrap_or_else(|e| e.into_inner()).0;
        }
        std::mem::take(&mut inbox.ready)
    }
}

impl Drop for BatchEngine {
    fn drop(&mut self) {
        if self.is_stale() {
            // The engine thread is the parent's, and it may have held the inbox lock at the
            // fork: touch nothing, join nothing.
            std::mem::forget(self.thread.take());
            return;
        }
        {
            let mut inbox = self.wakeup.lock();
            inbox.shutdown = true;
            self.wakeup.work.notify_all();
            self.wakeup.events.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
